"""
Keys that live in mode-0600 files on the host that uses them, and never leave it.

A key is generated on its host (``sk-`` and 48 hex digits from ``/dev/urandom``)
unless the site put one there, is owned by the account of the service that
reads it, and is handed to curl on its standard input, so that it appears in
no command line, no process list and no pyinfra output, and neither pyinfra
nor pytest ever holds it. The gateway's proxy keeps its master key so; the
router its control key.

The SGLang servers' keys are the exception, because the machine running
twinbolt asks the servers itself (the acceptance probes, the harness's
windows): they live in mode-0600 files there (``[serving] api_key_file`` and
``admin_api_key_file``), from which twinbolt puts them on the hosts that serve
or call SGLang, by SFTP (never on a command line), each readable by the account
that uses it alone.
"""

from __future__ import annotations

import functools
import io
import re
import stat
from collections.abc import Generator, Iterator
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.facts.files import File
from pyinfra.operations import files

from operations.plumbing.facts import EmptyMeansSomething, shell_script


def generated_key_command(path: str) -> StringCommand:
    """Generate a key into ``path`` on the host itself: it never crosses the wire."""
    script = (
        '(umask 022; mkdir -p "$(dirname "$1")") && (umask 077; '
        'printf "sk-%s\\n" "$(od -An -tx1 -N24 /dev/urandom | tr -d " \\n")" > "$1.new") && '
        'mv "$1.new" "$1"'
    )
    return shell_script(script, path)


def keyed_curl(script: str) -> str:
    """
    A shell script that has ``$1`` name a key file and defines ``ask
    CURL_ARGS…``: curl with the key's ``Authorization`` header given on its stdin,
    so it appears in no command line.
    """
    return (
        'key=$(cat "$1" 2>/dev/null) || { echo "keyfile-unreadable $1"; exit 0; }; '
        "ask() { printf 'Authorization: Bearer %s\\n' \"$key\" | curl -H @- \"$@\"; }; "
        + script
    )


class HoldsKey(EmptyMeansSomething):
    """
    Whether the file at ``path`` holds a key: anything but blanks. A file that
    holds only a newline is no key, and a service would start with an empty
    one. Only ``yes`` is printed, never the content.

    .. code:: python

        True
    """

    def command(self, path: str) -> StringCommand:
        return shell_script('grep -q "[^[:space:]]" "$1" 2>/dev/null && echo yes', path)

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"


def key_present(path: str, user: str) -> Iterator[PyinfraCommand]:
    """
    A key in ``path``: the site's, or generated if the file is missing or blank
    (whitespace only), owned by ``user`` and readable by it alone.
    """
    key = host.get_fact(File, path=path)
    if not key or not key["size"] or not host.get_fact(HoldsKey, path=path):
        yield generated_key_command(path)
    if not key or key["user"] != user or key["mode"] != 600:
        yield from files.file._inner(path=path, user=user, mode="600")


# A key as an Authorization header, a curl config line and a YAML scalar all take
# it unquoted: RFC 6750's token68 characters, at least 16 of them.
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,}")
# How a site makes one of the local key files (docs/site.md): what the lab does too.
NEW_KEY_COMMAND = ("install -D -m 600 /dev/null {path} && "
                   "printf 'sk-%s\\n' \"$(openssl rand -hex 24)\" > {path}")


class KeyFileProblem(PyinfraError):
    """A local key file is missing, unsafe or holds no key; nothing was changed."""


@functools.cache
def local_key(path: Path | str) -> str:
    """
    The key in ``path`` on the machine running twinbolt: there, a regular file
    readable by its owner alone (as ssh asks of a private key), one key in it.
    (Host data holds the path as a string.)
    """
    path = Path(path)

    def refuse(problem: str) -> KeyFileProblem:
        return KeyFileProblem(f"{path}: {problem}; make one with: "
                              + NEW_KEY_COMMAND.format(path=path))

    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode) or status.st_mode & 0o077:
            raise refuse("must be a regular file of mode 0600, not "
                         + stat.filemode(status.st_mode))
        key = path.read_text().strip()
    except OSError as error:
        raise refuse(f"cannot be read ({error.strerror})") from None
    if not KEY_PATTERN.fullmatch(key):
        raise refuse("holds no key (one word of at least 16 letters, digits or ._~+/=-)")
    return key


def bearer(path: Path | str) -> dict[str, str]:
    """The ``Authorization`` header of the key in the local file ``path``."""
    return {"Authorization": f"Bearer {local_key(path)}"}


def key_put(source: Path | str, path: str, user: str, text: str | None = None
            ) -> Generator[PyinfraCommand, None, bool]:
    """
    The local key file ``source`` on the host at ``path`` (or ``text`` made of
    it), owned by ``user`` and readable by it alone; nothing when it is there
    already. Put by SFTP: the key is on no command line. Returns whether it
    changed: a service that read the old one must start again to read it.
    """
    content = local_key(source) + "\n" if text is None else text
    changed = False
    # pyinfra's --diff prints a put file's old and new lines: never a key's.
    diff, state.config.DIFF = state.config.DIFF, False
    try:
        for command in files.put._inner(src=io.StringIO(content), dest=path, user=user,
                                        mode="600", create_remote_dir=True):
            changed = True
            yield command
    finally:
        state.config.DIFF = diff
    return changed
