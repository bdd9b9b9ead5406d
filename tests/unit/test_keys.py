"""The keys on the machine running twinbolt, and keeping them out of every log tail shown."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from pyinfra import state
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra_fakes import FakeHost, describe, on
from test_serving import RANK0

from operations.plumbing import keys
from operations.plumbing.facts import shell_script
from operations.services import ARGV_REDACTED, ServiceProcess, redacted
from operations.serving import sglang as serving

KEY = "sk-" + "0123456789abcdef" * 3


@pytest.fixture(autouse=True)
def fresh_reads():
    """Each test reads its files afresh: a run reads a key once."""
    keys.local_key.cache_clear()
    yield
    keys.local_key.cache_clear()


@pytest.mark.parametrize(("content", "mode", "problem"), [
    (KEY + "\n", 0o600, None),
    (f"  {KEY}\n\n", 0o400, None),
    (KEY + "\n", 0o640, "must be a regular file of mode 0600, not -rw-r-----"),
    (KEY + "\n", 0o604, "must be a regular file of mode 0600, not -rw----r--"),
    ("\n", 0o600, "holds no key"),
    ("sk-short\n", 0o600, "holds no key"),
    ("sk-two words here, which no header takes\n", 0o600, "holds no key"),
    ('sk-"quoted0123456789"\n', 0o600, "holds no key"),
    (None, None, "cannot be read (No such file or directory)"),
], ids=["key", "read-only", "group-readable", "world-readable", "blank", "short", "words",
        "quotes", "missing"])
def test_a_local_key_file_is_judged_as_ssh_judges_a_private_key(
        tmp_path: Path, content: str | None, mode: int | None, problem: str | None) -> None:
    path = tmp_path / "sglang_api_key"
    if content is not None:
        path.write_text(content)
        path.chmod(mode)
    if problem is None:
        assert keys.local_key(path) == KEY
        assert keys.bearer(str(path)) == {"Authorization": f"Bearer {KEY}"}
        return
    with pytest.raises(keys.KeyFileProblem) as refused:
        keys.local_key(path)
    # The refusal names the file, what is wrong, and the command that makes one.
    assert str(refused.value).startswith(f"{path}: {problem}")
    assert f"install -D -m 600 /dev/null {path}" in str(refused.value)


def test_a_directory_is_no_key_file(tmp_path: Path) -> None:
    with pytest.raises(keys.KeyFileProblem, match="must be a regular file"):
        keys.local_key(tmp_path)


@pytest.mark.parametrize(("line", "shown"), [
    ("server_args=ServerArgs(model_path='/m', api_key='sk-0123456789abcdef', "
     "admin_api_key='sk-abcdef0123456789', tp_size=2)",
     "server_args=ServerArgs(model_path='/m', api_key='<redacted>', "
     "admin_api_key='<redacted>', tp_size=2)"),
    ("exec sglang_router --api-key sk-0123456789abcdef --port 30080",
     "exec sglang_router --api-key <redacted> --port 30080"),
    ('{"api_key": "sk-0123456789abcdef", "url": "http://x"}',
     '{"api_key": "<redacted>", "url": "http://x"}'),
    ("api-key: sk-0123456789abcdef", "api-key: <redacted>"),
    ("server_args=ServerArgs(api_key=None, port=30000)",
     "server_args=ServerArgs(api_key=None, port=30000)"),
    ("Load weight end. mem usage=12.00 GB", "Load weight end. mem usage=12.00 GB"),
], ids=["sglang-args", "argv", "json", "yaml", "no-key", "other"])
def test_a_log_tail_leaves_the_host_with_its_keys_replaced(line: str, shown: str) -> None:
    """As SGLang prints its arguments at start (keys in clear), and other forms of a key."""
    command = redacted(shell_script('printf "%s\\n" "$1"', line)).get_raw_value()
    result = subprocess.run(command, shell=True, capture_output=True, text=True, check=True)
    assert result.stdout == shown + "\n"


def keys_host(remote_text: str | None, user: str = "sglang") -> FakeHost:
    """A workstation whose keys' file holds ``remote_text`` (``None``: no file yet)."""
    def file(path: str) -> dict | None:
        if remote_text is None:
            return None
        return {"size": len(remote_text), "mode": 600, "user": user, "group": user}

    return FakeHost({
        File: file,
        Directory: lambda path: {"mode": 755} if path == "/etc/twinbolt" else None,
        Sha1File: lambda path: remote_text and hashlib.sha1(remote_text.encode()).hexdigest(),
    })


@pytest.mark.parametrize(("remote", "changed"), [
    (None, True), ("api-key: sk-old0123456789abcdef\nadmin-api-key: sk-old\n", True),
    ("current", False)], ids=["missing", "another-key", "current"])
def test_the_servers_keys_file_is_put_by_sftp_and_says_whether_it_changed(
        remote: str | None, changed: bool) -> None:
    """A changed file restarts the server (serving.replica and tp_rank pass it on)."""
    sglang = RANK0
    wanted = sglang.keys_config()
    assert wanted == (f"api-key: {keys.local_key(sglang.api_key_file)}\n"
                      f"admin-api-key: {keys.local_key(sglang.admin_api_key_file)}\n")
    host = keys_host(wanted if remote == "current" else remote)
    with on(host):
        written = serving.keys_written(sglang)
        done = []
        try:
            while True:
                done.append(describe(next(written)))
        except StopIteration as result:
            returned = result.value
    assert returned is changed
    assert ("upload /etc/twinbolt/sglang_keys.yaml" in done) is changed
    # Only the path is ever on a command line, never the key.
    assert not any("sk-" in command for command in done)


def test_a_key_never_reaches_pyinfras_diff(caplog: pytest.LogCaptureFixture) -> None:
    """``pyinfra --diff`` prints a put file's lines; a key's file is put with it off."""
    with on(keys_host(None)), caplog.at_level("DEBUG"):
        state.config.DIFF = True
        done = [describe(command) for command in serving.keys_written(RANK0)]
        assert state.config.DIFF is True  # the operator's --diff holds for every other file
    assert "upload /etc/twinbolt/sglang_keys.yaml" in done
    assert "Will create" not in caplog.text
    assert keys.local_key(RANK0.api_key_file) not in caplog.text


def test_a_command_line_read_from_proc_leaves_the_host_without_its_keys() -> None:
    """sglang-router holds its keys on its command line until it renames itself."""
    argv = ["/opt/r/bin/python", "-m", "sglang_router.launch_router",
            "--control-plane-api-keys", "twinbolt:twinbolt:admin:sk-0123456789",
            "--api-key", "sk-abcdef0123", "--admin-api-key=sk-zyx987654", "--port", "30080",
            "--kv-cache-dtype", "auto"]
    read = subprocess.run(["awk", ARGV_REDACTED], input="\n".join(argv) + "\n",
                          capture_output=True, text=True, check=True)
    assert ServiceProcess().process(read.stdout.splitlines())["argv"] == [
        "/opt/r/bin/python", "-m", "sglang_router.launch_router",
        "--control-plane-api-keys", "<redacted>", "--api-key", "<redacted>",
        "--admin-api-key=<redacted>", "--port", "30080", "--kv-cache-dtype", "auto"]
