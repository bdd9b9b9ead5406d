"""
One run of ``deploy.py``, as one explicit object: its attempt and failures,
what the compatibility ledger will record, the proofs it has made, who it is
(the owner its host locks name), the locks it holds, and where a signal finds it.

pyinfra executes ``deploy.py`` once per host, in one process, under one
:class:`pyinfra.api.State`, and runs each operation on every host before the
next. The run belongs to that state, so every host's pass over the runbook
meets the same run, and the operations receive it, or the part of it they
need, as they receive their other inputs. Nothing of a run outlives its
state: a test builds a run of its own, and the rollback, a new process, starts
with a new one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import gevent
from pyinfra.api import OperationError

from operations.plumbing.probes import Proofs
from operations.safety import interrupt
from operations.safety.ledger import Observations
from operations.safety.lock import Locks, RunOwner, run_owner
from operations.safety.rollback import ENDING_ENV, for_command_line, report_ending
from operations.step import RUN_ATTRIBUTE, Attempt, RecordFailedOperations


@dataclass
class Run:
    """
    + owner: who this run is, as its host locks name it (a rollback: the failed run)
    + attempt: its failures, its end and its way back to production
    + observed: what it has seen of each workstation, for the ledger's record
    + proofs: the servers and routes it has already proven
    + interrupts: where it is, as a signal needs to know it (:mod:`operations.safety.interrupt`)
    + locks: the host locks it holds, which a refusal releases
    """

    owner: RunOwner
    attempt: Attempt = field(default_factory=Attempt)
    observed: Observations = field(default_factory=Observations)
    proofs: Proofs = field(default_factory=Proofs)
    interrupts: interrupt.Interrupts = field(default_factory=interrupt.Interrupts)
    locks: Locks = field(init=False)

    def __post_init__(self) -> None:
        self.locks = Locks(self.owner)
        self.attempt.listeners.append(self.locks.released_if_refused)


# The attribute of pyinfra's state that holds its parsed command line (config.py).
COMMAND_LINE_ATTRIBUTE = "twinbolt_command_line"


def remember_command_line(pyinfra_state: Any, params: dict[str, Any]) -> None:
    """
    Keep pyinfra's parsed command line, which a rollback repeats, for the run
    ``pyinfra_state`` will execute. ``config.py`` calls this: only there is it at
    hand (``deploy.py`` runs in a greenlet per host, where click has no context).
    """
    setattr(pyinfra_state, COMMAND_LINE_ATTRIBUTE, params)


def begin(pyinfra_state: Any, target: str, inherited_lock: str | None) -> Run:
    """
    The run ``pyinfra_state`` executes, made by the first host's pass over the
    runbook and met again by the others'; it can roll back only if the command
    line was remembered (:func:`remember_command_line`: not under pyinfra's
    Python API, which has none).

    + target: the state it converges to, which its lock names
    + inherited_lock: for the rollback a failed run starts, that run's owner

    Failed remote commands are recorded from then on, and the step each
    operation starts is kept for a signal to name. A rollback reports its
    ending where the run that started it said (:data:`ENDING_ENV`). A refusal or a failure
    raised while operations execute leaves pyinfra's host greenlet as an
    ``OperationError``; gevent would print a Python traceback for each such
    greenlet before pyinfra prints the message itself. The message already names
    the host, the layer and the evidence, so gevent is told that this exception
    is not a crash.
    """
    existing = getattr(pyinfra_state, RUN_ATTRIBUTE, None)
    if existing is not None:
        return existing
    command_line = getattr(pyinfra_state, COMMAND_LINE_ATTRIBUTE, None)
    run = Run(
        owner=run_owner(target, inherited_lock),
        attempt=for_command_line(command_line) if command_line else Attempt(),
    )
    setattr(pyinfra_state, RUN_ATTRIBUTE, run)
    pyinfra_state.add_callback_handler(RecordFailedOperations())
    pyinfra_state.add_callback_handler(interrupt.Steps())
    if os.environ.get(ENDING_ENV):
        run.attempt.listeners.append(partial(report_ending, Path(os.environ[ENDING_ENV])))
    hub = gevent.get_hub()
    if OperationError not in hub.NOT_ERROR:
        hub.NOT_ERROR = (*hub.NOT_ERROR, OperationError)
    return run
