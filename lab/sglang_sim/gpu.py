"""The lab's GPU: one file per process saying how much memory it holds.

The lab's ``nvidia-smi`` adds up ``<dir>/<pid>`` of live processes, so a
workstation's GPU looks busy exactly while a simulated server has its model
loaded. A file left by a killed process is ignored once the pid is gone.
"""

import os
from pathlib import Path

# One RTX 5090.
GPU_MEMORY_MIB = 32607


class GpuMemory:
    """This process's share of the GPU, claimed once the weights are loaded."""

    def __init__(self, directory: Path, mem_fraction: float) -> None:
        self.mib = round(mem_fraction * GPU_MEMORY_MIB)
        self._path = directory / str(os.getpid())

    def claim(self) -> None:
        """Write the file whole (rename), so nvidia-smi never reads half a number."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        partial = self._path.with_name(f"{self._path.name}.partial")
        partial.write_text(f"{self.mib}\n")
        partial.replace(self._path)

    def release(self) -> None:
        self._path.unlink(missing_ok=True)
