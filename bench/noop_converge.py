"""
How much a converged run costs: the wall time of a no-op converge against the
lab versus ``pyinfra inventory.py exec -- true`` on the same hosts, in the same
session, how many remote commands the no-op converge runs per host, and where
its time goes: the operations that took longest, and the total per layer (the
word before the colon of an operation's name).

    python bench/noop_converge.py [--state production] [--repeat 5] [--top 5]

The wall times are taken as an operator runs pyinfra, without ``--debug``; the
per-operation times and the command counts come from one more no-op run with
it (it logs every command, so that run is slower). The first, converging run is
timed with ``--debug`` too, so the same script shows where a real transition's
time goes.

It prints figures; it asserts nothing (timing belongs here, not in tests).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"
REMOTE_COMMAND = re.compile(r"Running command on (\S+):")
OPERATION_START = re.compile(r"--> Starting operation: (.+?)\s*$")


@dataclass
class Run:
    """One pyinfra run: its wall time, its output, and each operation's wall time."""

    seconds: float
    output: str
    operations: dict[str, float]


def timed(*arguments: str, debug: bool = True) -> Run:
    """
    Run pyinfra, stamping each operation's start as its line arrives. With
    ``debug`` pyinfra logs every remote command, which the per-operation times
    and the command counts need; the wall times the ratio compares are taken
    without it, as an operator runs pyinfra.
    """
    started = time.monotonic()
    process = subprocess.Popen([str(PYINFRA), "-y", *(["--debug"] if debug else []),
                                "inventory.py", *arguments],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines, starts = [], []
    for line in process.stdout:
        lines.append(line)
        if match := OPERATION_START.search(line):
            starts.append((match.group(1), time.monotonic()))
    process.wait()
    ended = time.monotonic()
    output = "".join(lines)
    if process.returncode != 0:
        raise SystemExit(f"pyinfra {' '.join(arguments)} failed:\n{output[-2000:]}")
    ends = [stamp for _, stamp in starts[1:]] + [ended]
    operations = {name: end - start for (name, start), end in zip(starts, ends, strict=True)}
    return Run(ended - started, output, operations)


def where_the_time_goes(label: str, run: Run, top: int) -> None:
    layers: Counter[str] = Counter()
    for name, seconds in run.operations.items():
        layers[name.split(":")[0]] += seconds
    print(f"{label}: {run.seconds:.1f}s; the {top} longest operations:")
    for name, seconds in sorted(run.operations.items(), key=lambda item: -item[1])[:top]:
        print(f"  {seconds:6.2f}s  {name}")
    print("  per layer: " + ", ".join(f"{layer} {seconds:.1f}s"
                                      for layer, seconds in layers.most_common()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--state", default="production")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()

    converge = ("deploy.py", "--data", f"state={args.state}")
    # Converge first: every measured run must be a no-op.
    where_the_time_goes(f"converge to {args.state}", timed(*converge), args.top)
    ratios, converge_times, exec_times = [], [], []
    for round_number in range(1, args.repeat + 1):
        noop_time = timed(*converge, debug=False).seconds
        exec_time = timed("exec", "--", "true", debug=False).seconds
        converge_times.append(noop_time)
        exec_times.append(exec_time)
        ratios.append(noop_time / exec_time)
        print(f"round {round_number}: no-op converge {noop_time:.2f}s, "
              f"exec -- true {exec_time:.2f}s, ratio {ratios[-1]:.2f}", flush=True)
    noop = timed(*converge)
    commands = Counter(REMOTE_COMMAND.findall(noop.output))
    where_the_time_goes("a no-op converge with --debug (which slows it)", noop, args.top)
    print(f"median no-op converge {statistics.median(converge_times):.2f}s, "
          f"median exec -- true {statistics.median(exec_times):.2f}s, "
          f"median ratio {statistics.median(ratios):.2f} over {args.repeat} rounds")
    print("remote commands per host in a no-op converge: "
          + ", ".join(f"{host} {count}" for host, count in sorted(commands.items())))


if __name__ == "__main__":
    main()
