"""
The GPU layer: each workstation's GPU is present and holds nothing twinbolt did not start.

A run stops production's replicas and then starts SGLang with a large static
memory fraction. If another process (someone's notebook, a forgotten job)
already holds GPU memory, that start fails with out-of-memory only after the
replicas are down. So the preflight refuses it first, naming the process, its
command and the memory it holds, while nothing has changed yet.

A process is twinbolt's when it is, or descends from, the main process of one
of the services twinbolt runs (``ServiceProcess``): SGLang's own scheduler and
TP workers are children of the server it starts. A site may allow other
processes a little memory (a desktop's X server) with
``serving.foreign_gpu_memory_mib``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.api.command import PyinfraCommand

from operations.services import InitSystem, ServicePids
from operations.step import Layer, operation, refuse

LAYER = Layer.GPU


class Gpus(FactBase):
    """
    The host's GPUs, as ``nvidia-smi`` lists them; empty without a driver or GPU.

    .. code:: python

        [{"index": "0", "name": "NVIDIA GeForce RTX 5090", "memory_total_mib": 32607}]
    """

    default = list
    command = ("nvidia-smi --query-gpu=index,name,memory.total "
               "--format=csv,noheader,nounits 2>/dev/null || true")

    def process(self, output: list[str]) -> list[dict]:
        return [
            {"index": index.strip(), "name": name.strip(), "memory_total_mib": int(total)}
            for index, name, total in csv.reader(output)
        ]


class GpuProcesses(FactBase):
    """
    The processes holding GPU memory, each with its ancestry (read from ``/proc``)
    and its command line, so the caller can tell whose they are.

    .. code:: python

        [{"pid": 4242, "used_mib": 28000, "lineage": [4242, 4100, 1],
          "command": "python -m sglang.launch_server ..."}]
    """

    default = list
    command = (
        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits "
        "2>/dev/null | while IFS=', ' read -r pid used; do "
        'lineage=$pid; p=$pid; '
        "while p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status 2>/dev/null) "
        '&& [ "${p:-0}" -gt 0 ]; do lineage="$lineage $p"; done; '
        "printf '%s|%s|%s\\n' \"$used\" \"$lineage\" "
        "\"$(tr '\\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-160)\"; "
        "done"
    )

    def process(self, output: list[str]) -> list[dict]:
        processes = []
        for line in output:
            used, lineage, command = line.split("|", 2)
            pids = [int(pid) for pid in lineage.split()]
            processes.append({"pid": pids[0], "used_mib": int(used), "lineage": pids,
                              "command": command.strip()})
        return processes


def foreign_problems(processes: list[dict], own_pids: set[int], allowed_mib: int) -> list[str]:
    """What the GPU holds for processes twinbolt did not start, beyond what the site allows."""
    foreign = [p for p in processes if not own_pids.intersection(p["lineage"])]
    held = sum(p["used_mib"] for p in foreign)
    if held <= allowed_mib:
        return []
    return [
        f"pid {p['pid']} ({p['command'] or 'command unknown'}) holds {p['used_mib']} MiB "
        f"of GPU memory and was not started by twinbolt"
        for p in foreign
    ] + [f"stop it, or allow it with serving.foreign_gpu_memory_mib (now {allowed_mib})"]


@operation(LAYER, is_idempotent=True)
def free(services: tuple[str, ...], init_system: InitSystem,
         foreign_memory_mib: int = 0) -> Iterator[PyinfraCommand]:
    """
    Refuse, before anything changes, a workstation without a GPU or whose GPU
    holds memory for a process twinbolt did not start.

    + services: the services twinbolt runs on the GPU; their processes and their
      children are twinbolt's
    + init_system: the init system that runs them
    + foreign_memory_mib: the memory other processes may hold in all

    **Example:**

    .. code:: python

        gpu.free(
            name="Preflight: the GPU is present and free",
            services=("sglang-replica", "sglang-tp2-rank0", "sglang-tp2-rank1"),
            init_system="runit",
        )
    """
    if not host.get_fact(Gpus):
        refuse(LAYER, ["nvidia-smi lists no GPU (is the NVIDIA driver loaded?)"])
    processes = host.get_fact(GpuProcesses)
    own_pids = set(host.get_fact(ServicePids, services=services, init_system=init_system)
                   .values()) if processes else set()
    found = foreign_problems(processes, own_pids, foreign_memory_mib)
    if found:
        refuse(LAYER, found)
    host.noop("the GPU is present and holds nothing twinbolt did not start")
    yield from ()
