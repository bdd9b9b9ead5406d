"""The harness's remote reads: one script per host, under sudo where the inventory says so."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import FactBase

from harness.hosts import remote
from operations.site.hosts import InventoryEntry, ssh_config
from operations.thunderbolt.link import RouteInterface


class Tricky(FactBase):
    """A fact whose command holds every kind of quote, a ``$`` and a newline."""

    def command(self) -> str:
        return "x='it'\"'\"'s'; y=\"$x \\\"q\\\" \\$HOME\"\necho \"$y\"; echo 'a  b'"

    def process(self, output: list[str]) -> list[str]:
        return output


class UnderSudo(FactBase):
    """Whether the script ran through the test's ``sudo``."""

    def command(self) -> str:
        return 'echo "${TWINBOLT_TEST_SUDO:-no}"'

    def process(self, output: list[str]) -> str:
        return output[0]


QUERIES = [remote.Query("tricky", Tricky()), remote.Query("sudo", UnderSudo())]
EXPECTED_TRICKY = ["it's \"q\" $HOME", "a  b"]


def test_under_sudo_the_remote_shell_hands_sudo_the_script_whole() -> None:
    script = remote.script(QUERIES)
    assert remote.remote_command(script) == script
    # What the remote login shell's word splitting gives sudo's argv.
    assert shlex.split(remote.remote_command(script, sudo=True)) == [
        "sudo", "-H", "-n", "sh", "-c", script]


@pytest.fixture
def fake_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """
    ``ssh`` and ``sudo`` first on ``PATH``: ``ssh -F CONFIG -- HOST COMMAND`` has this
    machine's shell run COMMAND, as sshd has the login shell run it; ``sudo``
    requires ``-n`` (it must never wait for a password) and marks what it runs.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        # Refuses a host not behind "--": a name starting with "-" would be an option.
        "ssh": ('while [ $# -gt 0 ] && [ "$1" != -- ]; do shift; done\n'
                '[ "$1" = -- ] || { echo "no -- before the host" >&2; exit 255; }\n'
                'shift 2; exec sh -c "$*"'),
        "sudo": ('case " $* " in *" -n "*) ;; *) echo "sudo would prompt" >&2; exit 1;; esac\n'
                 'while [ "${1#-}" != "$1" ]; do shift; done\n'
                 'TWINBOLT_TEST_SUDO=yes exec "$@"'),
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("TWINBOLT_TEST_SUDO", raising=False)
    return tmp_path / "ssh_config"


def test_each_host_is_read_as_its_inventory_data_says(fake_hosts: Path) -> None:
    root = InventoryEntry("wsb", ("workstations",), {"ssh_user": "root"})
    operator = InventoryEntry("wsa", ("workstations",), {"ssh_user": "ops", "sudo": True})
    readings = asyncio.run(remote.read_all({root: QUERIES, operator: QUERIES}, fake_hosts))
    assert {host: reading.error for host, reading in readings.items()} == {
        "wsa": None, "wsb": None}
    assert readings["wsa"].values == {"tricky": EXPECTED_TRICKY, "sudo": "yes"}
    assert readings["wsb"].values == {"tricky": EXPECTED_TRICKY, "sudo": "no"}


def test_a_pyinfra_fact_reads_the_same_under_sudo(fake_hosts: Path) -> None:
    queries = [remote.Query("route", RouteInterface(), {"address": "127.0.0.1"})]
    plain = asyncio.run(remote.read("wsb", queries, fake_hosts))
    under_sudo = asyncio.run(remote.read("wsa", queries, fake_hosts, sudo=True))
    assert plain.values == under_sudo.values == {"route": "lo"}


def test_the_harness_ssh_config_is_read_by_openssh_as_written(tmp_path: Path) -> None:
    # ssh -G parses the config the harness writes, as a connection would, without connecting.
    # (ssh -G shows IdentityFile before token expansion: no % here.)
    key = tmp_path / "my keys" / "id_ed25519"
    entry = InventoryEntry("ws0", ("workstations",), {
        "ssh_hostname": "10.66.0.11", "ssh_user": "ops.user", "ssh_port": 2222,
        "ssh_key": str(key), "ssh_known_hosts_file": str(tmp_path / "known hosts"),
    })
    config = tmp_path / "ssh_config"
    config.write_text(ssh_config([entry]))
    result = subprocess.run(["ssh", "-G", "-F", str(config), "--", "ws0"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    options = {}
    for line in result.stdout.splitlines():
        keyword, _, value = line.partition(" ")
        options.setdefault(keyword, value)
    assert options["hostname"] == "10.66.0.11" and options["user"] == "ops.user"
    assert options["port"] == "2222" and options["identityfile"] == str(key)
    assert options["userknownhostsfile"] == str(tmp_path / "known hosts")


@pytest.mark.parametrize("data", [{"ssh_hostname": "gw\n    ProxyCommand id"},
                                  {"ssh_hostname": "gw", "ssh_user": "root\nProxyCommand id"},
                                  {"ssh_hostname": "gw", "ssh_key": '/keys/"id'}])
def test_an_ssh_config_value_it_cannot_carry_is_refused(data: dict) -> None:
    with pytest.raises(ValueError, match="OpenSSH config"):
        ssh_config([InventoryEntry("gw0", ("gateway",), data)])


class Unended(FactBase):
    """A fact whose output does not end its last line, as curl's ``-w "%{http_code}"``."""

    def command(self) -> str:
        return "printf '{\"workers\": []}\\n200'"

    def process(self, output: list[str]) -> list[str]:
        return output


def test_a_section_whose_output_does_not_end_its_line_is_read_whole() -> None:
    queries = [remote.Query("unended", Unended()), remote.Query("tricky", Tricky())]
    output = subprocess.run(["sh", "-c", remote.script(queries)], capture_output=True,
                            text=True, timeout=30).stdout
    assert remote.parse(output, queries) == {"unended": ['{"workers": []}', "200"],
                                             "tricky": EXPECTED_TRICKY}
