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
- It watches what the link does: the peer answers a ping across the
  interface. A link with carrier that carries nothing for
  ``candidate.guard_stall_seconds`` (a site key) is a stall; one without
  carrier (the cable out, the peer asleep, a retraining) is not. On a stall
  it does only what is local and safe: it stops this host's TP rank, loads
  the stock driver and appends the event, with its evidence, to
  :data:`EVENTS` (persistent: it outlives the reboot it may precede). It
  touches neither the gateway nor the other host: the fallback present in
  every TP state keeps ``small`` answering.
- The next run reads the events (:func:`reported`): it names them, and the
  compatibility ledger records each as a stall of the candidate on that
  controller, so the next candidate run on it is refused. ``status`` shows
  whether the guard is armed and any event no run has read yet.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.util import get_template
from pyinfra.operations import files

from operations import ledger
from operations.attempt import Layer, operation
from operations.driver import staged_path
from operations.facts import EmptyMeansSomething, FileDigest, digest
from operations.phase import executing, run_now
from operations.services import SUPERVISORS, TEMPLATES, InitSystem, Service
from operations.serving import TP_RANKS

if TYPE_CHECKING:
    from operations.run import Run
    from operations.settings import WorkstationSettings

LAYER = Layer.DRIVER
NAME = "twinbolt-guard"
TEMPLATE = TEMPLATES / "guard.sh.j2"
SCRIPT_MODE = "700"
# Where the guard records what it did, for the next run: persistent, on the workstation.
EVENTS = "/var/lib/twinbolt/guard-events.jsonl"
# The events a run has read, kept for the operator.
REPORTED = "/var/lib/twinbolt/guard-events.reported.jsonl"
# Read events move aside in one step: the guard of a later stall appends anew.
MOVE_REPORTED = f"cat {EVENTS} >> {REPORTED} && rm -f {EVENTS}"
# How often it pings the peer.
INTERVAL_SECONDS = 2


@dataclass(frozen=True)
class Guard:
    """
    What one workstation's guard watches and what it restores: the link towards
    the peer, the stall bound, the module, and the TP rank it stops.
    """

    interface: str
    peer_address: str
    stall_seconds: int
    module: str
    rank_service: str
    init_system: InitSystem
    run_dir: str
    staged_candidate: str
    events_path: str = EVENTS

    @classmethod
    def of(cls, settings: WorkstationSettings) -> Guard:
        candidate = settings.candidate_module
        return cls(
            interface=settings.link.interface, peer_address=settings.peer_link_address,
            stall_seconds=settings.candidate.guard_stall_seconds, module=candidate.name,
            rank_service=TP_RANKS[settings.rank], init_system=settings.serving.init_system,
            run_dir=settings.run_dir, staged_candidate=staged_path(settings.run_dir, candidate),
        )

    @property
    def script_path(self) -> str:
        return f"{self.run_dir}/guard.sh"

    def script(self) -> str:
        """The guard's script, rendered locally, each value quoted for the shell."""
        return get_template(str(TEMPLATE)).render(
            sh=shlex.quote, script_path=self.script_path, interface=self.interface,
            peer_address=self.peer_address, stall_seconds=int(self.stall_seconds),
            interval_seconds=INTERVAL_SECONDS, module=self.module,
            rank_service=self.rank_service, staged_path=self.staged_candidate,
            events_path=self.events_path, stop_service=SUPERVISORS[self.init_system].stop_script(),
        )

    def service(self) -> Service:
        return Service(name=NAME, description="twinbolt guard: the candidate thunderbolt_net "
                       f"is replaced by the stock driver after a {self.stall_seconds} s stall",
                       command=["/bin/sh", self.script_path])


# Facts


class GuardState(EmptyMeansSomething):
    """
    Whether the guard runs on this host, and the events it recorded that no run
    has read yet.

    .. code:: python

        {"armed": True, "events": [{"time": 1764900000, "stalled_seconds": 30, ...}]}
    """

    def command(self, init_system: InitSystem) -> StringCommand:
        script = (SUPERVISORS[init_system].transient_active_script()
                  + f"sed 's/^/event /' {EVENTS} 2>/dev/null; true")
        return StringCommand("sh", "-c", QuoteString(script), "-", NAME)

    def process(self, output: list[str]) -> dict[str, Any]:
        state: dict[str, Any] = {"armed": False, "events": []}
        for line in output:
            if line.strip() == "active":
                state["armed"] = True
            elif line.startswith("event "):
                state["events"].append(event_of(line.removeprefix("event ")))
        return state


def event_of(line: str) -> dict[str, Any]:
    """One recorded event; a line the guard did not finish is kept as its text."""
    try:
        event = json.loads(line)
    except ValueError:
        return {"unreadable": line.strip()}
    return event if isinstance(event, dict) else {"unreadable": line.strip()}


def describe_event(event: dict[str, Any]) -> str:
    """One line an operator reads: when, how long, what the counters did, what it restored."""
    if "unreadable" in event:
        return f"an unfinished record: {event['unreadable']}"
    errors = event.get("rx_errors") or [0, 0]
    when = _time(event.get("time"))
    restored = ("the stock driver loaded" if event.get("stock_loaded")
                else "the stock driver did NOT load")
    rank = "TP rank stopped" if event.get("rank_stopped") else "TP rank not stopped"
    return (f"{when}: the peer {event.get('peer')} did not answer for "
            f"{event.get('stalled_seconds')} s with tx_e2e={event.get('tx_e2e')} "
            f"({event.get('tx_bytes')} bytes sent, {event.get('rx_bytes')} received, "
            f"rx_errors {errors[0]} -> {errors[-1]}): {rank}, {restored}")


def _time(seconds: Any) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(float(seconds)))
    except (TypeError, ValueError):
        return "at an unknown time"


def ledger_entry(event: dict[str, Any], observed: dict[str, Any]) -> dict[str, Any]:
    """The ledger's record of one event: a stall of the candidate on this host's controller."""
    return ledger.record("guard", "candidate", "guarded", [observed], layer=Layer.LINK,
                         evidence=f"the guard on {observed['host']}: {describe_event(event)}")


# Operations


@operation(LAYER)
def armed(guard: Guard, present: bool = True) -> Iterator[PyinfraCommand]:
    """
    Arm the guard while the candidate is loaded, or disarm it.

    Armed, its script is in the run directory and its transient service runs;
    a changed script restarts it. Disarmed, it is stopped and its script gone.
    Disarm it before a stock build is loaded: the guard and the run must never
    swap the driver at once.

    + guard: what this workstation's guard watches (:class:`Guard`)
    + present: armed, or not

    **Example:**

    .. code:: python

        guard.armed(name="Guard: armed while the candidate is loaded",
                    guard=Guard.of(settings))
    """
    supervisor = SUPERVISORS[guard.init_system]
    running = host.get_fact(GuardState, init_system=guard.init_system)["armed"]
    if not present:
        if running:
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


@operation(Layer.LEDGER, is_idempotent=True)
def reported(run: Run, init_system: InitSystem, ledger_path: str) -> Iterator[PyinfraCommand]:
    """
    Read what the guard did since the last run: name each event, and have the
    ledger record it as a stall of the candidate on this host's controller.

    Each event is read once: when the run executes, the events move to
    :data:`REPORTED` and their records are appended to the ledger. That is
    bookkeeping about the hosts, not their state: reported as no change, and
    left alone by ``--dry``. Call it after ``ledger.observed``, whose reading of
    the controller the records name, and before the stall refusal, which counts
    them in this very run.

    + run: the :class:`~operations.run.Run`, whose observations the records name
    + init_system: the workstation's init system
    + ledger_path: the compatibility ledger, on this machine

    **Example:**

    .. code:: python

        guard.reported(name="Guard: what it did since the last run", run=run,
                       init_system="systemd", ledger_path="~/.local/state/twinbolt/ledger.jsonl")
    """
    events = host.get_fact(GuardState, init_system=init_system)["events"]
    if not events:
        host.noop("the guard recorded nothing")
        return
    entries = [ledger_entry(event, run.observed.hosts[host.name]) for event in events]
    run.observed.guarded[host.name] = entries
    for event in events:
        host.log_styled(f"the guard restored the stock driver here: {describe_event(event)}",
                        fg="yellow", log_func=logger.warning)
    if executing():
        for entry in entries:
            ledger.append(Path(ledger_path), entry)
        run_now(StringCommand("sh", "-c", QuoteString(MOVE_REPORTED)))
    host.noop(f"{len(events)} guard event(s) read")
    yield from ()
