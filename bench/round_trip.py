"""
What an experiment's round trip costs: production -> STATE -> production, each
leg converged and then verified with ``pytest tests/verify``, timed apart, with
where each converge's time goes (as ``noop_converge.py`` prints it).

    .venv-lab/bin/python bench/round_trip.py [--state tp2_e2e] [--top 5]

Run it in a converged production. It prints figures; it asserts nothing
(timing belongs here, not in tests).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from noop_converge import REPO, timed, where_the_time_goes


def verify(state: str) -> float:
    """``pytest tests/verify --state STATE``'s wall time; exits if it fails."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/verify", "--state",
                             state], cwd=REPO, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"verify {state} failed:\n{result.stdout[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--state", default="tp2_e2e")
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()

    legs = []
    for target in (args.state, "production"):
        converge = timed("deploy.py", "--data", f"state={target}")
        where_the_time_goes(f"converge to {target}", converge, args.top)
        verified = verify(target)
        print(f"verify {target}: {verified:.1f}s", flush=True)
        legs.append((target, converge.seconds, verified))
    for target, converged, verified in legs:
        print(f"leg to {target}: converge {converged:.1f}s + verify {verified:.1f}s "
              f"= {converged + verified:.1f}s")
    total = sum(converged + verified for _, converged, verified in legs)
    print(f"round trip production -> {args.state} -> production, each leg verified: {total:.1f}s")


if __name__ == "__main__":
    main()
