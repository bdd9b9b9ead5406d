"""``nvidia-smi`` for a workstation without a GPU.

One RTX 5090 per workstation. Memory in use is the sum of what live simulated
servers declare in ``/run/lab-gpu/<pid>`` (MiB), so twinbolt's preflight sees a
busy GPU exactly when something is really running on that host.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lab.topology import GPU_MEMORY_MIB, GPU_NAME, alive

GPU_DIR = Path(os.environ.get("LAB_SGLANG_GPU_DIR", "/run/lab-gpu"))


def compute_apps() -> dict[int, int]:
    """Live processes holding GPU memory, by pid; a dead process holds none."""
    apps: dict[int, int] = {}
    for entry in GPU_DIR.glob("*") if GPU_DIR.is_dir() else ():
        try:
            pid, used = int(entry.name), int(entry.read_text().strip())
        except ValueError:
            continue
        if alive(pid):
            apps[pid] = used
    return apps


def gpu_fields() -> dict[str, str]:
    used = sum(compute_apps().values())
    return {
        "index": "0",
        "name": GPU_NAME,
        "uuid": f"GPU-lab-{os.uname().nodename}",
        "memory.total": str(GPU_MEMORY_MIB),
        "memory.used": str(used),
        "memory.free": str(GPU_MEMORY_MIB - used),
        "utilization.gpu": "90" if used else "0",
        "driver_version": "580.95.05",
    }


APP_FIELDS = ("pid", "used_memory", "name")


def query(fields: str, known: tuple[str, ...], rows: list[dict[str, str]], fmt: str) -> int:
    names = [name.strip() for name in fields.split(",")]
    for name in names:
        if name not in known:
            print(f'Field "{name}" is not a valid field to query.', file=sys.stderr)
            return 2
    units = "nounits" not in fmt
    if "noheader" not in fmt:
        print(", ".join(names))
    for row in rows:
        values = [row[name] + (" MiB" if units and "memory" in name else "")
                  for name in names]
        print(", ".join(values))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi")
    parser.add_argument("--query-gpu")
    parser.add_argument("--query-compute-apps")
    parser.add_argument("--format", default="csv")
    args = parser.parse_args(argv)
    if args.query_gpu:
        fields = gpu_fields()
        return query(args.query_gpu, tuple(fields), [fields], args.format)
    if args.query_compute_apps:
        apps = [{"pid": str(pid), "used_memory": str(used), "name": "python"}
                for pid, used in compute_apps().items()]
        return query(args.query_compute_apps, APP_FIELDS, apps, args.format)
    fields = gpu_fields()
    print(f"GPU 0: {fields['name']} ({fields['uuid']})")
    print(f"Memory: {fields['memory.used']}MiB / {fields['memory.total']}MiB")
    for pid, used in compute_apps().items():
        print(f"  process {pid}: {used}MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
