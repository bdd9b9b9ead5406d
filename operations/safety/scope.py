"""
A run moves the whole pair or nothing.

The rollback, the conclusion and the ledger's stall refusal speak through rank 0,
and a TP state needs both workstations and the gateway's fallback at once. A run
that ``--limit`` or ``--exclude`` leaves a host out of would load the candidate on
one workstation despite a recorded stall, start rank 1 alone behind a dummy
``/health``, and end without a rollback or a ledger line. So it is refused before
anything is read or changed. Read-only commands (``pytest tests/verify``,
``experiment.py status`` and ``diagnose``) may still look at a subset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pyinfra.api import Host, Inventory
from pyinfra.api.exceptions import PyinfraError

PAIR_GROUPS = ("workstations", "gateway")


class PartialRun(PyinfraError):
    """A run whose active hosts are not the whole pair; pyinfra prints it and exits non-zero."""


def left_out(hosts: Iterable[Host], in_limit: Callable[[Host], bool]) -> list[str]:
    """The pair's hosts (workstations and gateway) this run would not touch, in inventory order."""
    return [host.name for host in hosts
            if any(group in host.groups for group in PAIR_GROUPS) and not in_limit(host)]


def reached(inventory: Inventory, in_limit: Callable[[Host], bool]) -> list[Host]:
    """The pair's hosts this run reaches, workstations first (the first not lost speaks for it)."""
    return [host for group in PAIR_GROUPS for host in inventory.get_group(group)
            if in_limit(host)]


def refusal(missing: list[str], state_name: str) -> str:
    return (f"refused: --limit/--exclude leaves {', '.join(missing)} out of this run; a run to "
            f"{state_name} moves both workstations and the gateway as one unit (the rollback, "
            "the conclusion and the ledger's stall refusal run on rank 0, and a TP state needs "
            "both ranks and the gateway's fallback). Nothing was changed. Run it without "
            "--limit/--exclude; `pytest tests/verify` and `experiment.py status` may still look "
            "at a subset")


def lost_hosts(value: object, inherited_lock: object, state_name: str) -> list[str]:
    """
    The hosts a rollback may leave out: those its failed run lost (``--data
    lost_hosts``, a JSON list the failed run sets), which it cannot reach. Only
    a rollback (a run to production that inherits a lock) may; any other run
    moves the pair.
    """
    if not inherited_lock or state_name != "production" or value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise PartialRun(f"lost_hosts must be a JSON list of host names, not {value!r}")
    return value


def whole_pair(hosts: Iterable[Host], in_limit: Callable[[Host], bool], state_name: str,
               lost: Iterable[str] = ()) -> None:
    """
    Raise :class:`PartialRun` unless every host of the pair is in this run, or
    ``lost`` (:func:`lost_hosts`); a rollback restores production on the rest.
    """
    missing = [name for name in left_out(hosts, in_limit) if name not in lost]
    if missing:
        raise PartialRun(refusal(missing, state_name))
