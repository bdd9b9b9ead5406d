"""
Events in a soak: the cable pulled out and put back, a workstation asleep, at
given minutes, and what each did to the link, the driver and the traffic.

``experiment.py soak --events unplug@5,plug@6,suspend@10`` plays them on the
second workstation (rank 1) while the soak's traffic runs. Each event's outcome
goes into the soak's report and, for a plug and a suspend, into the
compatibility ledger (``hotplug`` and ``suspend`` records), which ``matrix``
shows per controller pairing: the coverage the field report says it lacked.

- whether the link came back, at what rate, and in how long;
- whether the candidate's ``tx_e2e`` was still set;
- the receiver errors before and after (the interface's own counters restart
  with a new ``thunderbolt0``) and the host's retransmissions across the event;
- how long until the state's endpoint (rank 0, so the TP group; or the
  router) served a request again.

Who does an event is the site's :class:`Hands`: in the lab, the lab's own
commands; on a site, unplugging is a person's job, which the soak asks for and
waits for with a bound, and a suspend is ``rtcwake`` with ``systemctl suspend``,
done only with ``--allow-suspend``.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from harness.hosts import counters, remote
from harness.hosts.topology import Topology
from harness.progress import say
from operations.serving.transport import RETRANSMISSIONS
from operations.site.hosts import REPO

KINDS = ("unplug", "plug", "suspend")
ITEM = re.compile(r"^(unplug|plug|suspend)@(\d+(?:\.\d+)?)$")
# How long the link may take to go or come back after the lab's or the hardware's event.
LINK_SECONDS = 60.0
# How long a person has to pull or push the cable when asked.
PERSON_SECONDS = 300.0
# How long after the link is back the endpoint may take to serve again.
RECOVERY_SECONDS = 120.0
POLL_SECONDS = 0.5


class EventFailed(Exception):
    """An event could not be done (a lab command failed, suspend not allowed)."""


@dataclass(frozen=True)
class Event:
    """One scheduled event: what, and how many minutes into the soak."""

    kind: str
    minute: float

    def __str__(self) -> str:
        return f"{self.kind}@{self.minute:g}"


def parse(text: str, minutes: float) -> list[Event]:
    """
    The events of ``--events``, in time order. The cable must be in between
    events and at the end: a plug needs an unplug before it, and nothing but a
    plug may follow an unplug.
    """
    events = []
    for item in (part.strip() for part in text.split(",")):
        found = ITEM.fullmatch(item)
        if not found:
            raise ValueError(f"--events: {item!r} is not KIND@MINUTE, KIND one of "
                             f"{', '.join(KINDS)} (for example unplug@5,plug@6,suspend@10)")
        event = Event(found[1], float(found[2]))
        if not 0 < event.minute < minutes:
            raise ValueError(f"--events: {event} is not inside the soak's {minutes:g} minute(s)")
        events.append(event)
    events.sort(key=lambda event: event.minute)
    out = False
    for event in events:
        if event.kind == "plug" and not out:
            raise ValueError(f"--events: {event} has no unplug before it")
        if event.kind != "plug" and out:
            raise ValueError(f"--events: {event} while the cable is out: plug it in first")
        out = event.kind == "unplug"
    if out:
        raise ValueError("--events: the cable is left out at the end: add a plug after "
                         f"{events[-1]}")
    return events


class Hands(Protocol):
    """Who does the events: the lab's commands, or a person and the host's own suspend."""

    bound: float

    async def unplug(self, host: str) -> None: ...

    async def plug(self, host: str) -> None: ...

    async def suspend(self, host: str, seconds: int) -> None: ...


class LabHands:
    """In the lab, each event is the lab's own command: it returns once it is done."""

    bound = LINK_SECONDS

    async def lab(self, *arguments: str) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lab", *arguments, cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await process.communicate()
        text = output.decode(errors="replace").strip()
        if process.returncode:
            raise EventFailed(f"python -m lab {' '.join(arguments)}: {text}")
        say(f"  {text}")

    async def unplug(self, host: str) -> None:
        await self.lab("unplug", host)

    async def plug(self, host: str) -> None:
        await self.lab("plug", host)

    async def suspend(self, host: str, seconds: int) -> None:
        await self.lab("suspend", host, "--seconds", str(seconds))


@dataclass
class SiteHands:
    """
    On a site a person moves the cable: asked, then waited for (:data:`PERSON_SECONDS`).
    A suspend is the host's own, with a wake alarm, and only when allowed.
    """

    topology: Topology
    allow_suspend: bool
    bound: float = PERSON_SECONDS

    async def unplug(self, host: str) -> None:
        say(f"soak: UNPLUG the Thunderbolt cable from {host} now "
            f"(waiting up to {self.bound:g}s for the link to go)")

    async def plug(self, host: str) -> None:
        say(f"soak: PLUG the Thunderbolt cable back into {host} now "
            f"(waiting up to {self.bound:g}s for the link to come back)")

    async def suspend(self, host: str, seconds: int) -> None:
        if not self.allow_suspend:
            raise EventFailed("a suspend needs --allow-suspend: it sleeps the workstation")
        entry = next(entry for entry in self.topology.workstations if entry.name == host)
        # The alarm first (-m no: set it, do not sleep), then the suspend, detached so
        # that the SSH command returns before the host sleeps.
        command = (f"rtcwake -m no -s {int(seconds)} >/dev/null && "
                   "{ (sleep 1; systemctl suspend) >/dev/null 2>&1 & }")
        ran = await remote.run(host, remote.remote_command(command, entry.sudo),
                               self.topology.ssh_config)
        if error := ran.error():
            raise EventFailed(f"{host}: suspend: {error}")
        await asyncio.sleep(seconds)


def hands_for(topology: Topology, allow_suspend: bool) -> Hands:
    """The lab's commands on the lab's hosts (its ``lab`` group), else a person's."""
    if all("lab" in entry.groups for entry in topology.workstations):
        return LabHands()
    return SiteHands(topology, allow_suspend)


def linked(snapshot: dict[str, counters.LinkSnapshot]) -> bool:
    """Both ends see the peer and have their ``thunderbolt0``."""
    return all(snap.error is None and snap.rx_rate_gbps is not None and snap.counters
               for snap in snapshot.values())


def unlinked(snapshot: dict[str, counters.LinkSnapshot]) -> bool:
    """No end that can be read sees the peer any more."""
    return all(snap.rx_rate_gbps is None for snap in snapshot.values() if snap.error is None)


async def until(topology: Topology, reached: Callable[[dict], bool], bound: float
                ) -> tuple[float | None, dict[str, counters.LinkSnapshot]]:
    """Seconds until the link is as ``reached`` wants (``None``: not within ``bound``)."""
    started = time.monotonic()
    while True:
        snapshot = await counters.snapshot(topology)
        if reached(snapshot):
            return time.monotonic() - started, snapshot
        if time.monotonic() - started > bound:
            return None, snapshot
        await asyncio.sleep(POLL_SECONDS)


def tx_e2e(snapshot: dict[str, counters.LinkSnapshot]) -> dict[str, str]:
    """Each workstation's ``tx_e2e`` parameter as loaded (``absent``: a stock build)."""
    return {name: snap.driver_parameters.get("tx_e2e", "absent")
            for name, snap in snapshot.items()}


def total(snapshot: dict[str, counters.LinkSnapshot], name: str) -> int | None:
    values = [snap.counters.get(name) for snap in snapshot.values()]
    return None if None in values else sum(values)


@dataclass
class Recovery:
    """When the soak's endpoint last served a request (monotonic seconds), set by its traffic."""

    last_served: float = 0.0


async def play(event: Event, host: str, hands: Hands, topology: Topology,
               served: Recovery, started: float, suspend_seconds: int,
               before: dict[str, counters.LinkSnapshot]) -> dict[str, Any]:
    """
    Do ``event`` and measure what it did against the link as it was ``before``
    (for a plug: before its unplug); the outcome the report and the ledger keep.
    """
    at = time.monotonic()
    outcome: dict[str, Any] = {"event": event.kind, "host": host,
                               "at_seconds": round(at - started, 1), "done": True}
    say(f"soak event {event}: {event.kind} {host}")
    try:
        if event.kind == "unplug":
            await hands.unplug(host)
        elif event.kind == "plug":
            await hands.plug(host)
        else:
            await hands.suspend(host, suspend_seconds)
    except EventFailed as error:
        return {**outcome, "done": False, "why": str(error)}
    if event.kind == "unplug":
        seconds, after = await until(topology, unlinked, hands.bound)
        outcome.update(link="gone" if seconds is not None else "still there",
                       link_seconds=_round(seconds))
        return outcome
    seconds, after = await until(topology, linked, hands.bound)
    back_at = time.monotonic()
    rates = {snap.rx_rate_gbps for snap in after.values()}
    # From the plug, or from the wake (the host's sleep is not the link's doing); the
    # lab's commands return only once the link is up, so it is counted from their start.
    asleep = suspend_seconds if event.kind == "suspend" else 0
    outcome.update(
        link="back" if seconds is not None else "not back",
        link_seconds=_round(back_at - at - asleep) if seconds is not None else None,
        rate_gbps=min(rates, key=lambda rate: rate or 0) if seconds is not None else None,
        tx_e2e=tx_e2e(after),
        # The module kept its parameter: loaded as it was, with tx_e2e as it was.
        tx_e2e_kept=tx_e2e(after) == tx_e2e(before),
        receiver_errors=[total(before, counters.RECEIVER_ERRORS),
                         total(after, counters.RECEIVER_ERRORS)],
        retransmissions=_difference(total(after, RETRANSMISSIONS),
                                    total(before, RETRANSMISSIONS)),
    )
    while served.last_served < back_at and time.monotonic() - back_at < RECOVERY_SECONDS:
        await asyncio.sleep(POLL_SECONDS)
    outcome["recovered_seconds"] = (_round(served.last_served - at)
                                    if served.last_served >= back_at else None)
    return outcome


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def _difference(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def problem(outcome: dict[str, Any]) -> str | None:
    """What about an event's outcome must stop the soak; ``None`` when it recovered."""
    if not outcome["done"]:
        return f"{outcome['event']} could not be done: {outcome['why']}"
    if outcome["event"] == "unplug":
        if outcome["link"] != "gone":
            return f"the link was still there {LINK_SECONDS:g}s after the unplug"
        return None
    if outcome["link"] != "back":
        return f"the link was not back after the {outcome['event']}"
    if outcome["recovered_seconds"] is None:
        return (f"no request was served in {RECOVERY_SECONDS:g}s after the link came back from "
                f"the {outcome['event']}")
    return None


def describe(outcome: dict[str, Any]) -> str:
    """One line: the link, its rate and time, ``tx_e2e``, the counters, the recovery."""
    head = f"{outcome['event']} {outcome['host']}"
    if not outcome["done"]:
        return f"{head}: not done ({outcome['why']})"
    if outcome["event"] == "unplug":
        return f"{head}: the link {outcome['link']} in {outcome['link_seconds']}s"
    tx_e2e = "/".join(outcome["tx_e2e"].values())
    errors = outcome["receiver_errors"]
    return (f"{head}: the link {outcome['link']} at {outcome['rate_gbps']} Gb/s in "
            f"{outcome['link_seconds']}s, tx_e2e {tx_e2e}, receiver errors {errors[0]} -> "
            f"{errors[1]}, {outcome['retransmissions']} retransmission(s), served again after "
            f"{outcome['recovered_seconds']}s")
