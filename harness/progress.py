"""
Progress lines while something long runs: a window, a prefill, a transition.

Every long wait and every measurement prints where it stands, so a
slow prefill or a stuck stream is visible while it happens, not only in the
report. Lines go to stderr: stdout is left for what a command produces.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar

INTERVAL_SECONDS = 1.0
# Where a long run stands (a campaign's "trial 2 of 5, tp2_e2e") and its time left.
PLACE: ContextVar[tuple[str, str] | None] = ContextVar("place", default=None)


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


@contextmanager
def placed(place: str, left: str) -> Iterator[None]:
    """Within the block, :func:`where` names ``place`` and the time ``left``."""
    token = PLACE.set((place, left))
    try:
        yield
    finally:
        PLACE.reset(token)


def where(what: str) -> str:
    """``what``, within the place a campaign set (``trial 2 of 5, tp2_e2e, window single``)."""
    place = PLACE.get()
    return f"{place[0]}, {what} ({place[1]})" if place else what
