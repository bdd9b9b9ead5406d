"""
The host lock: one run at a time against the same hosts.

Two operators (or an operator and a campaign) moving the same workstations at
once would each undo the other's driver and services. Each run takes a lock
file in ``/run/twinbolt`` (tmpfs: a reboot releases it) naming its owner, pid,
start time and target state; a second run refuses at once and says who holds
it. A lock whose owner is gone (a run killed mid-way) is taken over with a
warning, so an interrupted run never blocks the next one.

A run is named by a random token, not by its machine's host name and pid: two
operator machines may share a host name, and a pid means something only on
one boot of one machine, in one pid namespace (its ``boot``). An owner is
judged gone only there. Every change of the lock file is one compare-and-swap
under ``flock`` of a guard file beside it: the lock is replaced only if it
still holds what this run read, by renaming a complete new file over it, so
two runs taking over one stale lock cannot both win and no reader ever sees a
half-written lock.

The lock is bookkeeping about the run, not part of the hosts' declared state, so
taking and releasing it is done inside the operations at execute time and
reported as "no change": a converged second run still shows no change anywhere.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.command import PyinfraCommand

from operations.attempt import Layer, operation, refuse
from operations.phase import executing, run_now

LAYER = Layer.LOCK
LOCK_NAME = "lock"
# flock(1) of this file serializes every change of the lock (util-linux, on
# every distribution twinbolt targets); the lock itself is renamed over.
GUARD_NAME = "lock.guard"
GUARD_SECONDS = 10


def boot_here() -> str:
    """
    Where a pid means this process: the kernel's boot id and this pid namespace
    (a container on the same kernel has its own pids). Empty where unreadable.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]")
    except OSError:
        return ""
    return f"{boot}/{namespace}"


@dataclass(frozen=True)
class RunOwner:
    """
    Who a run is: the operator's machine and user, the pyinfra pid, when, and
    what for; its ``token`` makes it unique, ``boot`` says where its pid is one.
    """

    machine: str
    user: str
    pid: int
    started: str
    state: str
    token: str = ""
    boot: str = ""

    def line(self) -> str:
        return (f"machine={self.machine} user={self.user} pid={self.pid} "
                f"started={self.started} state={self.state} token={self.token} "
                f"boot={self.boot}")

    @classmethod
    def parse(cls, line: str) -> RunOwner:
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        pid = fields.get("pid", "0")
        return cls(fields.get("machine", "?"), fields.get("user", "?"),
                   int(pid) if pid.isdigit() else 0, fields.get("started", "?"),
                   fields.get("state", "?"), fields.get("token", ""), fields.get("boot", ""))

    def describe(self) -> str:
        return (f"{self.user}@{self.machine} pid {self.pid} since {self.started} "
                f"(state {self.state})")

    def gone(self) -> bool:
        """
        True only when the owner is provably gone: its pid is of this boot and pid
        namespace, and no such process runs. An owner elsewhere (another machine,
        even one with this host name, or this one before a reboot) cannot be
        checked from here, so it counts as alive.
        """
        if not self.boot or self.boot != boot_here():
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return True
        # A killed run may linger as a zombie until reaped: it holds nothing.
        return stat.rpartition(")")[2].split()[0] == "Z"


@dataclass(frozen=True)
class UnreadableLock:
    """A lock file that names no run: empty, or not readable by this run."""

    why: str

    def describe(self) -> str:
        return f"a lock file that names no run ({self.why})"


# The host data naming the run whose lock a rollback holds (attempt.rolled_back).
INHERITED_KEY = "lock_inherited"


def run_owner(state: str, inherited: str | None) -> RunOwner:
    """
    Who this run is: itself, or, for the rollback a failed run starts, that run
    (``inherited``, its :meth:`RunOwner.line`), whose lock it holds on and leaves.
    """
    return RunOwner.parse(inherited) if inherited else this_run(state)


def inheriting(owner: RunOwner) -> str:
    """The ``key=value`` data item that has a rollback hold ``owner``'s lock."""
    return f"{INHERITED_KEY}={owner.line()}"


def this_run(state: str) -> RunOwner:
    """
    A new run's identity, made once per run (:func:`operations.run.begin`): the
    same value on every host, though ``deploy.py`` runs once per host.
    """
    return RunOwner(socket.gethostname(), getpass.getuser(), os.getpid(),
                    time.strftime("%Y-%m-%dT%H:%M:%S%z"), state, secrets.token_hex(12),
                    boot_here())


class HostLock(FactBase):
    """
    The run holding ``<run_dir>/lock``: a :class:`RunOwner`, an
    :class:`UnreadableLock` for a file that names none, or ``None`` when there is
    no lock file.
    """

    def command(self, run_dir: str) -> StringCommand:
        script = ('[ -e "$1" ] || exit 0; '
                  '[ -r "$1" ] || { echo "unreadable"; exit 0; }; '
                  'line=$(head -n 1 "$1"); '
                  '[ -n "$line" ] && echo "owner $line" || echo "empty"')
        return StringCommand("sh", "-c", QuoteString(script), "-",
                             QuoteString(lock_path(run_dir)))

    def process(self, output: list[str]) -> RunOwner | UnreadableLock | None:
        if not output:
            return None
        kind, _, line = output[0].partition(" ")
        if kind == "owner":
            return RunOwner.parse(line)
        return UnreadableLock("empty" if kind == "empty" else "not readable")


def lock_path(run_dir: str) -> str:
    return f"{run_dir}/{LOCK_NAME}"


def swapped(run_dir: str, seen: str, new: str | None) -> StringCommand:
    """
    Replace the lock with ``new`` (one owner's line; ``None`` removes it) only if
    it still reads ``seen`` (``""``: there is no lock file), under ``flock`` of
    the guard file; a new lock is a complete file renamed over the old one. It
    fails, naming what it found, if another run changed the lock first.
    """
    script = (
        'dir=$1 seen=$2 new=$3; mkdir -p -m 0700 "$dir" && cd "$dir" || exit 1; '
        'command -v flock >/dev/null || { echo "flock (util-linux) is not installed" >&2; '
        "exit 1; }; "
        f'exec 9>>{GUARD_NAME}; '
        f'flock -x -w {GUARD_SECONDS} 9 || {{ echo "$dir/{GUARD_NAME} stayed locked for '
        f'{GUARD_SECONDS}s" >&2; exit 1; }}; '
        f'now=; [ -e {LOCK_NAME} ] && now="present $(head -n 1 {LOCK_NAME})"; '
        '[ "$now" = "$seen" ] || { echo "another run changed it first; it now reads: '
        '${now:-nothing}" >&2; exit 1; }; '
        f'if [ "$4" = remove ]; then rm -f {LOCK_NAME}; exit; fi; '
        f'tmp={LOCK_NAME}.new.$$; printf "%s\\n" "$new" > "$tmp" && mv -f "$tmp" {LOCK_NAME}'
    )
    return StringCommand("sh", "-c", QuoteString(script), "-", QuoteString(run_dir),
                         QuoteString(seen), QuoteString(new or ""),
                         "remove" if new is None else "write")


def seen_as(owner: RunOwner | None) -> str:
    """What :func:`swapped` compares the lock with, for a lock read as ``owner``."""
    return "" if owner is None else f"present {owner.line()}"


def held_elsewhere(run_dir: str, owner: RunOwner) -> RunOwner | None:
    """The run holding this host's lock if it is another, live one; refuse in that case."""
    current = host.get_fact(HostLock, run_dir=run_dir)
    path = lock_path(run_dir)
    if isinstance(current, UnreadableLock):
        refuse(LAYER, [f"{path} on {host.name} is {current.why} and names no run: if no "
                        f"run holds these hosts, remove {path} on {host.name}"])
    if current is not None and current != owner and not current.gone():
        refuse(LAYER, [f"another run holds {path}: {current.describe()}; if no such run "
                        f"exists any more, remove {path} on {host.name}"])
    return current
@operation(LAYER, is_idempotent=True)
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


@operation(LAYER, is_idempotent=True)
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
    # One winner: the lock is replaced only if it still reads what was judged above.
    taken, output = run_now(swapped(run_dir, seen_as(current), owner.line()))
    if not taken:
        refuse(LAYER, [f"{path} could not be taken: {output.stderr}"])
    host.noop("this run holds the lock")
    yield from ()


@operation(LAYER, is_idempotent=True)
def released(run_dir: str, owner: RunOwner, inherited: bool = False
             ) -> Iterator[PyinfraCommand]:
    """
    Release this host's lock if this run holds it; a rollback (``inherited``)
    leaves it to the run that started it, which releases it once the rollback
    is done.

    + run_dir: the tmpfs directory holding the lock
    + owner: this run
    + inherited: the lock is the failed run's, which this rollback holds on

    **Example:**

    .. code:: python

        lock.released(name="Lock: released", run_dir="/run/twinbolt", owner=owner)
    """
    if inherited:
        host.noop("the lock stays with the run this rollback converges for")
        return
    if executing() and host.get_fact(HostLock, run_dir=run_dir) == owner:
        run_now(swapped(run_dir, seen_as(owner), None))
    host.noop("the lock is released")
    yield from ()
