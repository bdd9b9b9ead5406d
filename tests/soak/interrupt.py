"""
Interruption sweep: interrupt a run at every point and prove where it leaves the hosts.

    python tests/soak/interrupt.py [--stride N] [--limit M]
    python tests/soak/interrupt.py --points K

For each leg of production -> tp2_e2e -> production, the leg's run is
interrupted right after its k-th remote command (k = 1, 1+N, 1+2N, ...; or, with
``--points``, K points spread evenly over a clean run's commands), three times:

- sent SIGINT, then SIGTERM, to its process group, as a terminal's Ctrl-C and a
  service manager's stop are: the run itself must end as it promises and
  ``pytest tests/verify`` prove it: in preflight, nothing changed (the leg's
  origin); after its first change, exit 130 or 143 and a verified production;
  after its conclusion began, exit 0 and the target;
- killed with SIGKILL, as a lost laptop would be; then a new run to the leg's
  target must converge and ``pytest tests/verify`` must pass, with no candidate
  copy, stale process, lock or temporary route left behind.

The legs take turns, so the hosts a point leaves are where the other leg's
next interrupted run starts.
It prints how many points it tried and how many converged, and exits non-zero
if any did not.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
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
# SIGKILL last: the target it converges is the other leg's origin.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
# What a run interrupted in preflight says (operations/safety/interrupt.py).
NOTHING_CHANGED = "before any change: the run ends, nothing was changed"


def deploy(state: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PYINFRA), "-y", "inventory.py", "deploy.py", "--data",
                           f"state={state}"], cwd=REPO, capture_output=True, text=True)


def verified(state: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PYTHON.with_name("pytest")), "tests/verify", "--state", state, "-q",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True)


def run_killed_after(state: str, commands: int, signum: int = signal.SIGKILL
                     ) -> tuple[int, int, str]:
    """
    Run towards ``state``, send ``signum`` to its process group after ``commands``
    remote commands, and let it end; the count seen (fewer than asked means the run
    finished first), its exit code and its output.
    """
    run = subprocess.Popen(
        [str(PYINFRA), "-y", "--debug", "inventory.py", "deploy.py", "--data", f"state={state}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    seen, output = 0, []
    for line in run.stdout:
        output.append(line)
        if REMOTE_COMMAND.search(line):
            seen += 1
            if seen == commands:
                os.killpg(run.pid, signum)
                if signum == signal.SIGKILL:
                    break
    run.wait()
    run.stdout.close()
    return seen, run.returncode, "".join(output)


def clean_run(origin: str, target: str) -> int:
    """The leg's clean run, which must converge and verify; how many remote commands it took."""
    total, _, _ = run_killed_after(target, sys.maxsize)
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


def signalled_or_explain(origin: str, target: str, signum: int, code: int,
                         output: str) -> tuple[str, str | None]:
    """
    Where a run sent ``signum`` (not SIGKILL) left the hosts, by its exit ``code``
    and ``output``, and None if ``pytest tests/verify`` proves them there; else why not.
    """
    if NOTHING_CHANGED in output:
        where = origin
    elif code == 128 + signum:
        where = "production"
    elif code == 0:
        where = target
    else:
        return target, f"exit {code}, not {128 + signum}: {output[-1500:]}"
    checks = verified(where)
    return where, (None if checks.returncode == 0
                   else f"exit {code}, but verify {where} failed: {checks.stdout[-1500:]}")


def interrupt_and_explain(origin: str, target: str, point: int, signum: int
                          ) -> tuple[str | None, str | None] | None:
    """
    Interrupt a run of the leg after ``point`` remote commands with ``signum``:
    where the hosts are then, and None or why they are not where they must be;
    None if the run finished first.
    """
    seen, code, output = run_killed_after(target, point, signum)
    if seen < point:
        return None
    if signum == signal.SIGKILL:
        problem = converge_or_explain(target)
        return (target if problem is None else None), problem
    return signalled_or_explain(origin, target, signum, code, output)


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

    # The legs take turns: where each interruption leaves the hosts is where the next starts,
    # so no run is spent only on getting back unless they are elsewhere.
    at: str | None = origin
    tried = converged = 0
    failures: list[str] = []
    swept: set[int] = set()
    for (leg, point), signum in ((pair, signum) for pair in alternating(*plans)
                                 for signum in SIGNALS):
        if leg in swept:
            continue
        origin, target = LEGS[leg]
        if at != origin:
            if problem := converge_or_explain(origin):
                print(f"cannot return to {origin}: {problem}")
                return 2
        started = time.monotonic()
        ended = interrupt_and_explain(origin, target, point, signum)
        if ended is None:
            swept.add(leg)  # the run finished before this point: the leg is swept
            at = None
            if len(swept) == len(LEGS):
                break
            continue
        tried += 1
        at, problem = ended
        converged += problem is None
        verdict = f"ends in {at}" if problem is None else f"DID NOT END WELL: {problem}"
        print(f"{origin} -> {target}: {signal.Signals(signum).name} after remote command "
              f"{point}: {verdict} ({time.monotonic() - started:.0f}s)", flush=True)
        if problem:
            at = None
            failures.append(f"{origin} -> {target} {signal.Signals(signum).name} after "
                            f"command {point}")
    print(f"interruption points tried: {tried}, ended well: {converged}")
    for failure in failures:
        print(f"did not end well: {failure}")
    return 0 if tried and converged == tried else 1


if __name__ == "__main__":
    sys.exit(main())
