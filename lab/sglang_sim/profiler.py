"""SGLang's torch profiler, as far as the simulator's time goes: its GPU kernels.

``/start_profile`` and ``/stop_profile`` reach every TP rank's scheduler, and
each rank writes its own trace when profiling stops, as SGLang's
``SchedulerProfilerMixin.stop_profile`` does (0.5.9 and 0.5.23):
``<output_dir>/<profile_id>-TP-<rank>.trace.json.gz``, the output directory
created if missing, ``SGLANG_TORCH_PROFILER_DIR`` (else ``/tmp``) when the
request names none.

The trace is torch's ``export_chrome_trace`` format (Kineto's JSON): a
``traceEvents`` list whose GPU kernels are complete events (``"ph": "X"``,
``"cat": "kernel"``) with ``ts`` and ``dur`` in microseconds, ``ts`` counted
from ``baseTimeNanoseconds``, the wall-clock time in nanoseconds. The
simulator records what its GPU does: a forward pass's compute as one kernel
(the time it sleeps for the weights and KV cache it reads), and each
all-reduce as NCCL names its device kernel
(``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)``, whatever protocol the
tuner picked), timed from its first send to its last receive. A second
``/start_profile`` while one records is refused with a 500, as 0.5.23 refuses
it (0.5.9's scheduler dies of it).
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from pathlib import Path

DEFAULT_DIR = "/tmp"
# SGLang's environment variable for the default output directory.
DIR_VARIABLE = "SGLANG_TORCH_PROFILER_DIR"
# NCCL 2.27's kernel for a bf16 sum on the ring, whatever the protocol: it
# specialises all-reduce kernels as (Sum, type, RING, LL) only
# (src/device/generate.py), with ncclDevKernelArgsStorage<4096> arguments
# (src/include/device.h), as the profiler demangles it.
ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
# The simulator's compute, named for what it stands for: no real kernel is called this.
FORWARD_KERNEL = "lab_sim::forward_pass"
# SGLang's answers (http_server.py) and refusals (scheduler_profiler_mixin.py, 0.5.9 and 0.5.23).
STARTED = "Start profiling.\n"
STOPPED = "Stop profiling. This will take some time.\n"
ALREADY_PROFILING = "Profiling is already in progress. Call /stop_profile first."
NOT_PROFILING = "Profiling is not in progress. Call /start_profile first."
# The profiler activity that records CUDA kernels (SGLang's activity_map).
GPU_ACTIVITY = "GPU"
# Kineto's trace: one GPU, its compute stream (SGLang runs NCCL on it too).
DEVICE, STREAM = 0, 7


class Lateness:
    """
    How late the simulated GPU's timers woke, in all: a busy machine stretches
    every pass the simulator sleeps for, which a real GPU would not. Read from
    ``/metrics`` (``lab_sim:timer_late_seconds_total``, ``lab_sim:timers_total``),
    under names of the lab's own: SGLang has no such metric.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.timers = 0
        self.late_seconds = 0.0

    def record(self, late: float) -> None:
        with self._lock:
            self.timers += 1
            self.late_seconds += max(0.0, late)

    def totals(self) -> tuple[int, float]:
        with self._lock:
            return self.timers, self.late_seconds

    def mirror(self, totals: tuple[int, float]) -> None:
        """Take another process's totals: a TP rank's timers run in its scheduler process."""
        with self._lock:
            self.timers, self.late_seconds = totals

    def prometheus(self) -> str:
        with self._lock:
            return "".join(
                f"# HELP lab_sim:{name} {text}\n# TYPE lab_sim:{name} counter\n"
                f"lab_sim:{name} {float(value)}\n"
                for name, text, value in (
                    ("timers_total", "The simulated GPU's timers so far.", self.timers),
                    ("timer_late_seconds_total", "How late they woke, in all.",
                     self.late_seconds)))


# The server process's timers, every rank's passes among them.
LATENESS = Lateness()


class Profiler:
    """One rank's recorder: kernel spans while profiling, a trace file when it stops."""

    def __init__(self, rank: int) -> None:
        self._rank = rank
        self._lock = threading.Lock()
        self._events: list[dict] | None = None
        self._gpu = True
        self._path: Path | None = None
        self._origin_ns = 0

    def start(self, output_dir: str | None, profile_id: str,
              activities: list[str] | None = None) -> bool:
        """
        Start recording, the GPU's kernels if ``activities`` has ``GPU`` (as
        SGLang's default of CPU and GPU has); False when it already records
        (SGLang refuses a second start).
        """
        with self._lock:
            if self._events is not None:
                return False
            self._gpu = activities is None or GPU_ACTIVITY in activities
            directory = Path(output_dir or os.environ.get(DIR_VARIABLE, DEFAULT_DIR))
            self._path = directory.expanduser() / f"{profile_id}-TP-{self._rank}.trace.json.gz"
            self._origin_ns = time.time_ns()
            self._events = []
            return True

    def start_profile(self, output_dir: str | None, profile_id: str,
                      activities: list[str] | None = None) -> str | None:
        """:meth:`start`, answered as SGLang's scheduler answers: why not, or ``None``."""
        return None if self.start(output_dir, profile_id, activities) else ALREADY_PROFILING

    def stop_profile(self) -> list[str] | None:
        """:meth:`stop`, answered with the traces written; ``None`` if nothing was recording."""
        path = self.stop()
        return None if path is None else [str(path)]

    def compute(self, seconds: float) -> None:
        """A forward pass's GPU time: spent, and recorded as one kernel."""
        started = time.time()
        time.sleep(seconds)
        ended = time.time()
        LATENESS.record(ended - started - seconds)
        self.kernel(FORWARD_KERNEL, started, ended)

    def kernel(self, name: str, started: float, ended: float, **args: object) -> None:
        """One kernel that ran from ``started`` to ``ended`` (``time.time()`` seconds)."""
        with self._lock:
            if self._events is None or not self._gpu:
                return
            self._events.append({
                "ph": "X", "cat": "kernel", "name": name, "pid": DEVICE, "tid": STREAM,
                "ts": round((started * 1e9 - self._origin_ns) / 1e3, 3),
                "dur": round((ended - started) * 1e6, 3),
                "args": {"device": DEVICE, "stream": STREAM,
                         "correlation": len(self._events) + 1, **args},
            })

    def stop(self) -> Path | None:
        """Write the trace and stop; ``None`` when nothing was recording."""
        with self._lock:
            if self._events is None or self._path is None:
                return None
            events, path = self._events, self._path
            self._events = None
        trace = {
            "schemaVersion": 1,
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": self._origin_ns,
            "traceEvents": events,
            "traceName": str(path),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        with gzip.open(partial, "wt") as stream:
            json.dump(trace, stream)
        partial.replace(path)
        return path
