"""
The field report's ladder, walked for the operator: from the user's route down
to the cable, every rung read and judged, read-only, in any state.

1. route: each gateway role answers, and which deployment answered;
2. serving: rank 0 (or the replicas and the router) serves a real completion;
   ``/server_info`` agrees with the state;
3. ranks: the servers' processes run, and their logs hold no NCCL error or timeout;
4. sockets: the TP group's connections run between the Thunderbolt addresses;
   each socket's retransmissions;
5. thunderbolt0: carrier, address, the peer answering across it, and the
   receiver errors that rose while the probes ran;
6. driver: which build is loaded, its parameters, the peer's E2E bit, the
   guard, and any stall it restored stock after;
7. xdomain: the link's rate x lanes, and the peer's name;
8. host: the GPU, the lock, signature enforcement.

Every rung is judged whatever the others say, so the printout is the whole
ladder. Failures above a failing rung are usually its symptoms (a stalled link
fails rank 0's completion too), so the cause named is the lowest failing rung,
the first boundary from the cable up that does not hold, with its fix.

The hosts are read twice, one SSH round trip per host each time, around the
bounded probes (the completions and the gateway's requests): the counters'
difference is the probe window's.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.hosts import remote
from harness.hosts.counters import RECEIVER_ERRORS, socket_deltas
from harness.hosts.status import Status, observe
from harness.hosts.topology import Gateway, Topology, Workstation
from operations.gateway import reading as gateway_reading
from operations.plumbing import probes
from operations.safety import reading as safety_reading
from operations.serving import reading as serving_reading
from operations.serving.sglang import server_info, server_info_problems
from operations.states import STATES, ServingMode, State
from operations.thunderbolt import driver_reading, link_reading

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
# Each probe is bounded: a hung rank must not hang the diagnosis.
PROBE_TOKENS = 8
PROBE_TIMEOUT_SECONDS = 10.0
LOG_LINES = 200
# What a rank's log says when the group is in trouble (since its last start).
TROUBLE = re.compile(r"NCCL WARN|NCCL error|[Tt]imed? ?out|watchdog|[Ee]xception|PeerLost|"
                     r"connection closed|[Tt]raceback")
FIXES = {
    "route": "converge the state again (pyinfra inventory.py deploy.py --data state=STATE); "
             "if the large role fails, its backend is down: docs/troubleshooting.md",
    "serving": "read both ranks' logs (rung 3); a hung or crashed group is repaired by "
               "converging production",
    "ranks": "read the log lines above; converge production, then the state again",
    "sockets": "pin every socket of the group to the link: docs/troubleshooting.md, "
               "'The TP group's traffic is not on thunderbolt0'",
    "thunderbolt0": "traffic does not cross the link: with the candidate a TX credit stall "
                    "(converge production; this controller pairing cannot run tx_e2e); "
                    "without an address, converge the state again",
    "driver": "converge the state again; with the candidate, the peer must advertise E2E "
              "(run the candidate on both workstations)",
    "xdomain": "re-seat the cable in both ports (a 10 Gb/s or single-lane link will not "
               "retrain by itself): docs/troubleshooting.md",
    "host": "free the GPU, or wait for the run that holds the lock to end",
}


@dataclass
class Rung:
    """One rung's verdict and the evidence it was judged on."""

    number: int
    name: str
    verdict: str = PASS
    evidence: list[str] = field(default_factory=list)

    def saw(self, text: str, verdict: str = PASS) -> None:
        """Record ``text``; a worse verdict than the rung's so far replaces it."""
        self.evidence.append(text if verdict == PASS else f"{verdict.upper()}: {text}")
        order = (PASS, SKIP, WARN, FAIL)
        if order.index(verdict) > order.index(self.verdict):
            self.verdict = verdict


@dataclass
class Diagnosis:
    """The ladder, the state it was judged against, and the cause: the lowest failing rung."""

    state: str
    observed: str
    rungs: list[Rung]
    seconds: float

    @property
    def cause(self) -> Rung | None:
        return next((rung for rung in reversed(self.rungs) if rung.verdict == FAIL), None)

    def render(self) -> str:
        lines = [f"diagnose: judged against {self.state} ({self.observed})"]
        for rung in self.rungs:
            lines.append(f"{rung.number} {rung.name:<13} {rung.verdict}")
            lines += [f"    {text}" for text in rung.evidence]
        cause = self.cause
        lines.append(f"cause: rung {cause.number} ({cause.name}) is the first boundary from the "
                     f"cable up that does not hold; fix: {FIXES[cause.name]}" if cause
                     else "cause: none; every rung holds")
        lines.append(f"diagnose: {self.seconds:.1f}s")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        cause = self.cause
        return {"state": self.state, "observed": self.observed, "seconds": self.seconds,
                "rungs": [asdict(rung) for rung in self.rungs],
                "cause": {"rung": cause.number, "name": cause.name, "fix": FIXES[cause.name]}
                if cause else None}


# Reading


def first_reading(entry: Workstation, state: State) -> list[remote.Query]:
    """
    Every layer's reading, the driver's and the serving layer's for a diagnosis:
    the peer's E2E bit, signature enforcement, the TP sockets and the link's
    counters before the probes, the GPUs, the lock, and the server ``state``
    runs here with its log.
    """
    settings = entry.settings
    return [*driver_reading.diagnosis(settings), *link_reading.reading(settings),
            *serving_reading.transport(settings), *serving_reading.gpus(),
            *safety_reading.lock(settings), *safety_reading.reading(settings),
            *serving_reading.ranks(settings, state.serving, LOG_LINES)]


def second_reading(entry: Workstation) -> list[remote.Query]:
    """After the probes: the counters and sockets again, the peer answering, the connections."""
    settings = entry.settings
    return [*serving_reading.transport(settings), *link_reading.answers(settings),
            *serving_reading.connections()]


def roles_reading(entry: Gateway) -> list[remote.Query]:
    """Each user's role, asked through the proxy within the probes' bounds."""
    return gateway_reading.roles(entry.settings, PROBE_TOKENS, PROBE_TIMEOUT_SECONDS)


async def server_probes(topology: Topology, state: State) -> dict[str, tuple[Any, Any]]:
    """Each server clients reach: a bounded completion, and rank 0's ``/server_info``."""
    model = topology.served_model_name
    urls = [entry.settings.server_url for entry in topology.workstations]
    if state.tensor_parallel:
        urls = [topology.rank0.settings.server_url]
    elif topology.gateway:
        urls.append(topology.gateway.settings.router_url)

    headers = topology.headers

    def probe(url: str) -> tuple[Any, Any]:
        answer = probes.chat_completion(url, model, PROBE_TOKENS, timeout=PROBE_TIMEOUT_SECONDS,
                                        headers=headers)
        info = (server_info(url, headers, timeout=PROBE_TIMEOUT_SECONDS)
                if state.tensor_parallel else None)
        return answer, info

    answers = await asyncio.gather(*(asyncio.to_thread(probe, url) for url in urls))
    return dict(zip(urls, answers, strict=True))


# Judging, rung by rung


def readable(rung: Rung, topology: Topology,
             *readings: dict[str, remote.Reading]) -> Iterator[tuple[Any, ...]]:
    """Each workstation and its readings; one that could not be read fails ``rung``."""
    for entry in topology.workstations:
        read = [reading[entry.name] for reading in readings]
        error = next((each.error for each in read if each.error), None)
        if error:
            rung.saw(f"{entry.name}: {error}", FAIL)
            continue
        yield entry, *read


def route_rung(gateway: remote.Reading | None, fallback: bool) -> Rung:
    """The user's roles, each served as ``fallback`` (small on large, or on its own) implies."""
    rung = Rung(1, "route")
    if gateway is None:
        rung.saw("the inventory has no gateway", FAIL)
        return rung
    if gateway.error:
        rung.saw(gateway.error, FAIL)
        return rung
    for judged in gateway_reading.judge_roles(gateway.values, fallback, PROBE_TOKENS):
        rung.saw(judged.observed["seen"])
        for problem in judged.problems:
            rung.saw(problem, FAIL)
    return rung


def serving_rung(answers: dict[str, tuple[Any, Any]], state: State, model: str,
                 tp_size: int) -> Rung:
    rung = Rung(2, "serving")
    for url, (answer, info) in answers.items():
        found = probes.completion_problems(answer, PROBE_TOKENS)
        if found:
            found += probes.green_health(url, PROBE_TIMEOUT_SECONDS)
            rung.saw(f"{url}: " + "; ".join(found), FAIL)
            continue
        rung.saw(f"{url}: {PROBE_TOKENS} tokens in {answer.seconds:.2f}s")
        if state.tensor_parallel:
            for problem in server_info_problems(info.body, tp_size, state.speculative, model):
                rung.saw(f"{url}: {problem}", FAIL)
    return rung


def since_start(lines: list[str]) -> list[str]:
    """The lines of a log since the server last started (SGLang's ``server_args=`` line)."""
    starts = [index for index, line in enumerate(lines) if "server_args=" in line]
    return lines[starts[-1]:] if starts else lines


def ranks_rung(topology: Topology, first: dict[str, remote.Reading]) -> Rung:
    rung = Rung(3, "ranks")
    for entry, reading in readable(rung, topology, first):
        for key, process in reading.values.items():
            if not key.startswith("process "):
                continue
            name = key.removeprefix("process ")
            if not process["running"]:
                rung.saw(f"{entry.name} {name}: not running ({process['status']})", FAIL)
                continue
            rung.saw(f"{entry.name} {name}: pid {process['pid']}, up "
                     f"{process['seconds'] or 0:.0f}s")
            trouble = [line for line in since_start(reading.values[f"log {name}"])
                       if TROUBLE.search(line)]
            for line in trouble[-3:]:
                rung.saw(f"{entry.name} {name} log: {line.strip()}", FAIL)
    return rung


def sockets_rung(topology: Topology, state: State, first: dict[str, remote.Reading],
                 second: dict[str, remote.Reading]) -> Rung:
    rung = Rung(4, "sockets")
    if not state.tensor_parallel:
        rung.saw(f"{state.name} runs no TP group", SKIP)
        return rung
    for entry, before, after in readable(rung, topology, first, second):
        settings = entry.settings
        process = serving_reading.process(settings, ServingMode.TENSOR_PARALLEL, before.values)
        judged = serving_reading.judge_connections(settings, process,
                                                   after.values["connections"])
        held = judged.observed["held"]
        for problem in judged.problems:
            rung.saw(f"{entry.name}: {problem}", FAIL)
        deltas = socket_deltas(before.values["sockets"], after.values["sockets"])
        rung.saw(f"{entry.name}: {len(held)} connection(s) of the rank; {deltas['count']} "
                 f"socket(s) to the peer retransmitted {deltas['retrans']} segment(s) during "
                 "the probes")
    return rung


def interface_rung(topology: Topology, state: State, first: dict[str, remote.Reading],
                   second: dict[str, remote.Reading]) -> Rung:
    rung = Rung(5, "thunderbolt0")
    for entry, before, after in readable(rung, topology, first, second):
        settings = entry.settings
        interface, address = settings.link.interface, settings.link_address
        judged = link_reading.judge_interface(settings, {**before.values,
                                                         "answers": after.values["answers"]})
        for problem in judged.problems:
            rung.saw(f"{entry.name}: {problem}", link_verdict(state))
        if not judged.observed["carrier"]:
            continue
        errors = (after.values["counters"].get(RECEIVER_ERRORS, 0)
                  - before.values["counters"].get(RECEIVER_ERRORS, 0))
        window = after.at - before.at
        text = (f"{entry.name}: {interface} up, {address}; {errors} receiver error(s) in "
                f"{window:.1f}s")
        if errors > 0:
            # The stock driver's corruption is what the candidate is for; under the
            # candidate, a receiver error means it is not doing its job.
            rung.saw(text, FAIL if state.driver.is_candidate else WARN)
        else:
            rung.saw(text)
    return rung


def driver_rung(topology: Topology, state: State, first: dict[str, remote.Reading]) -> Rung:
    rung = Rung(6, "driver")
    for entry, reading in readable(rung, topology, first):
        judged = driver_reading.judge(entry.settings, reading.values, state.driver)
        rung.saw(f"{entry.name}: {judged.observed['seen']}", FAIL if judged.problems else PASS)
        peer = driver_reading.judge_peer(reading.values, state.driver)
        verdict = PASS
        if peer.problems:
            # No peer at all is the link's trouble; a peer without E2E, the candidate's.
            verdict = FAIL if peer.observed["peer"] else link_verdict(state)
        rung.saw(f"{entry.name}: {peer.observed['seen']}", verdict)
        guard = safety_reading.judge(entry.settings, reading.values).observed
        if guard["armed"] != (state.driver.is_candidate):
            rung.saw(f"{entry.name}: the guard is {'' if guard['armed'] else 'not '}armed under "
                     f"the {state.driver} driver", WARN)
        # What the guard did while no run watched, until a run reads it.
        for event in guard["events"]:
            rung.saw(f"{entry.name}: the guard {event}", WARN)
    return rung


def link_verdict(state: State) -> str:
    """
    What a link that cannot carry the TP group is in ``state``: a failure where the
    state uses it, a warning in production, whose replicas lose nothing to it.
    """
    return FAIL if state.uses_link else WARN


def xdomain_rung(topology: Topology, state: State, first: dict[str, remote.Reading]) -> Rung:
    rung = Rung(7, "xdomain")
    for entry, reading in readable(rung, topology, first):
        xdomain = reading.values["xdomain"]
        if xdomain is None:
            rung.saw(f"{entry.name}: no XDomain peer is connected", link_verdict(state))
            continue
        judged = link_reading.judge_cable(entry.settings, reading.values)
        rate, lanes = judged.observed["rate"]
        link = entry.settings.link
        expected = (link.expected_rate_gbps, link.expected_lanes)
        text = (f"{entry.name}: {rate:g} Gb/s over {lanes} lane(s) to {xdomain['peer']} "
                f"(device {xdomain['device']}), expected {expected[0]:g} over {expected[1]}")
        rung.saw(text, link_verdict(state) if judged.problems else PASS)
        for problem in judged.problems:
            rung.saw(f"{entry.name}: {problem}", link_verdict(state))
    return rung


def host_rung(topology: Topology, first: dict[str, remote.Reading]) -> Rung:
    rung = Rung(8, "host")
    for entry, reading in readable(rung, topology, first):
        gpus = reading.values["gpus"]
        rung.saw(f"{entry.name}: " + (", ".join(f"GPU {gpu['index']} {gpu['name']}"
                                               for gpu in gpus) or "no GPU"),
                 PASS if gpus else FAIL)
        owner = reading.values["lock"]
        if owner is not None:
            rung.saw(f"{entry.name}: a run holds the lock: {owner.describe()}", WARN)
        rung.saw(f"{entry.name}: unsigned modules "
                 + (f"refused ({', '.join(reading.values['signatures'])})"
                    if reading.values["signatures"] else "load"))
    return rung


# The walk


def judged_against(status: Status) -> tuple[State, str]:
    """The declared state to judge by: the one matched, else the closest."""
    if status.match:
        return STATES[status.match], "matches"
    name, layers = status.closest()
    return STATES[name], f"drifted: closest; {', '.join(layers)} differ"


async def diagnose(topology: Topology) -> Diagnosis:
    """Walk every rung once, read-only, within bounded probes."""
    started = time.monotonic()
    status = await observe(topology)
    state, observed = judged_against(status)
    first = await remote.read_all({entry: first_reading(entry, state)
                                   for entry in topology.workstations},
                                  topology.ssh_config)
    gateway_queries = ({topology.gateway: roles_reading(topology.gateway)}
                       if topology.gateway else {})
    gateway, answers = await asyncio.gather(
        remote.read_all(gateway_queries, topology.ssh_config), server_probes(topology, state))
    second = await remote.read_all({entry: second_reading(entry)
                                    for entry in topology.workstations},
                                   topology.ssh_config)
    rungs = [
        # Small stays on its own deployment while other pairs' replicas serve it.
        route_rung(gateway.get(topology.gateway.name) if topology.gateway else None,
                   state.gateway_fallback and not status.fronted_elsewhere),
        serving_rung(answers, state, topology.served_model_name, topology.tp_size),
        ranks_rung(topology, first),
        sockets_rung(topology, state, first, second),
        interface_rung(topology, state, first, second),
        driver_rung(topology, state, first),
        xdomain_rung(topology, state, first),
        host_rung(topology, first),
    ]
    return Diagnosis(state.name, observed, rungs, time.monotonic() - started)
