"""
What a value may hold to be written into the formats twinbolt writes: systemd
units, runit run scripts, an ssh_config, and command lines.

Each format has quoting for most characters, and each renderer uses it; these
types refuse what no quoting can carry, or what a reader takes as syntax
before any quoting applies:

- a control character (a newline above all) in any free text: a unit's
  ``User=sglang\\nAmbientCapabilities=CAP_SYS_ADMIN`` is a second directive, and
  ``WorkingDirectory=/srv\\nExecStartPre=+/usr/bin/id`` runs as root;
- a ``%`` in an account or host name (a systemd specifier, an ssh_config
  token) and a leading ``-`` where a command line or a directive would read an
  option (``ssh -oProxyCommand=...``, ``--model-path -x``, ``WorkingDirectory=-``).

The site model (:mod:`operations.site.model`) and the service model
(:class:`operations.services.Service`) share them, so that a value the site
accepts is one every later step can render: it is refused at load, before the
first change, not halfway through a transition with the replicas stopped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, StringConstraints

# POSIX's portable account names, as systemd's User= and useradd accept them
# (32 characters at most: utmp's limit).
ACCOUNT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
# A host's inventory name, a DNS name or an IP address: no blank, no quote, no
# % (an ssh_config token), no leading - (an ssh option).
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
# A network interface's name, as the kernel allows it (IFNAMSIZ: 15 characters).
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")
# A variable's name, as sh and systemd's Environment= take it.
ENVIRONMENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A Python module (``python -m NAME``) or a kernel module's name.
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
SERVICE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")


def control_characters(value: str) -> list[str]:
    """The control characters ``value`` holds, as ``repr`` shows them (``'\\n'``)."""
    return sorted({repr(char) for char in value if ord(char) < 32 or ord(char) == 127})


def no_control_characters(value: str) -> str:
    if found := control_characters(value):
        raise ValueError(f"holds the control character(s) {', '.join(found)}: a newline "
                         "would start a new directive in a systemd unit or an ssh_config; "
                         "write the value on one line")
    return value


def not_an_option(value: str) -> str:
    if value.startswith("-"):
        raise ValueError("starts with '-', which a command line would read as an option")
    return value


def not_root(value: str) -> str:
    # A server that answers the network, runs a venv's code and loads the
    # working directory's modules does not need root: a hole in it is then a
    # hole in an account that owns nothing but its own files.
    if value == "root":
        raise ValueError("must not be root: the service needs no privilege (its ports are "
                         "above 1024; a GPU server needs the GPU device files, readable by an "
                         "account in the group that owns /dev/nvidia*, \"video\" or "
                         "\"render\"); name an unprivileged account")
    return value


def absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("must be an absolute path (starting with '/')")
    return value


def _matching(pattern: re.Pattern[str], what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"is not {what} (the pattern {pattern.pattern}): no blank, "
                             "quote, %, control character or leading -")
        return value
    return check


def ssh_config_word(value: str, tokens: bool = True) -> str:
    """
    One argument of an OpenSSH config line (``ssh_config``, ``sshd_config``):
    double-quoted when it has blanks, its ``%`` doubled where the keyword
    expands tokens. A double quote or a control character has no quoting in
    that format, so it is refused.
    """
    if '"' in value or control_characters(value):
        raise ValueError(f"{value!r} cannot be written into an OpenSSH config: it holds a "
                         "double quote or a control character")
    if tokens:
        value = value.replace("%", "%%")
    return f'"{value}"' if not value or any(char.isspace() for char in value) else value


# One line of text, without leading or trailing blanks.
FreeText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1),
                     AfterValidator(no_control_characters)]
# A word that lands on a command line as an argument, never as an option.
Argument = Annotated[FreeText, AfterValidator(not_an_option)]
AbsolutePath = Annotated[FreeText, AfterValidator(absolute)]
AccountName = Annotated[str, AfterValidator(_matching(ACCOUNT_NAME, "an account name"))]
# The account a network service runs as.
ServiceAccount = Annotated[AccountName, AfterValidator(not_root)]
HostName = Annotated[str, AfterValidator(_matching(HOST_NAME, "a host name or address"))]
InterfaceName = Annotated[str, AfterValidator(_matching(INTERFACE_NAME,
                                                        "a network interface's name"))]
EnvironmentName = Annotated[str, AfterValidator(_matching(ENVIRONMENT_NAME,
                                                          "an environment variable's name"))]
ModuleName = Annotated[str, AfterValidator(_matching(MODULE_NAME, "a module's name"))]
# A service's name: a systemd unit's (before .service) and a runit service's directory.
ServiceName = Annotated[str, AfterValidator(_matching(SERVICE_NAME, "a service's name"))]
