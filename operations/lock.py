"""
The host lock: one run at a time against the same hosts.

Two operators (or an operator and a campaign) moving the same workstations at
once would each undo the other's driver and services. Each run takes a lock
file in ``/run/twinbolt`` (tmpfs: a reboot releases it) naming its owner, pid,
start time and target state; a second run refuses at once and says who holds
it. A lock whose owner is gone (a run killed mid-way) is taken over with a
warning, so an interrupted run never blocks the next one.

The lock is bookkeeping about the run, not part of the hosts' declared state, so
taking and releasing it is done inside the operations at execute time and
reported as "no change": a converged second run still shows no change anywhere.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.command import PyinfraCommand

from operations.attempt import refuse
from operations.phase import executing, run_now

LOCK_NAME = "lock"


@dataclass(frozen=True)
class RunOwner:
    """Who a run is: the operator's machine and user, the pyinfra pid, when, and what for."""

    machine: str
    user: str
    pid: int
    started: str
    state: str

    def line(self) -> str:
        return (f"machine={self.machine} user={self.user} pid={self.pid} "
                f"started={self.started} state={self.state}")

    @classmethod
    def parse(cls, line: str) -> RunOwner:
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        return cls(fields.get("machine", "?"), fields.get("user", "?"),
                   int(fields.get("pid", "0") or 0), fields.get("started", "?"),
                   fields.get("state", "?"))

    def describe(self) -> str:
        return (f"{self.user}@{self.machine} pid {self.pid} since {self.started} "
                f"(state {self.state})")

    def gone(self) -> bool:
        """True only when the owner is provably gone: same machine, no such process.
        An owner on another machine cannot be checked from here, so it counts as alive."""
        if self.machine != socket.gethostname():
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return True
        # A killed run may linger as a zombie until reaped: it holds nothing.
        return stat.rpartition(")")[2].split()[0] == "Z"


@cache
def this_run(state: str) -> RunOwner:
    """This run, the same value on every host (``deploy.py`` runs once per host)."""
    return RunOwner(socket.gethostname(), getpass.getuser(), os.getpid(),
                    time.strftime("%Y-%m-%dT%H:%M:%S%z"), state)


class HostLock(FactBase):
    """The run holding ``<run_dir>/lock``, or ``None`` when no run does."""

    def command(self, run_dir: str) -> StringCommand:
        return StringCommand("cat", QuoteString(f"{run_dir}/{LOCK_NAME}"), "2>/dev/null", "||",
                             "true")

    def process(self, output: list[str]) -> RunOwner | None:
        return RunOwner.parse(output[0]) if output else None


def lock_path(run_dir: str) -> str:
    return f"{run_dir}/{LOCK_NAME}"


def held_elsewhere(run_dir: str, owner: RunOwner) -> RunOwner | None:
    """The run holding this host's lock if it is another, live one; refuse in that case."""
    current = host.get_fact(HostLock, run_dir=run_dir)
    if current is not None and current != owner and not current.gone():
        path = lock_path(run_dir)
        refuse("lock", [f"another run holds {path}: {current.describe()}; if no such run "
                        f"exists any more, remove {path} on {host.name}"])
    return current


@operation(is_idempotent=True)
def available(run_dir: str, owner: RunOwner) -> Iterator[PyinfraCommand]:
    """
    Refuse at once when another live run holds this host's lock. Read-only: a run
    refused later, in preflight, must leave no lock behind.

    + run_dir: the tmpfs directory holding the lock
    + owner: this run

    **Example:**

    .. code:: python

        lock.available(name="Lock: no other run holds these hosts", run_dir="/run/twinbolt",
                       owner=this_run("tp2_e2e"))
    """
    held_elsewhere(run_dir, owner)
    host.noop("no other run holds this host")
    yield from ()


@operation(is_idempotent=True)
def held(run_dir: str, owner: RunOwner) -> Iterator[PyinfraCommand]:
    """
    Hold this host's lock for the rest of the run: refuse if another live run
    holds it, take it over (with a warning) if its owner is gone.

    + run_dir: the tmpfs directory holding the lock
    + owner: this run

    **Example:**

    .. code:: python

        lock.held(name="Lock: held by this run", run_dir="/run/twinbolt",
                  owner=this_run("tp2_e2e"))
    """
    if not executing():
        host.noop("the host lock is taken when the run executes")
        return
    current = held_elsewhere(run_dir, owner)
    if current == owner:
        host.noop("this run holds the lock")
        return
    path = lock_path(run_dir)
    if current is not None:
        logger.warning(f"{host.print_prefix}taking over the stale lock of {current.describe()}")
    # noclobber: two runs racing for a free lock cannot both create the file.
    take = StringCommand(
        "mkdir", "-p", "-m", "0700", QuoteString(run_dir), "&&",
        *(["rm", "-f", QuoteString(path), "&&"] if current is not None else []),
        "(", "set", "-C", ";", "echo", QuoteString(owner.line()), ">", QuoteString(path), ")",
    )
    taken, output = run_now(take)
    if not taken:
        refuse("lock", [f"another run took {path} at the same moment: {output.stderr}"])
    host.noop("this run holds the lock")
    yield from ()


@operation(is_idempotent=True)
def released(run_dir: str, owner: RunOwner) -> Iterator[PyinfraCommand]:
    """
    Release this host's lock if this run holds it.

    + run_dir: the tmpfs directory holding the lock
    + owner: this run

    **Example:**

    .. code:: python

        lock.released(name="Lock: released", run_dir="/run/twinbolt", owner=owner)
    """
    if executing() and host.get_fact(HostLock, run_dir=run_dir) == owner:
        run_now(StringCommand("rm", "-f", QuoteString(lock_path(run_dir))))
    host.noop("the lock is released")
    yield from ()
