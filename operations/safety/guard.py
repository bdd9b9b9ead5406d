"""
The guard: a watch on each workstation while the candidate driver is loaded.

A run, or ``experiment.py soak``, watches the candidate only while it runs on
the operator's machine. The upstream revert exists because some controllers
never return TX credits, and then the link carries nothing: left overnight in
``tp2_e2e``, a stall at 3 a.m. would keep the TP group wedged on the candidate
until someone came back. So the run that loads the candidate arms a guard on
each workstation (``templates/guard.sh.j2``), and the run that restores a stock
build disarms it first, so that the two never swap the driver at once.

- It is never persistent: its script lives in the run directory (tmpfs) and it
  runs as a transient service (:meth:`Supervisor.transient_start`: a transient
  systemd unit, or a runsv of its own under ``/run``), so a reboot forgets it,
  as it forgets the staged candidate.
- It judges the link, not the address: traffic sent across an up,
  addressed link with nothing coming back (the peer answers no ping) for
  ``candidate.guard_stall_seconds`` (a site key, timed since boot) is a
  stall; a link without carrier (the cable out, the peer asleep, a
  retraining) is not, nor one without its address (a new ``thunderbolt0``
  after a plug or a wake): the guard applies the declared address where
  twinbolt owns it (``link.address_owner``), and reports an ``unaddressed``
  event where the host's network manager does. On a stall it does only what
  is local and safe: it appends its evidence to :data:`EVENTS` (persistent:
  it outlives the reboot it may precede) as a restore under way, stops this
  host's TP rank, loads the stock driver (each module command bounded) and
  appends how that ended. It touches neither the gateway nor the other host:
  the fallback present in every TP state keeps ``small`` answering.
- The next run reads the events (:func:`reported`), under its lock: it moves
  them aside, names them, and the compatibility ledger records each stall,
  finished or not, once, as a stall of the candidate on that controller, so
  the next candidate run on it is refused;
  an ``unaddressed`` event is recorded as what it is, no stall. ``status``
  shows whether the guard is armed and any event no run has read yet.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pyinfra import host, logger
from pyinfra.api import StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.util import get_template
from pyinfra.operations import files

from operations.plumbing.facts import EmptyMeansSomething, FileDigest, digest, shell_script
from operations.plumbing.phase import executing, run_now
from operations.safety import ledger
from operations.safety.ledger import Observations
from operations.safety.lock import Locks, RunOwner
from operations.services import SUPERVISORS, TEMPLATES, InitSystem, Service
from operations.serving.sglang import TP_RANKS
from operations.site.settings import derived
from operations.states import Driver
from operations.step import Layer, operation, refuse
from operations.thunderbolt.driver import CandidateModule, staged_path, swap_planned
from operations.thunderbolt.link import ExpectedLink

if TYPE_CHECKING:
    from operations.site.settings import WorkstationSettings

LAYER = Layer.DRIVER
NAME = "twinbolt-guard"
TEMPLATE = TEMPLATES / "guard.sh.j2"
SCRIPT_MODE = "700"
# Where the guard records what it did, for the next run: persistent, on the workstation.
EVENTS = "/var/lib/twinbolt/guard-events.jsonl"
# The events a run has read, kept for the operator.
REPORTED = "/var/lib/twinbolt/guard-events.reported.jsonl"
# A run renames the events aside (``EVENTS.<its token>``) before it reads them: a
# guard's later append makes a new EVENTS, never lost in what is being read. It
# prints every file moved aside, its own and any an earlier run moved but did not
# finish with, as the fact's lines.
MOVE_ASIDE = ('events=$1 moved=$2; if [ -e "$events" ]; then mv -f "$events" "$moved" || exit 1; '
              'fi; for file in "$events".*; do [ -e "$file" ] || continue; '
              'sed "s/^/event /" "$file" || exit 1; done')
# Once recorded, what was moved aside is appended to REPORTED.
FINISH_MOVED = ('events=$1 reported=$2; for file in "$events".*; do [ -e "$file" ] || continue; '
                'cat "$file" >> "$reported" && rm -f "$file" || exit 1; done')
# How often it pings the peer.
INTERVAL_SECONDS = 2
# How long rmmod, then modprobe, may take before the guard gives up on the restore.
MODULE_SECONDS = 20
# The guard's fields that are where it reads the host and how long it waits there,
# no setting of the site's: their defaults, which only a test changes.
_READS_THE_HOST = ("events_path", "sysfs", "uptime_path", "module_seconds")


@dataclass(frozen=True)
class Guard:
    """
    What one workstation's guard watches and what it restores: the link as this
    host expects it (its interface, its declared address and who applies it, the
    peer), the stall bound, the module, and the TP rank it stops. ``sysfs`` and
    ``uptime_path`` are where it reads the host; only a test points them elsewhere.
    """

    link: ExpectedLink
    guard_stall_seconds: int
    module_name: str
    rank_service: str
    init_system: InitSystem
    run_dir: str
    staged_candidate: str
    events_path: str = EVENTS
    sysfs: str = "/sys"
    uptime_path: str = "/proc/uptime"
    module_seconds: int = MODULE_SECONDS

    @classmethod
    def of(cls, settings: WorkstationSettings, link: ExpectedLink) -> Guard:
        """
        The guard's settings by the site's names (``[candidate]``, ``[serving]``);
        where it reads and how long a module command may take are constants here.
        """
        return derived(
            cls, settings, settings.candidate, settings.serving, link=link,
            rank_service=TP_RANKS[settings.rank],
            staged_candidate=staged_path(settings.run_dir, CandidateModule.of(settings)),
            **{field.name: field.default for field in fields(cls)
               if field.name in _READS_THE_HOST},
        )

    @property
    def script_path(self) -> str:
        return f"{self.run_dir}/guard.sh"

    def script(self) -> str:
        """The guard's script, rendered locally, each value quoted for the shell."""
        return get_template(str(TEMPLATE)).render(
            sh=shlex.quote, script_path=self.script_path, interface=self.link.interface,
            address=self.link.link_address, prefix_length=int(self.link.prefix_length),
            address_owner=self.link.address_owner, peer_address=self.link.peer_link_address,
            stall_seconds=int(self.guard_stall_seconds), interval_seconds=INTERVAL_SECONDS,
            module_seconds=int(self.module_seconds), module=self.module_name,
            rank_service=self.rank_service, staged_path=self.staged_candidate,
            events_path=self.events_path, sysfs=self.sysfs, uptime_path=self.uptime_path,
            stop_service=SUPERVISORS[self.init_system].stop_script(),
        )

    def service(self) -> Service:
        stall = self.guard_stall_seconds
        return Service(name=NAME, description="twinbolt guard: the candidate thunderbolt_net "
                       f"is replaced by the stock driver after a {stall} s stall",
                       command=["/bin/sh", self.script_path])


# Facts


class GuardState(EmptyMeansSomething):
    """
    Whether the guard runs on this host, whether anything of it is left (it may
    have exited), and the events it recorded that no run has read yet.

    .. code:: python

        {"armed": True, "left": True,
         "events": [{"kind": "stall", "time": 1764900000, "stalled_seconds": 30, ...}]}
    """

    def command(self, init_system: InitSystem) -> StringCommand:
        supervisor = SUPERVISORS[init_system]
        # The events, and any a run moved aside and did not finish with.
        script = (supervisor.transient_active_script() + supervisor.transient_left_script()
                  + f"sed 's/^/event /' {EVENTS} {EVENTS}.* 2>/dev/null; true")
        return shell_script(script, NAME)

    def process(self, output: list[str]) -> dict[str, Any]:
        return {"armed": any(line.strip() == "active" for line in output),
                "left": any(line.strip() == "left" for line in output),
                "events": events_in(output)}


def events_in(output: list[str]) -> list[dict[str, Any]]:
    """The events among a command's ``event <json>`` lines, each restore once."""
    return completed([event_of(line.removeprefix("event ")) for line in output
                      if line.startswith("event ")])


def event_of(line: str) -> dict[str, Any]:
    """One recorded event; a line the guard did not finish is kept as its text."""
    try:
        event = json.loads(line)
    except ValueError:
        return {"unreadable": line.strip()}
    return event if isinstance(event, dict) else {"unreadable": line.strip()}


def completed(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """
    The events, each restore once: the guard appends its evidence before it
    restores (``"state": "restoring"``) and again with the outcome (``"done"``),
    which stands for the line of the same time, in whatever order the files
    holding them are read. A restore that hung, or that a reboot cut short,
    stays as its first line.
    """
    done = {event.get("time") for event in lines if event.get("state") == "done"}
    return [event for event in lines
            if not (event.get("state") == "restoring" and event.get("time") in done)]


def unaddressed(event: dict[str, Any]) -> bool:
    """Whether the event is a link without its address, which the guard reports but is no stall."""
    return event.get("kind") == "unaddressed"


def describe_event(event: dict[str, Any]) -> str:
    """One line an operator reads: when, how long, what the counters did, what it restored."""
    if "unreadable" in event:
        return f"an unfinished record: {event['unreadable']}"
    when = _time(event.get("time"))
    if unaddressed(event):
        return (f"{when}: {event.get('interface')} had carrier but not its address "
                f"{event.get('address')} for {event.get('unaddressed_seconds')} s, and the "
                "host's network manager applies it (link.address_owner = system): no stall, "
                "the driver left alone")
    errors = event.get("rx_errors") or [0, 0]
    return (f"{when}: the peer {event.get('peer')} did not answer for "
            f"{event.get('stalled_seconds')} s with tx_e2e={event.get('tx_e2e')} "
            f"({_count(event.get('tx_bytes'))} bytes sent, {_count(event.get('rx_bytes'))} "
            f"received, rx_errors {errors[0]} -> {errors[-1]}): {_restore(event)}")


def summary(event: dict[str, Any]) -> str:
    """What the guard did, as ``status`` and a run name it, then the event."""
    done = "found the link unaddressed" if unaddressed(event) else "restored stock"
    return f"{done}: {describe_event(event)}"


def _restore(event: dict[str, Any]) -> str:
    if event.get("state") == "restoring":
        return ("the restore did not finish (it hung, or the host went down during it): "
                "whether the TP rank stopped and the stock driver loaded is unknown")
    rank = "TP rank stopped" if event.get("rank_stopped") else "TP rank not stopped"
    restored = ("the stock driver loaded" if event.get("stock_loaded")
                else "the stock driver did NOT load")
    return f"{rank}, {restored}"


def _count(count: Any) -> str:
    """A byte count, ``null`` where the guard could not tell (a counter that went back)."""
    return "unknown" if count is None else str(count)


def _time(seconds: Any) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(float(seconds)))
    except (TypeError, ValueError):
        return "at an unknown time"


def ledger_entry(event: dict[str, Any], observed: dict[str, Any]) -> dict[str, Any]:
    """
    The ledger's record of one event: a stall of the candidate on this host's
    controller, whether its restore finished or not; a link without its address
    is recorded as what it is, never a stall. It keeps the event itself, by
    which a record is known (:func:`recorded`).
    """
    return ledger.record("guard", Driver.CANDIDATE,
                         "unaddressed" if unaddressed(event) else "guarded", [observed],
                         layer=Layer.LINK,
                         evidence=f"the guard on {observed['host']}: {describe_event(event)}",
                         event=event)


def recorded(entry: dict[str, Any], records: list[dict[str, Any]]) -> bool:
    """
    Whether the ledger already has ``entry``'s event from its host: an event read again
    (moved aside by a run that failed before it finished) is recorded once, and so is a
    restore whose first line a run recorded before the guard appended how it ended (the
    two lines share their time).
    """
    hosts = [part.get("host") for part in entry["hosts"]]
    return any(record["outcome"] == entry["outcome"]
               and (record.get("event") or {}).get("time") == entry["event"].get("time")
               and [part.get("host") for part in record["hosts"]] == hosts
               for record in records)


def disarm_first(loaded: Driver, candidate: CandidateModule) -> bool:
    """
    Whether the guard is disarmed before the driver step: before any reload of
    the module, candidate to candidate too, as the driver layer answers it when
    the step runs; and always before a stock driver, which no guard watches.
    """
    return not Driver(loaded).is_candidate or swap_planned(loaded, candidate)


# Operations


@operation(LAYER)
def armed(guard: Guard, present: bool = True) -> Iterator[PyinfraCommand]:
    """
    Arm the guard while the candidate is loaded, or disarm it.

    Armed, its script is in the run directory and its transient service runs;
    a changed script restarts it. Disarmed, it is stopped, what its service left
    (a runsv after it exited) removed, and its script gone: nothing of it stays.
    Disarm it before any reload of the driver (:func:`disarm_first`): the guard
    and the run must never swap the driver at once.

    + guard: what this workstation's guard watches (:class:`Guard`)
    + present: armed, or not

    **Example:**

    .. code:: python

        guard.armed(name="Guard: armed while the candidate is loaded",
                    guard=Guard.of(settings, expected_link))
    """
    supervisor = SUPERVISORS[guard.init_system]
    state = host.get_fact(GuardState, init_system=guard.init_system)
    running = state["armed"]
    if not present:
        # A guard that exited after a restore leaves its runsv under runit: it goes too.
        if state["left"]:
            yield from supervisor.transient_stop(NAME)
        else:
            host.noop("the guard is not armed")
        yield from files.file._inner(path=guard.script_path, present=False)
        return
    script = guard.script()
    changed = host.get_fact(FileDigest, path=guard.script_path) != digest(script, SCRIPT_MODE)
    if changed:
        yield from files.put._inner(src=StringIO(script), dest=guard.script_path,
                                    mode=SCRIPT_MODE)
    if running and not changed:
        host.noop("the guard is armed")
        return
    if running:
        yield from supervisor.transient_stop(NAME)
    yield from supervisor.transient_start(guard.service())


class Guarded(Protocol):
    """
    What the guard's report needs of the run (an :class:`operations.run.Run`): who
    it is, the locks it holds, and what it observed.
    """

    owner: RunOwner
    locks: Locks
    observed: Observations


@operation(Layer.LEDGER, is_idempotent=True)
def reported(run: Guarded, init_system: InitSystem, ledger_path: str) -> Iterator[PyinfraCommand]:
    """
    Read what the guard did since the last run: name each event, and have the
    ledger record it as a stall of the candidate on this host's controller.

    Each event is recorded once: when the run executes, the events are renamed
    aside (:data:`MOVE_ASIDE`) and read, their records not yet in the ledger are
    appended, and then they move to :data:`REPORTED`; a run that fails in between
    leaves them aside, for the next run to read again. That is bookkeeping about
    the hosts, not their state: reported as no change, and left alone by
    ``--dry``. So both moves run in the body, at execute time
    (:func:`~operations.plumbing.phase.run_now`): pyinfra reports any command an
    operation yields as a change, and a move aside that fails refuses the run,
    which only the body can. Only a run that holds this host's lock reads them, so a run the
    lock refuses never takes them from the one that holds it. Call it after
    ``lock.held`` and ``ledger.observed``, whose reading of the controller the
    records name, and before the stall refusal, which counts them in this very run.

    + run: the :class:`~operations.run.Run`, whose observations the records name
    + init_system: the workstation's init system
    + ledger_path: the compatibility ledger, on this machine

    **Example:**

    .. code:: python

        guard.reported(name="Guard: what it did since the last run", run=run,
                       init_system="systemd", ledger_path="~/.local/state/twinbolt/ledger.jsonl")
    """
    events = moved_aside(run) if executing() else host.get_fact(
        GuardState, init_system=init_system)["events"]
    if not events:
        host.noop("the guard recorded nothing")
        return
    records, _ = ledger.read_all(Path(ledger_path))
    entries = [ledger_entry(event, run.observed.hosts[host.name]) for event in events]
    run.observed.guarded[host.name] = [entry for entry in entries
                                       if not recorded(entry, records)]
    for event in events:
        host.log_styled(f"the guard {summary(event)}",
                        fg="yellow", log_func=logger.warning)
    if executing():
        for entry in run.observed.guarded[host.name]:
            ledger.append(Path(ledger_path), entry)
        finished, output = run_now(shell_script(FINISH_MOVED, EVENTS, REPORTED))
        if not finished:
            host.log_styled(f"the guard's events are recorded, but could not move to {REPORTED} "
                            f"({output.stderr}): the next run reads them again, and records "
                            "them once", fg="yellow", log_func=logger.warning)
    host.noop(f"{len(events)} guard event(s) read")
    yield from ()


def moved_aside(run: Guarded) -> list[dict[str, Any]]:
    """
    The guard's events, renamed aside under this run's lock and read; refuse, with
    nothing recorded, where the run does not hold the lock or the rename fails.
    """
    if not run.locks.holds(host.name):
        refuse(Layer.LOCK, [f"the guard's events are read only under this run's lock, which it "
                            f"does not hold on {host.name}"])
    moved, output = run_now(shell_script(MOVE_ASIDE, EVENTS, f"{EVENTS}.{run.owner.token}"))
    if not moved:
        refuse(Layer.LEDGER, [f"the guard's events could not be moved aside to be read "
                              f"({output.stderr}); nothing was recorded"])
    return events_in(output.stdout_lines)
