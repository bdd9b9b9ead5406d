"""
Signals: a run interrupted after its first change still ends in production.

pyinfra's CLI answers SIGINT by exiting 0 at once ("Exiting upon user request!"),
and SIGTERM or SIGHUP end the process outright: a run stopped mid-transition
would leave the candidate loaded and the servers stopped, with no rollback, no
ledger record, and a shell told it succeeded. An interruption is a failure like
any other, and so, from :func:`install`:

- before the first change (connecting, reading the inventory), a signal ends
  the run at once: nothing changed; it exits 128 and the signal's number (130
  for SIGINT, 143 for SIGTERM, 129 for SIGHUP), as a shell reports a process a
  signal ended;
- once the pair's locks are taken, the run's first write (:func:`changes_begin`
  follows them), the first signal fails the attempt in the step it arrived
  in: that step ends (each is bounded), the remaining ones are skipped,
  production is converged and proven by the rollback, and the run exits as
  above, its conclusion and ledger record saying ``interrupted`` and where;
- a later signal does not stop the rollback, which is what makes the hosts safe:
  it says how to force the exit anyway (the same signal again within
  :data:`FORCE_SECONDS`), and what the hosts are left in then.

The rollback runs in a session of its own (:func:`operations.safety.rollback.run_rollback`),
so the terminal's Ctrl-C reaches only this run, which decides.

Python runs a signal handler in the main thread between two bytecodes of
whichever greenlet runs (pyinfra runs on gevent): the handler only records and
prints, and never waits, so it is safe wherever it lands. It never raises: a
``SystemExit`` raised where it lands in a thread's greenlet (paramiko's
transport, under gevent's monkey-patching) ends only that thread, silently (as
``threading`` ends a thread on one), and the run then waits on it: a SIGINT to a
run under pyinfra's own handler, which raises one, hung it on the lab. The
exits it decides are ``os._exit``, once the output is out (:func:`end_now`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyinfra import host, logger
from pyinfra.api import operation
from pyinfra.api.state import BaseStateCallback

from operations.plumbing.phase import executing
from operations.safety.rollback import RESTORE, kill_rollback
from operations.step import RUN_ATTRIBUTE, Attempt, Interruption
from operations.step import step_name as title_of

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A signal repeated within this many seconds of the one the run answered by going
# on forces the exit: twice in a row is a decision, one may be a stray keypress.
FORCE_SECONDS = 5.0

LEFT_MID_TRANSITION = (
    "the hosts are left as after a killed run: the candidate driver may still be loaded, "
    "servers stopped, the temporary fallback in place and this run's lock left to the next "
    f"run (which takes it over); restore production with: {RESTORE}")


@dataclass
class Interrupts:
    """Where the run is, as a signal needs to know it."""

    # Whether a change may have happened: from :func:`changes_begin` on.
    changing: bool = False
    # The step pyinfra last started (:class:`Steps`), as it prints it, and its hash.
    step: str = "connecting and preparing"
    step_hash: str | None = None
    # When a signal last arrived that the run answered by going on (monotonic seconds).
    deferred_at: float | None = None


class Reaction(NamedTuple):
    """What a signal does: what to say; the exit code to end with, if any; whether forced."""

    message: str
    exit_code: int | None = None
    forced: bool = False


def react(interrupts: Interrupts, attempt: Attempt | None, signum: int, now: float
          ) -> Reaction:
    """
    What the signal ``signum`` arriving at ``now`` does to a run at ``interrupts``
    whose attempt is ``attempt`` (``None`` before ``deploy.py`` has begun one).
    """
    name = signal.Signals(signum).name
    code = 128 + signum
    if attempt is None or not interrupts.changing:
        return Reaction(f"{name} during {interrupts.step!r}, before any change: the run ends, "
                        f"nothing was changed (exit {code})", code)
    if attempt.interrupted is None and not attempt.closing:
        attempt.interrupt(Interruption(name, interrupts.step),
                          attempt.layer_of.get(interrupts.step_hash))
        return Reaction(f"{name} during {interrupts.step!r}: the attempt stops after this step, "
                        f"production is converged and verified, then the run exits {code}")
    if interrupts.deferred_at is not None and now - interrupts.deferred_at <= FORCE_SECONDS:
        return Reaction(f"{name} again: forced exit ({code}), killing the rollback if it runs: "
                        f"{LEFT_MID_TRANSITION}", code, forced=True)
    interrupts.deferred_at = now
    return Reaction(f"{name}: the run goes on, so that it ends in a verified production; to "
                    f"force the exit, send {name} again within {FORCE_SECONDS:g}s (pid "
                    f"{os.getpid()}): {LEFT_MID_TRANSITION}")


def end_now(code: int) -> None:
    """End the process with ``code`` at once, its output written: nothing may wait now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Handler:
    """The signal handler of the run ``pyinfra_state`` executes (:func:`install`)."""

    def __init__(self, pyinfra_state: Any, end: Callable[[int], None] = end_now) -> None:
        self.state = pyinfra_state
        self.end = end

    def __call__(self, signum: int, _frame: object) -> None:
        run = getattr(self.state, RUN_ATTRIBUTE, None)
        attempt = run.attempt if run is not None else None
        reaction = react(run.interrupts if run is not None else Interrupts(), attempt, signum,
                         time.monotonic())
        logger.warning(f"--> {reaction.message}")
        if reaction.forced and attempt.rollback_pid is not None:
            kill_rollback(attempt.rollback_pid)
        if reaction.exit_code is not None:
            self.end(reaction.exit_code)


def install(pyinfra_state: Any, end: Callable[[int], None] = end_now) -> None:
    """
    Answer SIGINT, SIGTERM and SIGHUP for the run ``pyinfra_state`` executes, in
    place of pyinfra's CLI's own SIGINT handler. ``config.py`` calls this, before
    any host is connected to, so that no signal of the run finds pyinfra's.
    ``end``: how to end the process (a test's own, in place of :func:`end_now`).
    """
    handler = Handler(pyinfra_state, end)
    for signum in SIGNALS:
        signal.signal(signum, handler)


class Steps(BaseStateCallback):
    """Keeps the step pyinfra is running, which an interruption names."""

    @staticmethod
    def operation_start(state: Any, op_hash: str) -> None:
        interrupts = getattr(state, RUN_ATTRIBUTE).interrupts
        interrupts.step, interrupts.step_hash = title_of(state, op_hash), op_hash


@operation(is_idempotent=True)
def changes_begin(interrupts: Interrupts) -> Iterator[Any]:
    """
    Mark where a change has first happened (the pair's locks are taken just before):
    from here, a signal fails the attempt into the rollback, which releases them,
    instead of ending the run.

    + interrupts: the run's :class:`Interrupts`

    **Example:**

    .. code:: python

        interrupt.changes_begin(name="Interrupt: from here a signal ends the run in production",
                                interrupts=run.interrupts)
    """
    if executing():
        interrupts.changing = True
    host.noop("from here a signal ends the run in a verified production")
    yield from ()
