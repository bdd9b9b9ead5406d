"""
Several pyinfra facts read from one host in one SSH round trip.

The harness reads hosts outside a pyinfra run (a measurement window cannot wait
for pyinfra to connect, and its counters must be read at one instant), but it
must read them exactly as the layers do. So it runs the layers' own readings
(lists of :class:`~operations.plumbing.reading.Query`): each fact's ``command``
goes into one shell script, and each section of the output goes to that fact's
``process``, with pyinfra's rule that a failed or silent
command yields the fact's ``default``. On a host that is reached as a user with
sudo, the script runs under sudo, as pyinfra runs the facts there.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from operations.plumbing.facts import FactGroup, section_values, sections_script
from operations.plumbing.reading import Query
from operations.site.hosts import InventoryEntry

SSH_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Reading:
    """The facts read from one host, and when (monotonic seconds, on this machine)."""

    host: str
    values: dict[str, Any]
    at: float
    error: str | None = None


def script(queries: list[Query]) -> str:
    """One shell script running every fact in a subshell, each section between markers."""
    for query in queries:
        if isinstance(query.fact, FactGroup):
            # Its own sections would end the harness's early: read its members instead.
            raise TypeError(f"{query.key}: a FactGroup's members are read one query each")
    return sections_script({query.key: query.command() for query in queries})


def parse(output: str, queries: list[Query]) -> dict[str, Any]:
    """Each fact's value from the script's output, processed as pyinfra would."""
    return section_values(output.splitlines(), {query.key: query.fact for query in queries})


def remote_command(script: str, sudo: bool = False) -> str:
    """
    The command line ``ssh`` has the remote shell run: ``script``, or with
    ``sudo`` the script as root, wrapped as pyinfra wraps a command under
    ``_sudo`` (``pyinfra.connectors.util.make_unix_command``), so that the
    harness reads what the layers read, and never waits for a password.
    """
    return f"sudo -H -n sh -c {shlex.quote(script)}" if sudo else script


@dataclass(frozen=True)
class Ran:
    """What one ``ssh`` command did: its exit code (``None``: no answer in time), its output."""

    host: str
    returncode: int | None
    stdout: str
    stderr: str
    at: float

    def error(self) -> str | None:
        """Why the command failed, in ssh's or the command's own words; ``None`` if it did not."""
        if self.returncode is None:
            return f"ssh {self.host}: {self.stderr}"
        if self.returncode != 0:
            return f"ssh {self.host}: {self.stderr.strip() or f'exit code {self.returncode}'}"
        return None


def ssh_argv(host: str, command: str, ssh_config: Path) -> list[str]:
    """
    The ``ssh`` that has ``host`` (named in ``ssh_config``; after ``--``, never
    read as an option) run ``command``.
    """
    return ["ssh", "-F", str(ssh_config), "--", host, command]


async def run(host: str, command: str, ssh_config: Path,
              timeout: float = SSH_TIMEOUT_SECONDS) -> Ran:
    """Run ``command`` on ``host`` (named in ``ssh_config``) by one ``ssh``, within ``timeout``."""
    process = await asyncio.create_subprocess_exec(
        *ssh_argv(host, command, ssh_config),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        return Ran(host, None, "", f"no answer within {timeout:g}s", time.monotonic())
    return Ran(host, process.returncode, stdout.decode(errors="replace"),
               stderr.decode(errors="replace"), time.monotonic())


async def read(host: str, queries: list[Query], ssh_config: Path,
               timeout: float = SSH_TIMEOUT_SECONDS, sudo: bool = False) -> Reading:
    """
    Read ``queries`` on ``host`` (a name in ``ssh_config``) with one ``ssh``
    command, under sudo with ``sudo``.
    """
    ran = await run(host, remote_command(script(queries), sudo), ssh_config, timeout)
    if error := ran.error():
        return Reading(host, {}, ran.at, error)
    return Reading(host, parse(ran.stdout, queries), ran.at)


async def read_all(hosts: dict[InventoryEntry, list[Query]],
                   ssh_config: Path) -> dict[str, Reading]:
    """
    Read every host at once, so that their readings are taken at (nearly) one
    instant; each as its inventory data says (under sudo or not). The readings
    are filed by host name.
    """
    readings = await asyncio.gather(
        *(read(entry.name, queries, ssh_config, sudo=entry.sudo)
          for entry, queries in hosts.items())
    )
    return {reading.host: reading for reading in readings}
