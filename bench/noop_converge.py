"""
How much a converged run costs: the wall time of a no-op converge against the
lab versus ``pyinfra inventory.py exec -- true`` on the same hosts, in the same
session, and how many remote commands the no-op converge runs per host.

    python bench/noop_converge.py [--state production] [--repeat 5]

It prints figures; it asserts nothing (timing belongs here, not in tests).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"
REMOTE_COMMAND = re.compile(r"Running command on (\S+):")


def timed(*arguments: str) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run([str(PYINFRA), "-y", "--debug", "inventory.py", *arguments],
                            cwd=REPO, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"pyinfra {' '.join(arguments)} failed:\n{result.stderr[-2000:]}")
    return elapsed, result.stdout + result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--state", default="production")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    converge = ("deploy.py", "--data", f"state={args.state}")
    timed(*converge)  # converge first: every measured run must be a no-op
    ratios, converge_times, exec_times = [], [], []
    commands: Counter[str] = Counter()
    for round_number in range(1, args.repeat + 1):
        converge_time, output = timed(*converge)
        exec_time, _ = timed("exec", "--", "true")
        converge_times.append(converge_time)
        exec_times.append(exec_time)
        ratios.append(converge_time / exec_time)
        commands = Counter(REMOTE_COMMAND.findall(output))
        print(f"round {round_number}: no-op converge {converge_time:.2f}s, "
              f"exec -- true {exec_time:.2f}s, ratio {ratios[-1]:.2f}", flush=True)
    print(f"median no-op converge {statistics.median(converge_times):.2f}s, "
          f"median exec -- true {statistics.median(exec_times):.2f}s, "
          f"median ratio {statistics.median(ratios):.2f} over {args.repeat} rounds")
    print("remote commands per host in a no-op converge: "
          + ", ".join(f"{host} {count}" for host, count in sorted(commands.items())))


if __name__ == "__main__":
    main()
