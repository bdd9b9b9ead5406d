"""
Keys that live in mode-0600 files on the host that uses them, and never leave it.

A key is generated on its host (``sk-`` and 48 hex digits from ``/dev/urandom``)
unless the site put one there, is owned by the account of the service that
reads it, and is handed to curl on its standard input, so that it appears in
no command line, no process list and no pyinfra output, and neither pyinfra
nor pytest ever holds it. The gateway's proxy keeps its master key so; the
router its control key.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.api.command import PyinfraCommand
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
