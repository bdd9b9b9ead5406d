"""
Transport counters of the Thunderbolt link, read on both workstations at once.

The field report's fourth lesson: application figures mean something only next
to the transport counters of the same bounded window. A window is therefore
bracketed by two snapshots, each one SSH round trip per workstation running the
link and driver layers' own facts plus :class:`LinkCounters`, and reported as
their difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from harness.hosts import remote
from harness.hosts.topology import Topology
from operations.serving.gpu import GpuProcesses
from operations.serving.neighbours import ProcessCpu
from operations.serving.sglang import GPU_SERVICES
from operations.serving.transport import (
    INTERFACE_COUNTERS,
    RETRANSMISSIONS,
    LinkCounters,
    ipv4_endpoint,
)
from operations.site.settings import WorkstationSettings
from operations.thunderbolt.driver import LoadedModule
from operations.thunderbolt.link import XDomainLink, trained_rate

# rx_errors is the sum of the others (plus allocation failures): the one to total.
RECEIVER_ERRORS = "rx_errors"
SOCKET_COUNTERS = ("retrans", "bytes_retrans", "lost", "bytes_sent", "bytes_received",
                   "segs_out", "segs_in")
# What the link carries per TCP segment beyond its payload: Ethernet's header (14
# bytes), IPv4's (20) and TCP's with timestamps (32).
SEGMENT_HEADER_BYTES = 66


class PeerSockets(FactBase):
    """
    The TCP connections to ``peer`` (the peer's Thunderbolt address: the TP
    group's NCCL, Gloo and SGLang sockets), each with its own retransmission
    counters from ``ss -tin``: unlike ``RetransSegs`` they count nothing of SSH,
    the desktop or a download sharing the host.

    ``retrans`` is the socket's lifetime total (the second figure of ss's
    ``retrans:unacked/total``); ss leaves a zero counter out. The bytes and
    segments each way say what the socket put on the wire.

    .. code:: python

        {"169.254.77.1:5757>169.254.77.2:42304": {"retrans": 9, "bytes_retrans": 426129,
                                                   "lost": 0, "bytes_sent": 91553, ...}}
    """

    default = dict

    def requires_command(self, peer: str) -> str:
        return "ss"

    def command(self, peer: str) -> StringCommand:
        return StringCommand("ss", "-tinH", "state", "established", "dst", QuoteString(peer))

    def process(self, output: list[str]) -> dict[str, dict[str, int]]:
        sockets: dict[str, dict[str, int]] = {}
        counters: dict[str, int] = {}
        for line in output:
            if not line[:1].isspace():
                # "Recv-Q Send-Q Local Peer": the connection; its counters follow.
                *_, local, peer = line.split()
                key = f"{ipv4_endpoint(local).replace('%', '@')}>{ipv4_endpoint(peer)}"
                counters = sockets.setdefault(key,
                                              dict.fromkeys(SOCKET_COUNTERS, 0))
                continue
            for word in line.split():
                name, _, value = word.partition(":")
                if name == "retrans":
                    counters["retrans"] = int(value.partition("/")[2])
                elif name in SOCKET_COUNTERS:
                    counters[name] = int(value)
        return sockets


@dataclass(frozen=True)
class LinkSnapshot:
    """
    One workstation's link at one instant (``at``: monotonic seconds on this
    machine), and what ran beside its servers: the CPU seconds of its processes
    and the servers' main pids (:class:`~operations.serving.neighbours.ProcessCpu`),
    and its GPU's compute processes (:mod:`harness.judging.disturbance`).
    """

    host: str
    at: float
    counters: dict[str, int] = field(default_factory=dict)
    # The link's trained rate (operations.thunderbolt.link.trained_rate): the slower direction
    # times the narrower width, since a TP all-reduce crosses the cable both ways,
    # and the roofline prices it at this rate. The name is the reports' own.
    rx_rate_gbps: float | None = None
    driver_build_id: str | None = None
    driver_parameters: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    sockets: dict[str, dict[str, int]] = field(default_factory=dict)
    cpu: dict[str, Any] | None = None
    gpu: list[dict[str, Any]] = field(default_factory=list)
    # The GPU memory the site allows processes other than twinbolt's.
    gpu_allowed_mib: int = 0


def queries(settings: WorkstationSettings, beside: bool = False) -> list[remote.Query]:
    """
    The link's readings; ``beside``, what ran beside the servers too, which a
    measurement window judges itself by (a soak or a linktest samples faster
    without them).
    """
    servers = {"services": GPU_SERVICES, "init_system": settings.serving.init_system}
    link = [
        remote.Query("xdomain", XDomainLink()),
        remote.Query("module", LoadedModule(), {"module": settings.candidate.module_name}),
        remote.Query("counters", LinkCounters(), {"interface": settings.link.interface}),
        remote.Query("sockets", PeerSockets(), {"peer": settings.peer_link_address}),
    ]
    return link + ([remote.Query("cpu", ProcessCpu(), servers),
                    remote.Query("gpu", GpuProcesses())] if beside else [])


def from_reading(reading: remote.Reading, gpu_allowed_mib: int = 0) -> LinkSnapshot:
    if reading.error:
        return LinkSnapshot(reading.host, reading.at, error=reading.error)
    xdomain = reading.values["xdomain"]
    module = reading.values["module"] or {}
    return LinkSnapshot(
        host=reading.host,
        at=reading.at,
        counters=reading.values["counters"],
        sockets=reading.values["sockets"] or {},
        rx_rate_gbps=trained_rate(xdomain)[0] if xdomain else None,
        driver_build_id=module.get("build_id"),
        driver_parameters=module.get("parameters", {}),
        cpu=reading.values.get("cpu"),
        gpu=reading.values.get("gpu") or [],
        gpu_allowed_mib=gpu_allowed_mib,
    )


async def snapshot(topology: Topology, beside: bool = False) -> dict[str, LinkSnapshot]:
    """Both workstations' links, read at once; ``beside``: what ran beside the servers too."""
    settings = {entry.name: entry.settings for entry in topology.workstations}
    readings = await remote.read_all(
        {entry: queries(settings[entry.name], beside) for entry in topology.workstations},
        topology.ssh_config,
    )
    return {host: from_reading(reading, settings[host].serving.foreign_gpu_memory_mib)
            for host, reading in readings.items()}


def delta(before: LinkSnapshot, after: LinkSnapshot) -> dict[str, Any]:
    """
    What one workstation's link did between two snapshots.

    Counters restart from zero when the driver reloads: a window in which any
    counter went backwards, or the build changed, is flagged ``reset`` and its
    deltas are not reported, rather than reported wrong.
    """
    problems = [snap.error for snap in (before, after) if snap.error]
    if before.driver_build_id != after.driver_build_id:
        problems.append(f"the driver changed ({before.driver_build_id} -> "
                        f"{after.driver_build_id})")
    names = [name for name in (*INTERFACE_COUNTERS, RETRANSMISSIONS)
             if name in before.counters and name in after.counters]
    counters = {name: after.counters[name] - before.counters[name] for name in names}
    if any(value < 0 for value in counters.values()):
        problems.append("a counter went backwards (the interface was re-created)")
    return {
        "seconds": after.at - before.at,
        "counters": {} if problems else counters,
        "sockets": socket_deltas(before.sockets, after.sockets),
        "rx_rate_gbps": [before.rx_rate_gbps, after.rx_rate_gbps],
        "reset": bool(problems),
        "problems": problems,
    }


def socket_deltas(before: dict[str, dict[str, int]],
                  after: dict[str, dict[str, int]]) -> dict[str, Any]:
    """
    Each peer socket's retransmissions in the window: a socket opened during it
    counts from zero. A socket closed during it took its last counts with it,
    so its window is incomplete: it is named, not guessed.
    """
    def grown(key: str, *names: str) -> int:
        return sum(after[key].get(name, 0) - before.get(key, {}).get(name, 0) for name in names)

    retrans = {key: grown(key, "retrans") for key in after}
    return {
        "count": len(after),
        "retrans": sum(retrans.values()),
        "max_retrans": max(retrans.values(), default=None),
        "bytes_retrans": sum(grown(key, "bytes_retrans") for key in after),
        # What the sockets put on the wire, each segment's headers included.
        "wire_bytes": sum(grown(key, "bytes_sent", "bytes_received")
                          + SEGMENT_HEADER_BYTES * grown(key, "segs_out", "segs_in")
                          for key in after),
        "closed": sorted(set(before) - set(after)),
    }


def combined(values: list[Any], combine: Callable[[list[Any]], Any] = sum) -> Any:
    """``combine(values)``; ``None`` when there are none, or when any is unknown (``None``)."""
    return None if not values or None in values else combine(values)


def window_totals(deltas: dict[str, dict[str, Any]]) -> dict[str, int | None]:
    """
    Both workstations together: receiver errors, retransmissions (of the TP
    sockets, the most on any one of them, and host-wide), and the bytes
    put on the link (each end's ``tx_bytes``; the other end's ``rx_bytes`` counts
    the same bytes again). ``None`` where a host's counters could not be used.
    """

    hosts = list(deltas.values())

    def counter(name: str) -> list[int | None]:
        return [host["counters"].get(name) for host in hosts]

    def socket(name: str) -> list[int | None]:
        return [host.get("sockets", {}).get(name) for host in hosts]

    return {
        "receiver_errors": combined(counter(RECEIVER_ERRORS)),
        # The TP group's own sockets first; the host-wide figure includes everything else.
        "socket_retransmissions": combined(socket("retrans")),
        "max_socket_retransmissions": combined(socket("max_retrans"), max),
        "retransmissions": combined(counter(RETRANSMISSIONS)),
        "bytes_moved": combined(counter("tx_bytes")),
    }
