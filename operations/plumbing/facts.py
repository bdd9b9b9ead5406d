"""
What twinbolt's facts share.

Each fact is one remote command. Where a step needs several facts at once, they
are read as one command in sections (:class:`FactGroup`, and the harness's
reads): each fact's command in a subshell between markers, each section handed
to that fact's ``process``, with pyinfra's rule that a failed or silent command
yields the fact's ``default``. One SSH round trip instead of one per fact.

pyinfra never calls a fact's ``process`` with an empty output: a command that
prints nothing gets ``default()``, which is ``None`` unless the fact says
otherwise. For a fact whose empty output has a meaning (no such interface, no
such file, no process), ``None`` is the wrong answer at the worst moment, say
``thunderbolt0`` read between ``rmmod`` and the next load.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

from pyinfra.api import FactBase, QuoteString, StringCommand

MARKER = "@@twinbolt-fact"


class EmptyMeansSomething(FactBase):
    """A fact whose empty output means what ``process([])`` says it means."""

    def default(self) -> Any:
        return self.process([])


def shell_script(script: str, *arguments: object) -> StringCommand:
    """
    ``sh -c script - arguments...``: the script one quoted word, each argument
    one of its positional parameters (``$1``, ``$2`` ...), quoted, so that no
    value (a path, a service's name, an account) is ever read as shell syntax.
    """
    return StringCommand("sh", "-c", QuoteString(script), "-",
                         *(QuoteString(argument) for argument in arguments))


def digest_script(path: str) -> str:
    """Shell that prints ``file MODE SHA1`` for the regular file ``path`` (a shell word)."""
    return (f'[ -f {path} ] && echo "file $(stat -c %a {path}) '
            f'$(sha1sum < {path} | cut -c1-40)"; ')


def digest(content: str, mode: str) -> str:
    """What :class:`FileDigest` reads of a file holding ``content`` with ``mode``."""
    return f"{mode} {hashlib.sha1(content.encode()).hexdigest()}"


class FileDigest(FactBase):
    """
    A regular file's mode and SHA-1, in one command where pyinfra's ``File`` and
    ``Sha1File`` take two; ``None`` if there is none. Compared with :func:`digest`,
    it tells whether an upload would change anything.

    .. code:: python

        "644 3f786850e387550fdab836ed7e6dc881de23001b"
    """

    def command(self, path: str) -> StringCommand:
        return shell_script(digest_script('"$1"') + "true", path)

    def process(self, output: list[str]) -> str | None:
        return output[0].strip().removeprefix("file ") if output else None


def raw_command(fact: FactBase, arguments: dict[str, Any]) -> str:
    """A fact's command as shell text: a method's result, or (pyinfra allows it) a string."""
    command = fact.command
    if callable(command):
        command = command(**arguments)
    return command.get_raw_value() if isinstance(command, StringCommand) else command


def sections_script(commands: dict[str, str]) -> str:
    """One shell script running each command in a subshell, each section between markers."""
    return "\n".join(
        f"echo '{MARKER} {key}'; ( {command} ) 2>/dev/null; echo \"{MARKER}-status $?\""
        for key, command in commands.items()
    )


def section_values(lines: list[str], facts: dict[str, FactBase]) -> dict[str, Any]:
    """Each fact's value from its section of :func:`sections_script`'s output."""
    found: dict[str, list[str]] = {}
    status: dict[str, int] = {}
    key = None
    for line in lines:
        # A command whose output does not end its last line (curl's -w "%{http_code}")
        # leaves the status marker at the end of that line, after the output's last word.
        ended = line.find(f"{MARKER}-status ")
        if line.startswith(f"{MARKER} "):
            key = line.removeprefix(f"{MARKER} ")
            found[key] = []
        elif ended >= 0 and key is not None:
            if ended:
                found[key].append(line[:ended])
            status[key] = int(line.split()[-1])
            key = None
        elif key is not None:
            found[key].append(line)
    return {key: fact.process(found[key]) if status.get(key) == 0 and found.get(key)
            else fact.default()
            for key, fact in facts.items()}


class FactGroup(FactBase):
    """
    Several facts read by one command; the value maps each member's name to its value.

    A subclass names its ``members``, and its ``command`` takes named arguments
    (pyinfra passes a fact's arguments by the names its ``command`` declares) and
    returns :meth:`sections` with each member's.
    """

    members: ClassVar[dict[str, type[FactBase]]] = {}

    def sections(self, arguments: dict[str, dict[str, Any]]) -> str:
        """The members' commands, each with its arguments (by member name; none if absent)."""
        return sections_script({key: raw_command(fact(), arguments.get(key, {}))
                                for key, fact in self.members.items()})

    def process(self, output: list[str]) -> dict[str, Any]:
        return section_values(output, {key: fact() for key, fact in self.members.items()})

    def default(self) -> dict[str, Any]:
        return self.process([])
