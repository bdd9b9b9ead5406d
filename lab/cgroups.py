"""The lab's subtrees of the machine's cgroup hierarchies, which systemd hosts leave behind.

A systemd host runs in its own subtree of the ``name=systemd`` and unified
hierarchies (``lab.hostinit``). The directories outlive the host's processes,
so ``lab down`` removes them, deepest first, once the processes are gone. The
hierarchies are mounted for that under the lab's state directory and unmounted
again: the machine's own mounts are left as they are.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.topology import STATE, LabHost

# The hierarchies systemd needs, as ``mount -t KIND [-o OPTIONS] KIND`` mounts them.
HIERARCHIES = {"systemd": ("cgroup", "none,name=systemd"), "unified": ("cgroup2", "")}
# A process killed a moment ago may still hold its cgroup while it is reaped.
BUSY_SECONDS = 3.0


def cgroup_name(host: LabHost) -> str:
    """The host's subtree in each hierarchy the machine shares with it."""
    return f"twinbolt-lab-{host.name}"


def mount_source(hierarchy: str) -> list[str]:
    """``mount``'s arguments naming ``hierarchy``, before the mount point."""
    kind, options = HIERARCHIES[hierarchy]
    return ["-t", kind, *(["-o", options] if options else []), kind]


@contextmanager
def mounted() -> Iterator[dict[str, Path]]:
    """Each hierarchy that exists, mounted for the moment under the lab's state directory."""
    mounts = {}
    try:
        for hierarchy in HIERARCHIES:
            mount_point = STATE / "cgroup" / hierarchy
            mount_point.mkdir(parents=True, exist_ok=True)
            if subprocess.run(["mount", *mount_source(hierarchy), str(mount_point)],
                              capture_output=True).returncode == 0:
                mounts[hierarchy] = mount_point
        yield mounts
    finally:
        for mount_point in mounts.values():
            subprocess.run(["umount", str(mount_point)], check=True)


def existing(names: list[str]) -> list[str]:
    """The named subtrees still present, as ``HIERARCHY:/NAME``."""
    with mounted() as mounts:
        return [f"{hierarchy}:/{name}" for hierarchy, root in mounts.items()
                for name in names if (root / name).is_dir()]


def remove(names: list[str]) -> list[str]:
    """Remove each named subtree from every hierarchy; what was removed, for ``lab down``."""
    removed = []
    with mounted() as mounts:
        for hierarchy, root in mounts.items():
            for name in names:
                if (root / name).is_dir():
                    remove_tree(root / name)
                    removed.append(f"cgroup {hierarchy}:/{name}")
    return removed


def remove_tree(root: Path) -> None:
    """rmdir every directory under ``root``, children first, waiting out busy ones."""
    deadline = time.monotonic() + BUSY_SECONDS
    for directory in sorted((Path(path) for path, _, _ in os.walk(root)),
                            key=lambda path: len(path.parts), reverse=True):
        while True:
            try:
                directory.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
