"""
The safety layer as a harness reads a workstation: the guard (armed, and what
it did that no run has read yet), the run lock, and the host's identity as the
compatibility ledger records it.

Status, diagnose, a campaign and a soak read the guard with its own fact and
judge it by one judge (:func:`judge`): a guard that fired, or is not armed.
"""

from __future__ import annotations

from typing import Any

from operations.plumbing.reading import Judgement, Query
from operations.safety.guard import GuardState, summary
from operations.safety.ledger import HostIdentity
from operations.safety.lock import HostLock
from operations.site.settings import WorkstationSettings

# Where status shows this layer's lines of a workstation.
SECTION = "guard"

def reading(settings: WorkstationSettings) -> list[Query]:
    """The guard: whether it runs, and its events no run has read."""
    return [Query("guard", GuardState(), {"init_system": settings.serving.init_system})]


def lock(settings: WorkstationSettings) -> list[Query]:
    """The run that holds the host's lock, if any."""
    return [Query("lock", HostLock(), {"run_dir": settings.run_dir})]


def identity(settings: WorkstationSettings) -> list[Query]:
    """
    :class:`HostIdentity`'s members, one query each: a harness reads them in
    sections of its own, which a group's sections cannot nest in.
    """
    arguments = HostIdentity.arguments(settings.candidate.module_name)
    return [Query(key, fact(), arguments.get(key, {}))
            for key, fact in HostIdentity.members.items()]


def judge(settings: WorkstationSettings, values: dict[str, Any]) -> Judgement:
    """
    Whether the guard is ``armed`` and what it did (``events``, each as an
    operator reads it), and the lines an operator reads (``seen``); a problem
    for each event, or if it is neither armed nor has anything to say. Asked
    as every layer's judge is (``settings``, the values read); a guard needs
    nothing of its host's settings to be judged.
    """
    guard = values["guard"]
    events = [summary(event) for event in guard["events"]]
    problems = [f"the guard {event}" for event in events]
    if not guard["armed"] and not events:
        problems.append("the guard is not armed")
    return Judgement({"armed": guard["armed"], "events": events,
                      "seen": ["armed" if guard["armed"] else "not armed", *events]}, problems)
