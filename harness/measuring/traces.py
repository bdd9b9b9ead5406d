"""
Where a token's time goes, from SGLang's profiler traces.

SGLang's ``/stop_profile`` has every TP rank write torch's chrome trace
(Kineto's JSON, gzipped): GPU kernels are complete events (``"ph": "X"``,
``"cat": "kernel"``), ``ts`` and ``dur`` in microseconds, ``ts`` counted from
``baseTimeNanoseconds`` (wall-clock nanoseconds) where the trace has it. NCCL
names its all-reduce kernels ``ncclDevKernel_AllReduce_...`` (NCCL 2.19 and
later) or ``ncclKernel_AllReduce_...`` (earlier); every other kernel is compute.
The lab's simulator writes the same format from its own timings, so one reader
reads both.

Of a rank's profiled span (its first kernel's start to its last kernel's end):
the share in all-reduce kernels, in other kernels, and idle (no kernel
running). An all-reduce kernel's time includes its wait for the peer, so a
lost segment's retransmission shows as one long all-reduce: a stall, here one
that took at least :data:`STALL_FACTOR` times the median of all-reduces of the
same kernel. Its time lost is what it took beyond that median; it coincides
with a retransmission when a TP socket's retransmission counter grew in a
sampling interval it overlaps (:func:`retransmission_intervals`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from statistics import median
from typing import Any

from harness.measuring.sweep import percentile

ALLREDUCE_PREFIXES = ("ncclDevKernel_AllReduce", "ncclKernel_AllReduce")
KERNEL_CATEGORY = "kernel"
# A stall: an all-reduce at least this many times its kernel's median.
STALL_FACTOR = 5.0


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel, wall-clock nanoseconds."""

    name: str
    start_ns: int
    end_ns: int

    @property
    def allreduce(self) -> bool:
        return self.name.startswith(ALLREDUCE_PREFIXES)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def load(data: bytes) -> dict[str, Any]:
    """A trace file's JSON, gzipped (as SGLang writes it) or not."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    trace = json.loads(data)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("not a chrome trace: no traceEvents list")
    return trace


def kernels(trace: dict[str, Any]) -> list[Kernel]:
    """The trace's GPU kernels, in order of start."""
    base = int(trace.get("baseTimeNanoseconds") or 0)
    found = []
    for event in trace["traceEvents"]:
        if (event.get("ph") != "X" or str(event.get("cat", "")).lower() != KERNEL_CATEGORY
                or "dur" not in event):
            continue
        start = base + round(float(event["ts"]) * 1000)
        found.append(Kernel(str(event["name"]), start, start + round(float(event["dur"]) * 1000)))
    return sorted(found, key=lambda kernel: kernel.start_ns)


def union_seconds(spans: Iterable[tuple[int, int]]) -> float:
    """The time covered by ``spans`` (nanoseconds), overlaps counted once, in seconds."""
    covered, end = 0, None
    for start, stop in sorted(spans):
        if end is None or start > end:
            covered += stop - start
            end = stop
        elif stop > end:
            covered += stop - end
            end = stop
    return covered / 1e9


def retransmission_intervals(samples: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """
    From samples of ``(wall-clock ns, total TP-socket retransmissions)``, the
    intervals between two samples in which the total grew.
    """
    return [(before[0], after[0]) for before, after in pairwise(samples) if after[1] > before[1]]


def stalls(allreduces: list[Kernel], retransmitting: list[tuple[int, int]]) -> dict[str, Any]:
    """
    The all-reduces that stalled, their time lost, and how much of it
    coincides with retransmissions.
    """
    medians = {name: median(k.seconds for k in allreduces if k.name == name)
               for name in {k.name for k in allreduces}}
    stalled = [k for k in allreduces if k.seconds >= STALL_FACTOR * medians[k.name] > 0]
    coinciding = [k for k in stalled
                  if any(k.start_ns <= end and start <= k.end_ns for start, end in retransmitting)]

    def lost(kernels: list[Kernel]) -> float:
        return sum(k.seconds - medians[k.name] for k in kernels)

    return {
        "count": len(stalled),
        "seconds_lost": lost(stalled),
        "with_retransmissions": len(coinciding),
        "seconds_lost_with_retransmissions": lost(coinciding),
    }


def breakdown(found: list[Kernel], retransmitting: list[tuple[int, int]]) -> dict[str, Any]:
    """One rank's profile: the shares of its span, one all-reduce's latency, its stalls."""
    if not found:
        return {"kernels": 0, "error": "no GPU kernel: the server ran nothing while profiled "
                                       "(the route sent the request to another)"}
    span = (max(k.end_ns for k in found) - found[0].start_ns) / 1e9
    allreduces = [k for k in found if k.allreduce]
    busy = union_seconds((k.start_ns, k.end_ns) for k in found)
    in_allreduce = union_seconds((k.start_ns, k.end_ns) for k in allreduces)
    latencies = [k.seconds for k in allreduces]
    return {
        "kernels": len(found),
        "span_seconds": span,
        "shares": {
            "allreduce": in_allreduce / span if span else None,
            "compute": (busy - in_allreduce) / span if span else None,
            "idle": (span - busy) / span if span else None,
        },
        "allreduce": {
            "count": len(allreduces),
            "p50_ms": _ms(percentile(latencies, 50)),
            "p99_ms": _ms(percentile(latencies, 99)),
            "kernels": sorted({k.name for k in allreduces}),
        },
        "stalls": stalls(allreduces, retransmitting),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
