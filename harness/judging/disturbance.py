"""
Whether a window was measured clean: what else ran while it was measured.

The same code measured tp2_stock's single stream at 200.6 tok/s on a quiet
machine and at 90.9 while other processes read files and ran short scripts
beside it, and nothing in either report said which run was disturbed. On a
real site the same holds for a CPU-heavy job on a workstation, another process
on a GPU, or a backup crossing ``thunderbolt0``. So each window records, from
the same readings that bracket its link counters:

- per workstation, the CPU time of every process that is not one of the
  state's servers (:class:`~operations.serving.neighbours.ProcessCpu`); the
  GPU's compute processes that are not the state's, judged as the GPU layer
  judges them before a run (:func:`~operations.serving.gpu.foreign_problems`);
  and the bytes ``thunderbolt0`` carried beyond what the TP group's own sockets
  put on the wire;
- on this machine, where the client takes every timestamp, the CPU time of
  the processes of its own network namespace outside this one and its
  children. The lab's hosts each have a network namespace of their own, so
  this is the machine's load from outside the lab; a container with a network
  of its own is not counted either;
- in the lab, how late the simulator's timers woke: it sleeps for its GPU's
  time, and a busy machine stretches every pass (a real server says nothing
  of the kind, and is not judged by it).

A window past any threshold is *disturbed*: named in the report, left out of
a state's figures as an invalid window is, and measured again once when the
others are done.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.hosts.counters import LinkSnapshot
from operations.serving.gpu import foreign_problems

MIB = 1024 * 1024


@dataclass(frozen=True)
class Threshold:
    """A limit on one reading of a window, in ``unit``, and why it is there."""

    limit: float
    unit: str
    why: str


# Every threshold, with its reason: the only place they are declared.
FOREIGN_CPU = Threshold(
    0.25, "of one core",
    "a desktop at rest uses a few per cent of one core; a quarter of a core through a whole "
    "window is a job of its own, and the state's servers need their cores: SGLang's "
    "scheduler spins one per server, on every token's path")
FOREIGN_LINK = Threshold(
    MIB, "bytes",
    "the link carries nothing but the TP group's sockets and a probe's few packets; a "
    "megabyte more is someone's transfer sharing the cable the all-reduces wait on")
MACHINE_CPU = Threshold(
    0.25, "of one core",
    "the client takes every timestamp on this machine (and, in the lab, the simulated GPUs "
    "run here): a quarter of a core taken by others delays what it measures")
LATE_TIMERS = Threshold(
    0.001, "seconds late per timer, on average",
    "the lab's simulator sleeps for its GPU's time, and wakes some 0.1 ms late on a quiet "
    "machine (even beside one busy core: the kernel favours a sleeper); ten times that, "
    "every pass it simulates is longer than the GPU it stands for, and so is every token")
# What the measurement itself costs a host in CPU, below which a short window is
# not called disturbed: the two readings that bracket a window (an SSH session,
# sudo, a shell, nvidia-smi, awk over /proc) took up to 0.3 CPU seconds of a lab
# host, and the profile window's samplers (counted as others') up to 0.3 more:
# a second leaves room for a slower host.
NOISE_CPU_SECONDS = 1.0
# Headers aside, a socket's byte counts and the interface's may part by a few per
# cent (options, an ACK's SACK blocks): a share of the TP group's bytes is allowed.
LINK_SLACK = 0.02

WHAT_TO_DO = ("stop what else runs (on the workstations, the link and this machine), then "
              "measure again; `experiment.py status` lists each host's servers")


def counted(window: dict[str, Any]) -> bool:
    """Whether a window's figures count: neither invalid (its cache) nor disturbed."""
    return not window.get("invalid") and not window.get("disturbed")


@dataclass(frozen=True)
class Process:
    """One process of this machine, as :func:`processes` reads it."""

    parent: int
    ticks: int
    # Its network namespace; ``None`` where it cannot be read (another user's).
    net: str | None


def processes() -> dict[int, Process]:
    """Every process of this machine, kernel threads (kthreadd and its children) aside."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while read
        try:
            net: str | None = os.readlink(entry / "ns" / "net")
        except OSError:
            net = None
        # utime, stime, cutime, cstime: fields 14 to 17, counted after the command's ")".
        fields = stat.rpartition(") ")[2].split()
        pid, parent = int(entry.name), int(fields[1])
        if pid != 2 and parent != 2:
            found[pid] = Process(parent, sum(int(value) for value in fields[11:15]), net)
    return found


def others(found: dict[int, Process], mine: int, net: str) -> set[int]:
    """
    The processes of ``found`` outside the measurement: in network namespace
    ``net`` (or one that cannot be read: another user's, on this machine), and
    neither ``mine`` nor a descendant of it.
    """
    outside = set()
    for pid, process in found.items():
        if process.net not in (net, None):
            continue
        lineage = pid
        while lineage != mine and lineage in found:
            lineage = found[lineage].parent
        if lineage != mine:
            outside.add(pid)
    return outside


def machine_cpu_seconds() -> float:
    """
    CPU seconds used so far by the processes of this machine outside the
    measurement (:func:`others`), each with what it has reaped, as
    :class:`~operations.serving.neighbours.ProcessCpu` counts a workstation's.
    """
    found = processes()
    outside = others(found, os.getpid(), os.readlink("/proc/self/ns/net"))
    return sum(found[pid].ticks for pid in outside) / os.sysconf("SC_CLK_TCK")


def host_reading(before: LinkSnapshot, after: LinkSnapshot, link: dict[str, Any],
                 ) -> dict[str, Any]:
    """
    What ran beside one workstation's servers between two snapshots: the others'
    CPU seconds, the link's bytes beyond the TP sockets' (``link``:
    :func:`~harness.hosts.counters.delta`), and the GPU's foreign processes at the end.
    ``None`` where a reading is missing.
    """
    cpu = None
    if before.cpu and after.cpu:
        cpu = max(0.0, after.cpu["others"] - before.cpu["others"])
    counters, sockets = link["counters"], link["sockets"]
    foreign_bytes = None
    if {"tx_bytes", "rx_bytes"} <= counters.keys() and not sockets["closed"]:
        wire = sockets["wire_bytes"]
        foreign_bytes = max(0, counters["tx_bytes"] + counters["rx_bytes"]
                            - round(wire * (1 + LINK_SLACK)))
    servers = set((after.cpu or {}).get("pids", {}).values())
    gpu = foreign_problems(after.gpu, servers, after.gpu_allowed_mib)
    # Its last line is the GPU layer's fix for a run: how to stop or allow it.
    return {"cpu_seconds": cpu, "link_bytes": foreign_bytes, "gpu": gpu[:-1]}


def reasons(hosts: dict[str, dict[str, Any]], machine_seconds: float | None,
            seconds: float, timer_late: float | None = None) -> list[str]:
    """
    Why a window of ``seconds`` was disturbed, one reason per reading past its
    threshold; ``timer_late``: how late the lab's simulated GPU woke on average.
    """
    found = []
    for host, reading in hosts.items():
        cpu = reading["cpu_seconds"]
        if cpu is not None and cpu > max(FOREIGN_CPU.limit * seconds, NOISE_CPU_SECONDS):
            found.append(f"{host}: processes other than the state's servers used "
                         f"{cpu / seconds:.2f} cores (over {FOREIGN_CPU.limit} "
                         f"{FOREIGN_CPU.unit})")
        moved = reading["link_bytes"]
        if moved is not None and moved > FOREIGN_LINK.limit:
            found.append(f"{host}: the link carried {moved / MIB:.1f} MiB beyond the TP "
                         f"group's sockets (over {FOREIGN_LINK.limit / MIB:.0f} MiB)")
        found += [f"{host}: {problem}" for problem in reading["gpu"]]
    if machine_seconds is not None and (busy := machine_busy(machine_seconds, seconds)):
        found.append(busy)
    if timer_late is not None and timer_late > LATE_TIMERS.limit:
        found.append(f"the lab's simulated GPU woke {timer_late * 1000:.1f} ms late per pass "
                     f"on average (over {LATE_TIMERS.limit * 1000:.0f} ms)")
    return found


def quiet_line(windows: list[dict[str, Any]]) -> str:
    """
    Whether the machines were quiet while ``windows`` were measured, said first
    in every report, as pyperf warns of an unsteady system: and what to do if not.
    """
    if not windows:
        return "no window was measured"
    disturbed = [window for window in windows if window.get("disturbed")]
    if not disturbed:
        return (f"quiet: none of the {len(windows)} windows was disturbed (nothing else used "
                f"{FOREIGN_CPU.limit} of a core on a workstation or here, crossed the link or "
                "held a GPU)")
    again = [window for window in windows if window.get("again")]
    clean_again = sum(1 for window in again if not window.get("disturbed"))
    return (f"**not quiet**: {len(disturbed)} of {len(windows)} windows were disturbed and "
            f"left out ({disturbed[0]['name']}: {disturbed[0]['disturbed']}); "
            f"{clean_again} of the {len(again)} measured again were clean. To trust these "
            f"figures: {WHAT_TO_DO}")


def machine_busy(used: float, seconds: float) -> str | None:
    """Why this machine was not quiet, ``used`` CPU seconds by others in ``seconds``; or None."""
    if used <= max(MACHINE_CPU.limit * seconds, NOISE_CPU_SECONDS):
        return None
    return (f"this machine: processes outside the measurement used {used / seconds:.2f} cores "
            f"(over {MACHINE_CPU.limit} {MACHINE_CPU.unit})")


def threshold_lines() -> list[str]:
    """What makes a window disturbed, each limit with its reason, for a report."""
    return [
        f"- other processes on a workstation: over {FOREIGN_CPU.limit} {FOREIGN_CPU.unit} "
        f"through the window ({FOREIGN_CPU.why})",
        f"- the link: over {FOREIGN_LINK.limit / MIB:.0f} MiB beyond the TP group's sockets "
        f"({FOREIGN_LINK.why})",
        "- a GPU: any compute process not the state's, beyond serving.foreign_gpu_memory_mib "
        "(it shares the SMs and the memory bandwidth every token needs)",
        f"- this machine: over {MACHINE_CPU.limit} {MACHINE_CPU.unit} used outside the "
        f"measurement ({MACHINE_CPU.why})",
        f"- the lab's simulator: its timers over {LATE_TIMERS.limit * 1000:.0f} ms late per "
        f"pass on average ({LATE_TIMERS.why})",
    ]
