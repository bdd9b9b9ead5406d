"""
Interruption sweep: kill a run at every point and prove the next run converges.

    python tests/soak/interrupt.py [--stride N] [--limit M]
    python tests/soak/interrupt.py --points K

For each leg of production -> tp2_e2e -> production, the leg's run is killed
with SIGKILL right after its k-th remote command (k = 1, 1+N, 1+2N, ...; or,
with ``--points``, K points spread evenly over a clean run's commands), as a
lost laptop or a Ctrl-\\ would; then a new run to the leg's target must converge
and ``pytest tests/verify`` must pass, with no candidate copy, stale process,
lock or temporary route left behind, and so must a run back to the leg's origin.
It prints how many points it tried and how many converged, and exits non-zero
if any did not.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
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


def spread(origin: str, target: str, points: int) -> list[int]:
    """``points`` kill points spread evenly over a clean run of the leg."""
    total = run_killed_after(target, sys.maxsize)
    # The clean run is proven by its verify alone: a second, no-op deploy to the
    # target would only cost time.
    checks = verified(target)
    problem = (f"verify {target} failed: {checks.stdout[-1500:]}" if checks.returncode != 0
               else converge_or_explain(origin))
    if problem:
        raise SystemExit(f"the clean {origin} -> {target} leg failed: {problem}")
    print(f"{origin} -> {target}: a clean run takes {total} remote commands", flush=True)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--stride", type=int, default=1, help="try every N-th command")
    parser.add_argument("--limit", type=int, default=0, help="at most this many points per leg")
    parser.add_argument("--points", type=int, default=0,
                        help="instead: this many points per leg, spread over a clean run")
    args = parser.parse_args()

    tried = converged = 0
    failures: list[str] = []
    for origin, target in LEGS:
        problem = converge_or_explain(origin)
        if problem:
            print(f"cannot start the {origin} -> {target} leg: {problem}")
            return 2
        if args.points:
            points = spread(origin, target, args.points)
        else:
            points = range(1, sys.maxsize, args.stride)
            if args.limit:
                points = points[:args.limit]
        for point in points:
            started = time.monotonic()
            seen = run_killed_after(target, point)
            if seen < point:
                break  # the run finished before this point: the leg is swept
            tried += 1
            problem = converge_or_explain(target)
            converged += problem is None
            verdict = "converged" if problem is None else f"DID NOT CONVERGE: {problem}"
            print(f"{origin} -> {target}: killed after remote command {point}: {verdict} "
                  f"({time.monotonic() - started:.0f}s)", flush=True)
            if problem:
                failures.append(f"{origin} -> {target} killed after command {point}")
            problem = converge_or_explain(origin)
            if problem:
                print(f"cannot return to {origin}: {problem}")
                return 2
    print(f"interruption points tried: {tried}, converged: {converged}")
    for failure in failures:
        print(f"did not converge: {failure}")
    return 0 if tried and converged == tried else 1


if __name__ == "__main__":
    sys.exit(main())
