"""
Progress lines while something long runs: a window, a prefill, a transition.

Every long wait and every measurement prints where it stands (DESIGN.md), so a
slow prefill or a stuck stream is visible while it happens, not only in the
report. Lines go to stderr: stdout is left for what a command produces.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

INTERVAL_SECONDS = 1.0


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@asynccontextmanager
async def reporting(describe: Callable[[float], str],
                    interval: float = INTERVAL_SECONDS) -> AsyncIterator[None]:
    """Print ``describe(elapsed seconds)`` every ``interval`` seconds while the block runs."""
    started = time.monotonic()

    async def report() -> None:
        while True:
            await asyncio.sleep(interval)
            say(describe(time.monotonic() - started))

    task = asyncio.create_task(report())
    try:
        yield
    finally:
        task.cancel()
