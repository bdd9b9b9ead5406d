"""
A bounded soak: steady traffic in the current state for N minutes, the link's
counters sampled every interval, and a watch on the candidate.

A short measurement window bounds a rare fault's rate; it cannot catch it. The
soak runs one request after another through the state's endpoint (rank 0, or
the router in production) and, every interval, reads both workstations' link
counters (:func:`harness.hosts.counters.snapshot`): the tokens served in the
interval, the TP sockets' and the host's retransmissions, and the receiver
errors. Under the candidate driver (``tx_e2e=1``) the first receiver error, or
an interval in which no request completes (a stall), ends the soak: production
is converged and verified with the operator's own commands, and the report says
when and why. Under the stock driver both are recorded, not acted on: receiver
errors are what the stock driver is known for.

With a :class:`Schedule`, the soak plays events while its traffic runs (the
cable pulled and put back, a workstation asleep: :mod:`harness.runs.events`); each
event's outcome goes into the report and the compatibility ledger.

The report is a JSON file and a PNG chart of the three series over time, the
events marked on it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.hosts import counters
from harness.hosts.status import guard_fired, guard_states
from harness.hosts.topology import Endpoint, Topology
from harness.progress import say
from harness.reporting import report
from harness.runs import campaign, events, matrix
from operations.plumbing import probes
from operations.states import State

FORMAT = "twinbolt-soak/1"
REQUEST_TOKENS = 32


@dataclass
class Traffic:
    """One request after another until stopped; completed tokens counted as they land."""

    endpoint: Endpoint
    timeout: float
    tokens: int = 0
    failures: list[str] = field(default_factory=list)
    # When a request last completed: an event's recovery is measured by it.
    served: events.Recovery = field(default_factory=events.Recovery)

    def take(self) -> tuple[int, list[str]]:
        """The tokens and failures since the last call."""
        taken, self.tokens = self.tokens, 0
        failed, self.failures = self.failures, []
        return taken, failed

    async def run(self, stop: asyncio.Event) -> None:
        body = probes.chat_body(self.endpoint.model, REQUEST_TOKENS)
        async with httpx.AsyncClient(timeout=self.timeout, headers=self.endpoint.headers) as client:
            while not stop.is_set():
                try:
                    response = await client.post(f"{self.endpoint.url}/v1/chat/completions",
                                                 json=body)
                    response.raise_for_status()
                    self.tokens += response.json()["usage"]["completion_tokens"]
                    self.served.last_served = time.monotonic()
                except (httpx.HTTPError, KeyError, ValueError) as error:
                    self.failures.append(f"{type(error).__name__}: {error}"[:200])
                    await asyncio.sleep(1.0)


def interval_sample(elapsed: float, seconds: float, tokens: int, failed: list[str],
                    deltas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One interval's figures, summed over the workstations."""
    totals = counters.window_totals(deltas)
    return {"at_seconds": round(elapsed, 1), "seconds": round(seconds, 2), "tokens": tokens,
            "tok_s": tokens / seconds if seconds else None, "failed_requests": len(failed),
            "failures": failed[:3], **totals}


def alarm(state: State, sample: dict[str, Any], disrupted: bool = False) -> str | None:
    """
    Why the candidate must go now: a receiver error, or a stall; ``None``
    otherwise. While an event has the cable out or a host asleep (``disrupted``),
    nothing can complete: that is the event's, judged when it ends.
    """
    if not state.driver.is_candidate:
        return None
    if sample["receiver_errors"]:
        return (f"{sample['receiver_errors']} receiver error(s) on thunderbolt0 under the "
                f"candidate, {sample['at_seconds']:.0f}s into the soak")
    if not sample["tokens"] and not disrupted:
        return (f"a stall: no request completed in {sample['seconds']:.0f}s, "
                f"{sample['at_seconds']:.0f}s into the soak"
                + (f" ({sample['failures'][0]})" if sample["failures"] else ""))
    return None


@dataclass
class Schedule:
    """The soak's events, played in time while the traffic runs, and what each did."""

    events: list[events.Event]
    hands: events.Hands | None = None
    suspend_seconds: int = 30
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    # The cable out or a host asleep: from the event until it has been judged.
    disrupted: bool = False
    problem: str | None = None

    async def run(self, topology: Topology, traffic: Traffic, started: float) -> None:
        # The events happen to rank 1: rank 0 is where the soak's requests go.
        host = topology.workstations[-1].name
        before: dict[str, counters.LinkSnapshot] = {}
        for event in self.events:
            await asyncio.sleep(max(0.0, started + event.minute * 60 - time.monotonic()))
            # A plug is judged against the link as it was before its unplug.
            if event.kind != "plug":
                before = await counters.snapshot(topology)
            self.disrupted = True
            outcome = await events.play(event, host, self.hands, topology, traffic.served,
                                        started, self.suspend_seconds, before)
            self.outcomes.append(outcome)
            say(f"soak event {event}: {events.describe(outcome)}")
            self.problem = events.problem(outcome)
            if self.problem:
                return
            self.disrupted = event.kind == "unplug"

    @property
    def cable_out(self) -> bool:
        """Whether the last event done pulled the cable, and nothing has put it back."""
        return bool(self.outcomes) and self.outcomes[-1]["event"] == "unplug"


async def soak(topology: Topology, state: State, minutes: float, interval: float,
               directory: Path, schedule: Schedule | None = None) -> dict[str, Any]:
    """
    Soak ``state`` (the hosts' observed one), playing ``schedule``'s events, and
    write the report into ``directory``.
    """
    schedule = schedule or Schedule([])
    traffic = Traffic(topology.endpoint(state), timeout=interval * 2)
    stop = asyncio.Event()
    runner = asyncio.create_task(traffic.run(stop))
    samples: list[dict[str, Any]] = []
    why = None
    started = time.monotonic()
    player = asyncio.create_task(schedule.run(topology, traffic, started))
    previous = await counters.snapshot(topology)
    try:
        while time.monotonic() - started < minutes * 60 and why is None:
            await asyncio.sleep(interval)
            current = await counters.snapshot(topology)
            deltas = {host: counters.delta(previous[host], current[host]) for host in current}
            seconds = max(delta["seconds"] for delta in deltas.values())
            sample = interval_sample(time.monotonic() - started, seconds, *traffic.take(),
                                     deltas)
            samples.append(sample)
            say(f"  soak {sample['at_seconds']:.0f}s: {sample['tok_s'] or 0:.1f} tok/s, "
                f"{sample['receiver_errors']} receiver error(s), "
                f"{sample['socket_retransmissions']} TP socket retransmission(s)")
            why = alarm(state, sample, schedule.disrupted) or schedule.problem
            previous = current
        if why is None and not player.done():
            # The soak's time is up: the event under way is let finish and judged.
            await player
            why = schedule.problem
    finally:
        stop.set()
        runner.cancel()
        player.cancel()
    result = {"format": FORMAT, "state": state.name, "minutes": minutes,
              "interval_seconds": interval, "samples": samples, "stopped": why,
              "restored": None, "guard": None, "events": schedule.outcomes,
              "ledger": await record_events(topology, state, schedule.outcomes)}
    if state.driver.is_candidate:
        # Read before any restore, which disarms it: did it stay armed and quiet?
        result["guard"] = guard_fired(await guard_states(topology)) or "armed, quiet"
    if schedule.cable_out:
        # Stopped between an unplug and its plug: the cable goes back in first.
        await schedule.hands.plug(topology.workstations[-1].name)
    if why:
        say(f"soak: {why}: converging production")
        result["restored"] = await restore(topology)
    report.write_text(directory / "soak.json", json.dumps(result, indent=1) + "\n")
    result["chart"] = str(chart(samples, state.name, why, directory / "soak.png",
                                tuple(schedule.outcomes)))
    return result


def recorded(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events the ledger records: each plug and suspend that was done."""
    return [outcome for outcome in outcomes if outcome["done"] and outcome["event"] != "unplug"]


async def record_events(topology: Topology, state: State,
                        outcomes: list[dict[str, Any]]) -> str | None:
    """A ledger record for each of the :func:`recorded` events; the ledger's path."""
    done = recorded(outcomes)
    if not done:
        return None
    return str(await matrix.record_events(topology, state, done, events.describe))


async def restore(topology: Topology) -> str:
    """Production converged and verified with the operator's commands; what happened."""
    try:
        await campaign.deploy("production", topology)
        await campaign.verify("production", topology)
    except campaign.StepFailed as error:
        return f"production was NOT restored: {error}"
    return "production was restored and verified"


def chart(samples: list[dict[str, Any]], state: str, why: str | None, path: Path,
          outcomes: tuple[dict[str, Any], ...] = ()) -> Path:
    """tok/s, retransmissions and receiver errors over time, one panel each, events marked."""
    import matplotlib

    # No display: the harness runs over SSH and in CI.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [sample["at_seconds"] for sample in samples]
    figure, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True, constrained_layout=True)
    panels = (("tok_s", "tok/s"), ("socket_retransmissions", "TP socket retransmissions"),
              ("receiver_errors", "receiver errors"))
    for axis, (key, title) in zip(axes, panels, strict=True):
        axis.plot(times, [sample[key] or 0 for sample in samples], marker="o")
        axis.set_title(title)
    axes[1].plot(times, [sample["retransmissions"] or 0 for sample in samples], marker="x",
                 label="host-wide RetransSegs")
    axes[1].legend()
    for outcome in outcomes:
        for axis in axes:
            axis.axvline(outcome["at_seconds"], color="grey", linestyle="--")
        axes[0].annotate(f"{outcome['event']} {outcome['host']}", (outcome["at_seconds"], 0),
                         rotation=90, fontsize=8, color="grey")
    axes[-1].set_xlabel("seconds into the soak")
    figure.suptitle(f"twinbolt soak: {state}" + (f" (stopped: {why})" if why else ""))
    with report.replaced(path) as temporary:
        figure.savefig(temporary, dpi=100, format="png")
    plt.close(figure)
    return path
