"""
Interruption sweep: kill a run at every point and prove the next run converges.

    python tests/soak/interrupt.py [--stride N] [--limit M]
    python tests/soak/interrupt.py --points K

For each leg of production -> tp2_e2e -> production, the leg's run is killed
with SIGKILL right after its k-th remote command (k = 1, 1+N, 1+2N, ...; or,
with ``--points``, K points spread evenly over a clean run's commands), as a
lost laptop or a Ctrl-\\ would; then a new run to the leg's target must converge
and ``pytest tests/verify`` must pass, with no candidate copy, stale process,
lock or temporary route left behind. The legs take turns, so the hosts a point
converged are where the other leg's next killed run starts.
It prints how many points it tried and how many converged, and exits non-zero
if any did not.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from itertools import zip_longest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"
PYTHON = REPO / ".venv" / "bin" / "python"
REMOTE_COMMAND = re.compile(r"Running command on \S+:")
LEGS = (("production", "tp2_e2e"), ("tp2_e2e", "production"))


def deploy(state: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PYINFRA), "-y", "inventory.py", "deploy.py", "--data",
                           f"state={state}"], cwd=REPO, capture_output=True, text=True)


def verified(state: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PYTHON.with_name("pytest")), "tests/verify", "--state", state, "-q",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True)


def run_killed_after(state: str, commands: int) -> int:
    """Run towards ``state``, SIGKILL it after ``commands`` remote commands; return the count
    seen (fewer than asked means the run finished first)."""
    run = subprocess.Popen(
        [str(PYINFRA), "-y", "--debug", "inventory.py", "deploy.py", "--data", f"state={state}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    seen = 0
    for line in run.stdout:
        if REMOTE_COMMAND.search(line):
            seen += 1
            if seen >= commands:
                run.kill()
                break
    run.wait()
    run.stdout.close()
    return seen


def clean_run(origin: str, target: str) -> int:
    """The leg's clean run, which must converge and verify; how many remote commands it took."""
    total = run_killed_after(target, sys.maxsize)
    checks = verified(target)
    if checks.returncode != 0:
        raise SystemExit(f"the clean {origin} -> {target} leg failed: verify {target} failed: "
                         f"{checks.stdout[-1500:]}")
    print(f"{origin} -> {target}: a clean run takes {total} remote commands", flush=True)
    return total


def spread(total: int, points: int) -> list[int]:
    """``points`` kill points spread evenly over a clean run of ``total`` remote commands."""
    return sorted({max(1, round(i * total / (points + 1))) for i in range(1, points + 1)})


def converge_or_explain(state: str) -> str | None:
    """None when a fresh run to ``state`` converges and verifies; else why not."""
    run = deploy(state)
    if run.returncode != 0:
        return f"deploy to {state} failed: {(run.stdout + run.stderr)[-1500:]}"
    checks = verified(state)
    if checks.returncode != 0:
        return f"verify {state} failed: {checks.stdout[-1500:]}"
    return None


def alternating(first: Iterable[int], second: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(leg, point) pairs taking the two legs' points in turn, until both run out."""
    for pair in zip_longest(first, second):
        for leg, point in enumerate(pair):
            if point is not None:
                yield leg, point


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--stride", type=int, default=1, help="try every N-th command")
    parser.add_argument("--limit", type=int, default=0, help="at most this many points per leg")
    parser.add_argument("--points", type=int, default=0,
                        help="instead: this many points per leg, spread over a clean run")
    args = parser.parse_args()

    origin = LEGS[0][0]
    if verified(origin).returncode != 0 and (problem := converge_or_explain(origin)):
        print(f"cannot start from {origin}: {problem}")
        return 2
    if args.points:
        # The clean runs leave the hosts where they started: each leg's origin is the other's
        # target.
        plans = [spread(clean_run(*leg), args.points) for leg in LEGS]
    else:
        plans = [range(1, sys.maxsize, args.stride) for _ in LEGS]
        if args.limit:
            plans = [plan[:args.limit] for plan in plans]

    # The legs take turns: each point's converged target is the next point's origin, so no
    # run is spent only on getting back.
    at: str | None = origin
    tried = converged = 0
    failures: list[str] = []
    swept: set[int] = set()
    for leg, point in alternating(*plans):
        if leg in swept:
            continue
        origin, target = LEGS[leg]
        if at != origin:
            if problem := converge_or_explain(origin):
                print(f"cannot return to {origin}: {problem}")
                return 2
        started = time.monotonic()
        seen = run_killed_after(target, point)
        if seen < point:
            swept.add(leg)  # the run finished before this point: the leg is swept
            at = None
            if len(swept) == len(LEGS):
                break
            continue
        tried += 1
        problem = converge_or_explain(target)
        converged += problem is None
        at = target if problem is None else None
        verdict = "converged" if problem is None else f"DID NOT CONVERGE: {problem}"
        print(f"{origin} -> {target}: killed after remote command {point}: {verdict} "
              f"({time.monotonic() - started:.0f}s)", flush=True)
        if problem:
            failures.append(f"{origin} -> {target} killed after command {point}")
    print(f"interruption points tried: {tried}, converged: {converged}")
    for failure in failures:
        print(f"did not converge: {failure}")
    return 0 if tried and converged == tried else 1


if __name__ == "__main__":
    sys.exit(main())
