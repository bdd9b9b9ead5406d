"""
The campaign: a known-good control, the transport on its own, then one layer at
a time, then production restored and proven, then the comparison.

    preflight -> linktest production
              -> (deploy T -> verify T -> linktest T) for each transport state -> production
              -> trial 1: measure production -> (deploy X -> verify X -> measure X) for each step
              -> trial 2: the same states backwards, ... (N trials)
              -> deploy production -> verify production -> compare

The model states are measured in N trials, each one pass over the plan, in the
order ABBA: odd trials forward, even ones backward. Drift in the machine or the
link over the campaign then lands on every state alike, and every move is still
one layer (a trial starts where the one before ended, and measures that state
again without a deploy). It is the only order that keeps both: in a chain of
one-layer steps, a pass can only run forward or backward, so there is nothing
to draw at random and no seed.

The transport stage is the field report's "integrity before model speed": the
driver changes under production's replicas, which never use the link, so the
network-only window borrows no GPU and the user's route never falls back.

Every transition is the operator's own command (``pyinfra -y inventory.py
deploy.py --data state=X``), every proof of production the operator's own
``pytest tests/verify --state production``. A plan whose step changes two
layers is refused before anything runs (the field report's third lesson: a
difference with two causes explains nothing). Once the preflight has passed,
any failure, or an interruption, still ends with production restored and
verified, and the campaign report names the step that failed and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from statistics import fmean
from typing import Any

from harness.hosts.status import guard_fired, guard_states, observe
from harness.hosts.topology import Topology
from harness.judging import disturbance
from harness.measuring.windows import EndpointDown, WindowSettings, both_temperatures, levels
from harness.progress import placed, reporting, say
from harness.reporting import caveats, compare, linktest_report, report
from harness.runs import linktest
from harness.runs.measure import NotMeasurable, failures, measure_state
from operations.plumbing.probes import stopped_at_bound
from operations.site.hosts import REPO
from operations.states import State, UnknownState, layers_changed, resolve_state

FORMAT = "twinbolt-campaign/1"
BASELINE = "production"
TRIALS = 5
ORDER = ("ABBA: odd trials pass over the plan forward, even trials backward; a trial starts "
         "with the state the one before ended on, measured again without a deploy (the only "
         "order whose every move changes one layer: nothing is drawn, so there is no seed)")
PLAN = ("tp2_stock_nospec", "tp2_stock", "tp2_e2e", "tp2_e2e_nospec")
# From production and back, the driver alone changing at each step: the
# candidate, then the report's control, the stock build with receive-side E2E off.
TRANSPORT = ("production_tx_e2e", "production_e2e_off", BASELINE)
TAIL_LINES = 40
REASON_LINES = 12
HEARTBEAT_SECONDS = 15.0
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class CampaignRefused(ValueError):
    """A plan that cannot be run as asked; refused before any host is touched."""


class StepFailed(RuntimeError):
    """A step of the campaign failed; the message is the evidence."""


def check_plan(steps: Sequence[str], baseline: bool = True) -> list[State]:
    """
    The campaign's states, production first; :class:`CampaignRefused` if a step
    changes no layer, or if a step between two measured states changes more
    than one. Without the ``baseline`` production is not measured, so the move
    from it to the first state is no comparison and may change several layers.
    """
    try:
        states = [resolve_state(name) for name in (BASELINE, *steps)]
    except UnknownState as error:
        raise CampaignRefused(str(error)) from None
    for index, (before, after) in enumerate(pairwise(states)):
        layers = layers_changed(before, after)
        if len(layers) > 1 and (baseline or index > 0):
            raise CampaignRefused(
                f"the step {before.name} -> {after.name} changes {' and '.join(layers)}: a "
                "campaign changes one layer per step, so that each difference has one cause")
        if not layers:
            raise CampaignRefused(f"the step {before.name} -> {after.name} changes nothing")
    return states


@dataclass
class Step:
    """One step as the campaign report records it."""

    name: str
    ok: bool
    seconds: float
    detail: str = ""

    @property
    def measuring(self) -> bool:
        """Whether the step measured (a window or a linktest), rather than converged or proved."""
        return self.name.startswith(("measure ", "linktest "))


def order(plan: list[State], trials: int, baseline: bool = True) -> list[tuple[int, State]]:
    """
    The (trial, state) visits of the model stage, in ``ORDER``; production is
    among the states only with the ``baseline``.
    """
    measured = plan if baseline else plan[1:]
    return [(trial, state) for trial in range(1, trials + 1)
            for state in (measured if trial % 2 else measured[::-1])]


def time_left(seconds_per_visit: list[float], remaining: int) -> str:
    """The model stage's time left, at the pace of the visits so far."""
    if not seconds_per_visit:
        return "time left unknown until a state is measured"
    left = round(fmean(seconds_per_visit) * remaining)
    return f"about {left // 60} min {left % 60} s left"


def time_spent(steps: list[Step]) -> dict[str, float | None]:
    """The campaign's seconds measuring, and converging and proving, and measuring's share."""
    measuring = sum(step.seconds for step in steps if step.measuring)
    converging = sum(step.seconds for step in steps if not step.measuring)
    total = measuring + converging
    return {"measuring_seconds": round(measuring, 1),
            "converging_and_proving_seconds": round(converging, 1),
            "measuring_share": round(measuring / total, 3) if total else None}


async def run_command(label: str, argv: list[str],
                      timeout: float | None = None) -> tuple[int, list[str]]:
    """
    Run one of the operator's commands from the repository, its output shown as
    it comes, with a heartbeat when it is quiet; returns its exit code and the
    last lines of its output.

    Past ``timeout`` seconds it is killed and the step fails
    (:class:`StepFailed`) with what was stopped, after how long, what to check
    and its last lines. It runs in a process group of its own, and the whole
    group is stopped, so that a deploy's rollback, a process of that deploy's,
    never outlives it to race the campaign's own restore.
    """
    say(f"  $ {' '.join(argv)}")
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=REPO, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, process_group=0)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    try:
        async with (asyncio.timeout(timeout),
                    reporting(lambda elapsed: f"  [{label}] running for {elapsed:.0f}s",
                              HEARTBEAT_SECONDS)):
            async for raw in process.stdout:
                line = ANSI_ESCAPE.sub("", raw.decode(errors="replace").rstrip())
                say(f"    | {line}")
                tail.append(line)
            return await process.wait(), list(tail)
    except TimeoutError:
        await stop_group(process, signal.SIGKILL)
        raise StepFailed(stopped_at_bound(
            f"`{' '.join(argv)}`", timeout,
            "that every host answers over SSH (a host lost mid-run); its last lines say "
            "where it was:\n") + last_lines(list(tail))) from None
    finally:
        if process.returncode is None:
            # Interrupted: the group, as the operator's Ctrl-C would have reached it.
            await stop_group(process, signal.SIGTERM)


async def stop_group(process: asyncio.subprocess.Process, stop: signal.Signals) -> None:
    """Send ``stop`` to ``process`` and every process it started, and wait for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, stop)
    await process.wait()


def last_lines(tail: list[str]) -> str:
    """A command's last meaningful lines, its evidence."""
    return "\n".join([line for line in tail if line.strip()][-REASON_LINES:])


def reason(code: int, tail: list[str]) -> str:
    """A failed command's evidence: its exit code and its last meaningful lines."""
    return f"exit code {code}:\n" + last_lines(tail)


async def deploy(state: str, topology: Topology) -> str:
    """
    Converge ``topology``'s pair to ``state`` with the operator's own command,
    within its bound (:meth:`Topology.deploy_timeout`), or fail with why.
    """
    code, tail = await run_command(
        f"deploy {state}",
        [str(Path(sys.executable).with_name("pyinfra")), "-y", *topology.deploy_options,
         "inventory.py", "deploy.py", "--data", f"state={state}"], topology.deploy_timeout)
    if code != 0:
        raise StepFailed(reason(code, tail))
    return f"pyinfra converged to {state}"


async def verify(state: str, topology: Topology) -> str:
    """
    Prove ``topology``'s pair in ``state`` with ``pytest tests/verify``, within
    its bound (:meth:`Topology.verify_timeout`), or fail with why.
    """
    code, tail = await run_command(
        f"verify {state}",
        [sys.executable, "-m", "pytest", "tests/verify", "--state", state,
         *topology.verify_options, "-q", "-p", "no:cacheprovider"], topology.verify_timeout)
    if code != 0:
        raise StepFailed(reason(code, tail))
    return next((line for line in reversed(tail) if "passed" in line), "passed")


class Campaign:
    """
    One campaign over ``plan`` (production first). The steps are methods, so
    that the order, the refusals and the restore can be tested without hosts.
    """

    def __init__(self, topology: Topology, plan: list[State], windows: list[str],
                 settings: WindowSettings, directory: Path, baseline: bool = True,
                 linktest_seconds: int | None = linktest.FLOW_SECONDS,
                 trials: int = TRIALS) -> None:
        self.topology = topology
        self.plan = plan
        self.baseline = baseline
        self.trials = trials
        self.visits = order(plan, trials, baseline)
        # None: no transport stage.
        self.linktest_seconds = linktest_seconds
        self.linktests: list[Path] = []
        # A prefill window named is planned cold and warm, each in a column of its own;
        # the sweep, one window per level.
        self.windows = levels(both_temperatures(windows), settings.concurrency)
        self.settings = settings
        self.directory = directory
        self.steps: list[Step] = []
        self.reports: list[Path] = []
        # (trial, state, report) of each measurement, in the order measured.
        self.measured: list[dict[str, Any]] = []
        self.failure: Step | None = None

    # The steps

    async def preflight(self) -> str:
        """
        Read-only: the hosts are in production and production passes its checks;
        and whether this machine was quiet meanwhile, said before any window is.
        """
        used_before, started = disturbance.machine_cpu_seconds(), time.monotonic()
        status = await observe(self.topology)
        if status.match != BASELINE:
            raise StepFailed(f"the hosts are not in {BASELINE}: {status.verdict()}")
        verified = (await self.verify(BASELINE)) + "; hosts observed in production"
        busy = disturbance.machine_busy(disturbance.machine_cpu_seconds() - used_before,
                                        time.monotonic() - started)
        if busy:
            say(f"campaign: {busy}")
            return f"{verified}; {busy}"
        return verified

    async def deploy(self, state: str) -> str:
        return await deploy(state, self.topology)

    async def verify(self, state: str) -> str:
        return await verify(state, self.topology)

    async def measure(self, state: str, trial: int) -> str:
        """One trial of ``state``: its report in the trial's own directory."""
        try:
            path, built = await measure_state(self.topology, self.windows, self.settings,
                                              self.directory / f"trial-{trial}", expected=state)
        except (NotMeasurable, EndpointDown) as error:
            raise StepFailed(str(error)) from None
        self.reports.append(path)
        self.measured.append({"trial": trial, "state": state,
                              "report": str(path.relative_to(self.directory))})
        failed = failures(built)
        if failed:
            raise StepFailed(f"{len(failed)} request(s) failed: " + "; ".join(failed[:5]))
        if resolve_state(state).driver.is_candidate:
            # A healthy candidate state must not have made the guard fire while measured.
            fired = guard_fired(await guard_states(self.topology))
            if fired:
                raise StepFailed("the guard did not stay quietly armed while "
                                 f"{state} was measured: " + "; ".join(fired))
            return f"{path.name}{disturbed(built)}; the guard stayed armed, quiet"
        return path.name + disturbed(built)

    async def linktest(self, state: str, seconds: int) -> str:
        try:
            built = await linktest.linktest(self.topology, seconds)
        except linktest.NotTestable as error:
            raise StepFailed(str(error)) from None
        if built["state"] != state:
            raise StepFailed(f"the linktest observed the hosts in {built['state']}, not {state}")
        path = linktest_report.write(built, self.directory)
        self.linktests.append(path)
        headline = linktest_report.headline(built)
        return (f"{path.name}: {report.number(headline['gbit_s_4_flows'], 2)} Gbit/s "
                f"with 4 flows, {headline['receiver_errors']} receiver error(s)")

    async def transport(self, seconds: int) -> None:
        """The network-only A/B, from production and back, one driver change a step."""
        await self.step(f"linktest {BASELINE}", self.linktest(BASELINE, seconds))
        for previous, state in pairwise(check_plan(TRANSPORT, baseline=True)):
            layers = ", ".join(layers_changed(previous, state))
            await self.step(f"deploy {state.name} (changes {layers})", self.deploy(state.name))
            await self.step(f"verify {state.name}", self.verify(state.name))
            if state.name != BASELINE:
                await self.step(f"linktest {state.name}", self.linktest(state.name, seconds))

    async def model_states(self) -> None:
        """Every visit of :func:`order`, deploying and verifying only where the state changes."""
        current = self.plan[0]
        paces: list[float] = []
        for index, (trial, state) in enumerate(self.visits):
            started = time.monotonic()
            if state.name != current.name:
                layers = ", ".join(layers_changed(current, state))
                await self.step(f"deploy {state.name} (changes {layers})",
                                self.deploy(state.name))
                await self.step(f"verify {state.name}", self.verify(state.name))
                current = state
            place = f"trial {trial} of {self.trials}, {state.name}"
            left = time_left(paces, len(self.visits) - index)
            say(f"== {place}: {left}")
            with placed(place, left):
                await self.step(f"measure {state.name} (trial {trial} of {self.trials})",
                                self.measure(state.name, trial))
            paces.append(time.monotonic() - started)

    # The order

    async def step(self, name: str, action: Awaitable[str]) -> None:
        index = len(self.steps) + 1
        say(f"== step {index}: {name}")
        started = time.monotonic()
        try:
            detail = await action
        except StepFailed as error:
            self.steps.append(Step(name, False, time.monotonic() - started, str(error)))
            say(f"== step {index}: {name}: FAILED after {time.monotonic() - started:.0f}s\n"
                f"{error}")
            raise
        self.steps.append(Step(name, True, time.monotonic() - started, detail))
        say(f"== step {index}: {name}: ok ({time.monotonic() - started:.0f}s) {detail}")

    async def run(self) -> dict[str, Any]:
        """Run the campaign; returns its report (also written to ``directory``)."""
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        try:
            await self.step("preflight", self.preflight())
        except StepFailed:
            self.failure = self.steps[-1]
            # Nothing has changed yet: there is nothing to restore.
            return self.finish(started_at, restored=None)
        try:
            if self.linktest_seconds is not None:
                await self.transport(self.linktest_seconds)
            await self.model_states()
        except StepFailed:
            self.failure = self.steps[-1]
        except asyncio.CancelledError:
            # Interrupted (Ctrl-C): the hosts may be anywhere; restore them anyway.
            asyncio.current_task().uncancel()
            self.failure = Step("interrupted", False, 0.0, "the campaign was interrupted")
            self.steps.append(self.failure)
        restored = True
        try:
            await self.step(f"restore {BASELINE}", self.deploy(BASELINE))
            await self.step(f"verify {BASELINE}", self.verify(BASELINE))
        except StepFailed:
            restored = False
            self.failure = self.failure or self.steps[-1]
        return self.finish(started_at, restored)

    # The report

    def finish(self, started_at: str, restored: bool | None) -> dict[str, Any]:
        self.directory.mkdir(parents=True, exist_ok=True)
        measured = [report.load(path) for path in self.reports]
        links = [json.loads(path.read_text()) for path in self.linktests]
        table = compare.comparison(measured) if measured else ""
        chart = compare.chart(measured, self.directory / "comparison.png") if measured else None
        links_chart = (linktest_report.transport_chart(links, self.directory / "transport.png")
                       if links else None)
        result = {
            "format": FORMAT,
            "started_at": started_at,
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "plan": [state.name for state in self.plan],
            "trials": self.trials,
            "order": ORDER,
            "visits": [[trial, state.name] for trial, state in self.visits],
            "measured": self.measured,
            "time": time_spent(self.steps),
            "windows": self.windows,
            "settings": self.settings.model_dump(mode="json"),
            "steps": [asdict(step) for step in self.steps],
            "failed_step": self.failure.name if self.failure else None,
            "failure": self.failure.detail if self.failure else None,
            "restored": restored,
            "reports": [path.name for path in self.reports],
            "linktests": [path.name for path in self.linktests],
            "transport": transport_tables(links) if links else "",
            "transport_chart": links_chart.name if links_chart else None,
            "comparison": table,
            "chart": chart.name if chart else None,
            "does_not_prove": caveats.does_not_prove(measured, links) if measured else [],
            "quiet": disturbance.quiet_line([window for measurement in measured
                                             for window in measurement["windows"]]),
        }
        report.write_text(self.directory / "campaign.json", json.dumps(result, indent=1) + "\n")
        report.write_text(self.directory / "campaign.md", markdown(result))
        return result


def disturbed(built: dict[str, Any]) -> str:
    """A measurement's disturbed windows, for its step's line; nothing when there were none."""
    names = [window["name"] for window in built["windows"] if window.get("disturbed")]
    return f"; disturbed, left out: {', '.join(names)}" if names else ""


def transport_tables(links: list[dict[str, Any]]) -> str:
    """The linktests side by side, then each beside the field report's figures for its driver."""
    parts = [linktest_report.comparison(links)]
    for built in links:
        parts += [f"#### {built['state']} beside the field report", "",
                  "\n".join(linktest_report.beside_the_field(built)), ""]
    return "\n".join(parts)


def outcome(result: dict[str, Any]) -> str:
    if result["failed_step"] is None:
        return "completed; production restored and verified"
    restored = {None: "nothing was changed", True: "production restored and verified",
                False: "PRODUCTION WAS NOT RESTORED"}[result["restored"]]
    return f"failed at step '{result['failed_step']}'; {restored}"


def markdown(result: dict[str, Any]) -> str:
    spent = result["time"]
    lines = [
        "# twinbolt campaign",
        "",
        f"- {result['started_at']} to {result['finished_at']}: {outcome(result)}",
        f"- {result['quiet']}",
        f"- plan: {' -> '.join(result['plan'])}, windows {', '.join(result['windows'])}",
        f"- {result['trials']} trial(s), in the order {result['order']}: "
        + ", ".join(f"{state} ({trial})" for trial, state in result["visits"]),
        f"- time: {spent['measuring_seconds']:.0f} s measuring, "
        f"{spent['converging_and_proving_seconds']:.0f} s converging and proving"
        + (f" ({spent['measuring_share']:.0%} measuring)"
           if spent["measuring_share"] is not None else ""),
    ]
    if result["failure"]:
        lines += ["", "## Why it failed", "", "```", result["failure"], "```"]
    lines += ["", "## Steps", ""]
    lines += report.table(
        ["step", "result", "seconds", "detail"],
        [[step["name"], "ok" if step["ok"] else "FAILED", f"{step['seconds']:.0f}",
          step["detail"].splitlines()[0] if step["detail"] else ""]
         for step in result["steps"]])
    if result["transport"]:
        lines += ["", "## Transport: the link alone, under production's replicas", "",
                  result["transport"]]
        if result.get("transport_chart"):
            lines += [f"![transport]({result['transport_chart']})"]
    if result["comparison"]:
        lines += ["", "## Comparison", "", result["comparison"]]
    if result["chart"]:
        lines += [f"![comparison]({result['chart']})"]
    if result["does_not_prove"]:
        lines += ["", "## What this does not prove", ""]
        lines += [f"- {bullet}" for bullet in result["does_not_prove"]]
    return "\n".join(lines) + "\n"
