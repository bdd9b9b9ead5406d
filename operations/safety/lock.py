"""
The host lock: one run at a time against the same hosts.

Two operators (or an operator and a campaign) moving the same workstations at
once would each undo the other's driver and services. Each run takes a lock
file in ``/run/twinbolt`` (tmpfs: a reboot releases it) naming its owner, pid,
start time and target state; a second run refuses at once and says who holds
it. A lock whose owner is gone (a run killed mid-way) is taken over with a
warning, so an interrupted run never blocks the next one.

The locks of the pair are all or nothing. They are taken host by host, always
in the inventory's order (workstations first), so that of two runs started
together the one that takes the first host proceeds and the other is refused
there, having taken nothing; a run refused on a later host releases the locks
it took before the refusal ends it (:class:`Locks`), as any refusal after them
does.

A run is named by a random token, not by its machine's host name and pid: two
operator machines may share a host name, and a pid means something only on
one boot of one machine, in one pid namespace (its ``boot``). An owner is
judged gone only there. Every change of the lock file is one compare-and-swap
under ``flock`` of a guard file beside it: the lock is replaced only if it
still holds what this run read, by renaming a complete new file over it, so
two runs taking over one stale lock cannot both win and no reader ever sees a
half-written lock.

The lock is bookkeeping about the run, not part of the hosts' declared state, so
taking and releasing it is done inside the operations at execute time
(:func:`~operations.plumbing.phase.run_now`), never while the run is only
planned or predicted, and reported as "no change": a converged second run still
shows no change anywhere. pyinfra leaves no other way: it reports every command
an operation yields as a change, and a refusal (the lock taken first by another
run) must be raised by the operation's body to end the run as a refusal.

One lock is taken while the run is planned, not by a step: the gateway's, for
a run that leaves pairs out (:func:`gateway_taken`), because the plan itself
reads what another run may be changing.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from pyinfra import host, logger
from pyinfra.api import FactBase, Host, StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_host

from operations.plumbing.facts import shell_script
from operations.plumbing.phase import (
    connector_arguments,
    executing,
    planning_arguments,
    run_now,
)
from operations.site.options import INHERITED_KEY
from operations.step import Ending, Layer, operation, refuse

LAYER = Layer.LOCK
LOCK_NAME = "lock"
STARTED_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
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

    def age(self) -> str:
        """How long it has held the lock, as ``H:MM:SS``; a start that cannot be read says so."""
        try:
            started = datetime.strptime(self.started, STARTED_FORMAT)
        except ValueError:
            return "an unknown time"
        return str(timedelta(seconds=max(0, int(time.time() - started.timestamp()))))

    def checkable(self) -> bool:
        """Whether its pid means a process here: it is of this boot and pid namespace."""
        return bool(self.boot) and self.boot == boot_here()

    def gone(self) -> bool:
        """
        True only when the owner is provably gone: its pid is of this boot and pid
        namespace, and no such process runs. An owner elsewhere (another machine,
        even one with this host name, or this one before a reboot) cannot be
        checked from here, so it counts as alive.
        """
        if not self.checkable():
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
                    time.strftime(STARTED_FORMAT), state, secrets.token_hex(12),
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
        return shell_script(script, lock_path(run_dir))

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
    return shell_script(script, run_dir, seen, new or "", "remove" if new is None else "write")


def seen_as(owner: RunOwner | None) -> str:
    """What :func:`swapped` compares the lock with, for a lock read as ``owner``."""
    return "" if owner is None else f"present {owner.line()}"


def clearing(path: str, only: str | None = None) -> str:
    """The one command an operator types to remove ``path`` on each host, or ``only`` on one."""
    limit = f"--limit {only} " if only else ""
    return f"pyinfra {limit}inventory.py exec -- rm -f {path}"


def held_by(path: str, holder: RunOwner) -> str:
    """
    Why a live run's lock refuses this one: who holds it and for how long; for a run
    this machine cannot check (another operator machine, or this one before a
    reboot), which is never judged stale, the command that clears it if it is gone.
    """
    found = f"another run holds {path}: {holder.describe()}, for {holder.age()}"
    if holder.checkable():
        return f"{found}; it still runs on this machine"
    return (f"{found}; it was taken on another machine (or before this one rebooted), so it "
            f"is never judged stale from here: if no such run exists any more, clear it on "
            f"each host with `{clearing(path)}`")


def held_elsewhere(run_dir: str, owner: RunOwner) -> RunOwner | None:
    """The run holding this host's lock if it is another, live one; refuse in that case."""
    current = host.get_fact(HostLock, run_dir=run_dir)
    path = lock_path(run_dir)
    if isinstance(current, UnreadableLock):
        refuse(LAYER, [f"{path} on {host.name} is {current.why} and names no run: if no "
                        f"run holds these hosts, remove {path} on {host.name}"])
    if current is not None and current != owner and not current.gone():
        refuse(LAYER, [held_by(path, current)])
    return current


@dataclass
class Locks:
    """
    The host locks a run holds, and those it took, in order, each with how its host
    was reached (the connector arguments: ``_sudo`` above all). A refusal ends the
    run at once, before its release step: :meth:`released_if_refused`, told how the
    run ended, releases what it took, newest first.
    """

    owner: RunOwner
    holding: set[str] = field(default_factory=set)
    taken: list[tuple[Host, str, dict[str, Any]]] = field(default_factory=list)

    def holds(self, host_name: str) -> bool:
        return host_name in self.holding

    def released_if_refused(self, ending: Ending) -> None:
        if ending.outcome == "refused":
            self.release_taken()

    def release_taken(self) -> None:
        """Release what this run took, newest first: it ends before its release step."""
        while self.taken:
            taken_host, run_dir, arguments = self.taken.pop()
            self.holding.discard(taken_host.name)
            released, output = taken_host.run_shell_command(
                swapped(run_dir, seen_as(self.owner), None), **arguments)
            if not released:
                path = lock_path(run_dir)
                logger.warning(f"{taken_host.print_prefix}{path}, taken by this refused run, "
                               f"could not be released ({output.stderr}): clear it with "
                               f"`{clearing(path, taken_host.name)}`")


class Locking(Protocol):
    """What the lock needs of the run (an :class:`operations.run.Run`): who it is, and its locks."""

    owner: RunOwner
    locks: Locks


@operation(LAYER, is_idempotent=True)
def held(run_dir: str, run: Locking, holder: str) -> Iterator[PyinfraCommand]:
    """
    Hold ``holder``'s lock for the rest of the run: refuse if another live run
    holds it, take it over (with a warning) if its owner is gone.

    Called once for each host of the run, in the inventory's order, and a step for
    one host passes on every other: the hosts' locks are taken one after another,
    never at once, so that of two runs the one that takes the first proceeds.

    + run_dir: the tmpfs directory holding the lock
    + run: the :class:`~operations.run.Run`, whose owner the lock names and whose
      :class:`Locks` note it
    + holder: the host whose lock this step takes

    **Example:**

    .. code:: python

        lock.held(name="Lock: held on wsa", run_dir="/run/twinbolt", run=run, holder="wsa")
    """
    if host.name != holder:
        host.noop(f"the lock of {holder} is taken there")
        return
    if not executing():
        host.noop("the host lock is taken when the run executes")
        return
    owner = run.owner
    current = held_elsewhere(run_dir, owner)
    if current != owner:
        take(run_dir, run.locks, current)
    run.locks.holding.add(host.name)
    host.noop("this run holds the lock")
    yield from ()


def take(run_dir: str, locks: Locks, current: RunOwner | None) -> None:
    """
    Take this host's lock, free or ``current``'s (a stale one), for ``locks``; refuse,
    naming the holder, if another run took it first.
    """
    path = lock_path(run_dir)
    if current is not None:
        logger.warning(f"{host.print_prefix}taking over the stale lock of {current.describe()}")
    # One winner: the lock is replaced only if it still reads what was judged above.
    taken, output = run_now(swapped(run_dir, seen_as(current), locks.owner.line()))
    if not taken:
        winner = host.get_fact(HostLock, run_dir=run_dir)
        refuse(LAYER, [held_by(path, winner) if isinstance(winner, RunOwner)
                       else f"{path} could not be taken: {output.stderr}"])
    # The host itself, not pyinfra's proxy for whichever host is current when released.
    locks.taken.append((ctx_host.get(), run_dir, connector_arguments()))


# How often a run waiting for the gateway asks again, and how often it says it still waits.
GATEWAY_POLL_SECONDS = 2.0
GATEWAY_REPORT_SECONDS = 30.0


class GatewayBusy(PyinfraError):
    """Another run held the gateway past this run's bound; this one took and changed nothing."""


def gateway_taken(gateway: Host, run_dir: str, run: Locking, dry: bool, timeout: float) -> None:
    """
    Hold the gateway's lock from the moment this run is planned, once no other
    live run holds it: a run that leaves pairs out plans the router and the
    route from what those pairs serve now (:mod:`operations.part`), which a run
    on another pair changes only while it holds the gateway. So two runs on
    different pairs plan and run one after the other, and neither can leave
    the router without a serving pair.

    Why here, while the run is planned, and not as a step: pyinfra plans every
    host's operations (``deploy.py``, once per host) before it executes any,
    and the gateway's plan, which operations it calls and with what, is read
    from the router now. A step would take the lock only after that plan was
    made from a router another run was changing. The wait polls from this
    machine, not in a remote loop, because whether a holder is gone is judged
    here (its pid, on this machine's boot: :meth:`RunOwner.gone`).

    The wait is said every :data:`GATEWAY_REPORT_SECONDS`; past ``timeout`` the
    run is refused, having taken nothing. A ``dry`` run waits and takes nothing.
    Once taken, the lock is the run's like any other: its step finds it held,
    the run's end or a refusal releases it. A rollback holds its run's already.
    """
    path = lock_path(run_dir)
    started = said = time.monotonic()
    while True:
        current = gateway.get_fact(HostLock, run_dir=run_dir)
        if current == run.owner or isinstance(current, UnreadableLock):
            # Held already, or a file its step refuses with its own words.
            return
        if current is None or current.gone():
            if dry:
                return
            if current is not None:
                logger.warning(f"{gateway.print_prefix}taking over the stale lock of "
                               f"{current.describe()}")
            arguments = planning_arguments(gateway)
            taken, _ = gateway.run_shell_command(
                swapped(run_dir, seen_as(current), run.owner.line()), **arguments)
            if taken:
                run.locks.taken.append((gateway, run_dir, arguments))
                return
            # Another run took it first: wait for that one.
            continue
        waited = time.monotonic() - started
        if waited > timeout:
            raise GatewayBusy(f"refused: {held_by(path, current)}; this run waited {waited:.0f}s "
                              "for it, the bound of a run. Nothing was taken or changed")
        if said == started or time.monotonic() - said >= GATEWAY_REPORT_SECONDS:
            logger.info(f"{gateway.print_prefix}waiting for the gateway: {held_by(path, current)}"
                        "; this run is planned once it ends")
            said = time.monotonic()
        time.sleep(GATEWAY_POLL_SECONDS)


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
