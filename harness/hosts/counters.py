"""
Transport counters of the Thunderbolt link, read on both workstations at once.

The field report's fourth lesson: application figures mean something only next
to the transport counters of the same bounded window. A window is therefore
bracketed by two snapshots, each one SSH round trip per workstation running the
link, driver and serving layers' own readings, and reported as their difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.hosts import remote
from harness.hosts.topology import Topology
from operations.serving import reading as serving_reading
from operations.serving.transport import INTERFACE_COUNTERS, RETRANSMISSIONS
from operations.site.settings import WorkstationSettings
from operations.thunderbolt import driver_reading, link_reading
from operations.thunderbolt.link import trained_rate

# rx_errors is the sum of the others (plus allocation failures): the one to total.
RECEIVER_ERRORS = "rx_errors"
# What the link carries per TCP segment beyond its payload: Ethernet's header (14
# bytes), IPv4's (20) and TCP's with timestamps (32).
SEGMENT_HEADER_BYTES = 66


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
    link = [*link_reading.trained(settings), *driver_reading.loaded(settings),
            *serving_reading.transport(settings)]
    return link + (serving_reading.beside(settings) if beside else [])


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
