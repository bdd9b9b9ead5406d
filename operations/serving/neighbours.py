"""
What else runs on a workstation beside the state's servers: the CPU it uses.

A measurement window means something only if the state's servers had the host
to themselves: a CPU-heavy job beside them (a build, a backup's compression)
takes the cores SGLang's schedulers spin on, and the window's figures drop
with no word of why. This reads, in one command, the CPU time of the servers
(each service's main process and every descendant: SGLang's scheduler and TP
workers are children of the server it starts) and of every other process on
the host, kernel threads aside (their work is the host's own, the link's
interrupts among it). The GPU's neighbours are the GPU layer's reading
(:class:`~operations.serving.gpu.GpuProcesses`).

Each process counts the time of the children it has reaped as well as its own
(``cutime``, ``cstime``), so a short script that came and went between two
readings is counted by its parent: the sum over live processes grows by all
the CPU used between them.
"""

from __future__ import annotations

from pyinfra.api import FactBase, StringCommand

from operations.plumbing.facts import shell_script
from operations.services import SUPERVISORS, InitSystem

# Sums each live process's CPU ticks (utime, stime, cutime, cstime: fields 14 to
# 17 of /proc/PID/stat, counted after the command's closing parenthesis) into the
# servers' (descendants of the pids in roots) or the others'. Kernel threads
# (kthreadd, pid 2, and its children) are left out. cat, not awk's own reading:
# a process that ends between the glob and its read is skipped, not an error.
TICKS_AWK = r"""
{ pid = $1; rest = $0; sub(/^.*\) /, "", rest); n = split(rest, f, " ");
  if (n < 15 || pid == 2 || f[2] == 2) next;
  parent[pid] = f[2]; ticks[pid] = f[12] + f[13] + f[14] + f[15] }
END { split(roots, r, " "); for (i in r) root[r[i]] = 1;
  servers = 0; others = 0;
  for (pid in ticks) { p = pid; own = 0;
    for (depth = 0; depth < 64 && p > 0; depth++) {
      if (p in root) { own = 1; break } if (!(p in parent)) break; p = parent[p] }
    if (own) servers += ticks[pid]; else others += ticks[pid] }
  print "servers " servers; print "others " others }
"""


class ProcessCpu(FactBase):
    """
    CPU seconds used so far by the processes of ``services`` and by every other
    process on the host (kernel threads aside), each with what it has reaped;
    and the main pid of each service that runs, which the servers' are counted from.

    .. code:: python

        {"servers": 1843.2, "others": 61.7, "pids": {"sglang-tp2-rank0": 4242}}
    """

    def requires_command(self, services: tuple[str, ...], init_system: InitSystem) -> str:
        return "getconf"

    def command(self, services: tuple[str, ...], init_system: InitSystem) -> StringCommand:
        script = (
            'roots=; pid_of() { ' + SUPERVISORS[init_system].status_script()
            + 'roots="$roots $pid"; [ "${pid:-0}" != 0 ] && echo "pid $1 $pid"; }; '
            'for s in "$@"; do pid_of "$s"; done; '
            'echo "hz $(getconf CLK_TCK)"; '
            f"cat /proc/[0-9]*/stat 2>/dev/null | awk -v roots=\"$roots\" '{TICKS_AWK}'"
        )
        return shell_script(script, *services)

    def process(self, output: list[str]) -> dict | None:
        words = [line.split() for line in output]
        values = dict(word for word in words if len(word) == 2)
        if not {"hz", "servers", "others"} <= values.keys():
            return None
        hz = int(values["hz"])
        return {"servers": int(values["servers"]) / hz, "others": int(values["others"]) / hz,
                "pids": {name: int(pid) for kind, name, pid in
                         (word for word in words if len(word) == 3) if kind == "pid"}}
