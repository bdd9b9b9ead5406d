"""
The network-only window: the transport tested on its own, no model, no GPU.

The field report found its answer here before it measured a model ("integrity
before model speed"): TCP flows across the link in each direction, one, two and
four at once; 100 low-rate probes each way; probes while four flows load the
link; and beside each of them the receiver errors and retransmissions of the
same window. It needs only the link, so it runs in whatever state the hosts
are in, production included, whose replicas never use the link.

The flows are real ``iperf3`` (Debian's package), the probes real ``ping``, each
run on the workstations over SSH, bound to the link's addresses, and bounded in
time on both sides; the counters are the measurement's own
(:mod:`harness.hosts.counters`), read before and after each run.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import statistics
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from harness.hosts import counters, remote
from harness.hosts.status import observe
from harness.hosts.topology import Topology
from harness.progress import say
from harness.reporting.linktest_report import FLOW_COUNTS, FORMAT
from harness.reporting.report import number
from operations.serving.transport import AVAILABLE_CONGESTION_CONTROL, UBUNTU_CONGESTION_CONTROL
from operations.site.settings import WorkstationSettings

T = TypeVar("T")

# A short default: the report's runs were longer; --seconds makes them so
# (whole seconds: iperf3 reads --time as an integer).
FLOW_SECONDS = 3
PROBES = 100
# Low-rate: 50 probes a second, well above ping's 2 ms floor for a user.
PROBE_INTERVAL_SECONDS = 0.02
IPERF3_PORT = 5201
# The client asks this often, this many times, for the server to listen.
SERVER_WAITS, SERVER_WAIT_SECONDS = 20, 0.25
# How long a remote command may outlive its own bound (SSH, process start).
GRACE_SECONDS = 20.0
# Delivered below this share of the trained rate: "link up but capped".
CAPPED_SHARE = 0.5
INSTALL_FIX = ("install Debian's iperf3 on the workstations (apt install iperf3), or converge "
               "any state: pyinfra inventory.py deploy.py --data state=production")
REPLY_TIME = re.compile(r"time=([0-9.]+) ms")
SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")


class NotTestable(RuntimeError):
    """The link cannot be tested now; the message says why, and what to do."""


@dataclass(frozen=True)
class Direction:
    """One direction across the cable: from ``sender``'s link address to ``receiver``'s."""

    sender: WorkstationSettings
    receiver: WorkstationSettings

    @property
    def name(self) -> str:
        return f"{self.sender.name}->{self.receiver.name}"


def directions(topology: Topology) -> list[Direction]:
    """Each workstation sending to its peer across the cable: both directions."""
    workstations = [entry.settings for entry in topology.workstations]
    by_address = {settings.link_address: settings for settings in workstations}
    return [Direction(settings, by_address[settings.peer_link_address])
            for settings in workstations]


@dataclass(frozen=True)
class FlowRun:
    """What ``iperf3 -J`` says of one run: received rate, the sender's retransmits, bytes."""

    flows: int
    gbit_s: float
    retransmits: int
    bytes: int
    seconds: float
    # The congestion control the sender's flows ran, as iperf3 reports it.
    congestion: str | None = None

    @classmethod
    def from_iperf3(cls, flows: int, report: dict[str, Any]) -> FlowRun:
        end = report["end"]
        received, sent = end["sum_received"], end["sum_sent"]
        return cls(flows, received["bits_per_second"] / 1e9, sent.get("retransmits", 0),
                   received["bytes"], received["seconds"], end.get("sender_tcp_congestion"))


@dataclass(frozen=True)
class Probes:
    """What ``ping`` saw: probes sent, replies, and each reply's round trip."""

    sent: int
    received: int
    rtts_ms: tuple[float, ...]

    @classmethod
    def from_ping(cls, output: str) -> Probes:
        summary = SUMMARY.search(output)
        if summary is None:
            raise ValueError(f"ping printed no summary: {output.strip()[-200:]!r}")
        return cls(int(summary[1]), int(summary[2]),
                   tuple(float(rtt) for rtt in REPLY_TIME.findall(output)))

    @property
    def loss(self) -> float:
        return 1 - self.received / self.sent if self.sent else 1.0

    @property
    def mean_ms(self) -> float | None:
        return statistics.fmean(self.rtts_ms) if self.rtts_ms else None

    @property
    def p99_ms(self) -> float | None:
        if len(self.rtts_ms) < 2:
            return self.rtts_ms[0] if self.rtts_ms else None
        return statistics.quantiles(self.rtts_ms, n=100, method="inclusive")[98]

    def to_json(self) -> dict[str, Any]:
        return {"sent": self.sent, "received": self.received, "loss": self.loss,
                "mean_ms": self.mean_ms, "p99_ms": self.p99_ms}


def iperf3_server(direction: Direction, seconds: int) -> str:
    """One test's server on the receiver, at its link address; gone after it, or its bound."""
    return (f"timeout {seconds + GRACE_SECONDS:g} iperf3 --server --one-off "
            f"--bind {direction.receiver.link_address} --port {IPERF3_PORT}")


def iperf3_client(direction: Direction, flows: int, seconds: int) -> str:
    """
    ``flows`` parallel TCP flows from the sender's link address, for
    ``seconds``; JSON. They run CUBIC, as an Ubuntu host's TCP does, where the
    kernel has it (the report says what ran).
    """
    congestion = (f"$(grep -qw {UBUNTU_CONGESTION_CONTROL} {AVAILABLE_CONGESTION_CONTROL} && "
                  f"echo --congestion {UBUNTU_CONGESTION_CONTROL})")
    return (f"timeout {seconds + GRACE_SECONDS:g} iperf3 --client "
            f"{direction.receiver.link_address} --port {IPERF3_PORT} "
            f"--bind {direction.sender.link_address} --parallel {flows} "
            f"--time {seconds} {congestion} --json")


def ping(direction: Direction, count: int = PROBES,
         interval: float = PROBE_INTERVAL_SECONDS) -> str:
    """``count`` probes from the sender to the receiver's link address, out of the link."""
    # Bounded by timeout(1), not ping's own -w: with a deadline, ping sends until
    # it has ``count`` replies, so a lossy link would get more than ``count`` probes.
    deadline = math.ceil(count * interval + GRACE_SECONDS)
    return (f"timeout {deadline} ping -n -c {count} -i {interval:g} -W 1 "
            f"-I {direction.sender.link.interface} "
            f"{direction.receiver.link_address}")


def capped(gbit_s: float, trained_gbps: float | None) -> bool:
    """A link that trained at its rate but delivers far less: "link up but capped"."""
    return trained_gbps is not None and gbit_s < CAPPED_SHARE * trained_gbps


async def flows(topology: Topology, direction: Direction, count: int,
                seconds: int) -> FlowRun:
    """
    One run of ``count`` flows in ``direction``: the server first, then the
    client. Both as root where the host is reached with sudo: an account may
    ask only for the congestion controls the kernel allows it (not CUBIC on a
    machine whose default is another, as the lab's).
    """
    bound = seconds + 2 * GRACE_SECONDS
    as_root = {entry.name: entry.sudo for entry in topology.workstations}
    receiver, sender = direction.receiver.name, direction.sender.name
    server = asyncio.create_task(remote.run(
        receiver, remote.remote_command(iperf3_server(direction, seconds), as_root[receiver]),
        topology.ssh_config, bound))
    try:
        for _ in range(SERVER_WAITS):
            ran = await remote.run(
                sender, remote.remote_command(iperf3_client(direction, count, seconds),
                                              as_root[sender]),
                topology.ssh_config, bound)
            report = json.loads(ran.stdout or "{}")
            # Until the server listens, the client is refused at once: ask again,
            # unless the server has already given up.
            if "Connection refused" not in report.get("error", "") or server.done():
                break
            await asyncio.sleep(SERVER_WAIT_SECONDS)
        if "error" in report or ran.error():
            why = report.get("error") or ran.error()
            if server.done() and (refused := server.result().error()):
                why = f"{why}; the server on {direction.receiver.name}: {refused}"
            raise NotTestable(f"{direction.sender.name}: iperf3 to {direction.receiver.name}: "
                              f"{why}")
        return FlowRun.from_iperf3(count, report)
    finally:
        await server


async def probes(topology: Topology, direction: Direction) -> Probes:
    ran = await remote.run(direction.sender.name, ping(direction), topology.ssh_config,
                           PROBES * PROBE_INTERVAL_SECONDS + 2 * GRACE_SECONDS)
    # ping exits 1 when probes are lost: its summary says how many.
    return Probes.from_ping(ran.stdout + ran.stderr)


async def counted(topology: Topology, run: Awaitable[T]) -> tuple[T, dict[str, Any]]:
    """``run``'s result, and what both links' counters did in its window."""
    before = await counters.snapshot(topology)
    result = await run
    after = await counters.snapshot(topology)
    deltas = {host: counters.delta(before[host], after[host]) for host in before}
    return result, {"hosts": deltas, "totals": counters.window_totals(deltas)}


async def preflight(topology: Topology) -> dict[str, float | None]:
    """
    Refuse, with the fix, a test that cannot run: no workstations, a link down,
    iperf3 or ping missing. The rate each receiver trained at, by host.
    """
    if len(topology.workstations) < 2:
        raise NotTestable("the inventory has no pair of workstations to test the link between")
    found = await asyncio.gather(*(remote.run(entry.name, "command -v iperf3 ping",
                                              topology.ssh_config)
                                   for entry in topology.workstations))
    for entry, ran in zip(topology.workstations, found, strict=True):
        if ran.returncode is None or "iperf3" not in ran.stdout:
            raise NotTestable(f"{entry.name}: no iperf3: {INSTALL_FIX}")
    snapshot = await counters.snapshot(topology)
    rates = {host: link.rx_rate_gbps for host, link in snapshot.items()}
    if down := [host for host, rate in rates.items() if rate is None]:
        raise NotTestable(f"{', '.join(down)}: the link is not trained (no XDomain peer): "
                          "a linktest needs the link up; see python experiment.py diagnose")
    return rates


async def linktest(topology: Topology, seconds: int = FLOW_SECONDS) -> dict[str, Any]:
    """Every run of the network-only window, in the hosts' current state: the report."""
    status = await observe(topology)
    trained = await preflight(topology)
    say(f"linktest in {status.match or status.verdict()}: flows of {seconds:g}s, "
        f"{', '.join(map(str, FLOW_COUNTS))} at once, each way; {PROBES} probes each way")
    runs = []
    for direction in directions(topology):
        for count in FLOW_COUNTS:
            run, link = await counted(topology, flows(topology, direction, count, seconds))
            rate = trained[direction.receiver.name]
            say(f"  {direction.name}, {count} flow(s): {run.gbit_s:.2f} Gbit/s of {rate:g}, "
                f"{run.retransmits} retransmits, receiver errors "
                f"{link['totals']['receiver_errors']}")
            runs.append({"direction": direction.name, "kind": "flows", "flows": count,
                         "gbit_s": run.gbit_s, "retransmits": run.retransmits,
                         "bytes": run.bytes, "seconds": run.seconds, "trained_gbps": rate,
                         "capped": capped(run.gbit_s, rate), "congestion": run.congestion,
                         "link": link})
        idle, link = await counted(topology, probes(topology, direction))
        runs.append({"direction": direction.name, "kind": "probes", **idle.to_json(),
                     "link": link})
        (loaded, run), link = await counted(topology, asyncio.gather(
            probes(topology, direction), flows(topology, direction, FLOW_COUNTS[-1], seconds)))
        runs.append({"direction": direction.name, "kind": "load_and_ping", **loaded.to_json(),
                     "flows": run.flows, "gbit_s": run.gbit_s, "retransmits": run.retransmits,
                     "link": link})
        say(f"  {direction.name} probes: loss {idle.loss:.0%} idle, {loaded.loss:.0%} under "
            f"{run.flows} flows; mean RTT {number(idle.mean_ms, 3)} ms")
    return {"format": FORMAT, "state": status.match or "drifted",
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "observed": status.to_json(), "seconds": seconds, "trained_gbps": trained,
            "runs": runs}
