"""
A run moves whole pairs, with the gateway, or nothing.

The rollback, the conclusion and the ledger's stall refusal speak through rank 0,
and a TP state needs both workstations of its pair and the gateway's route at
once. A run that ``--limit`` or ``--exclude`` leaves one workstation of a pair out
would load the candidate on the other despite a recorded stall, start rank 1
alone behind a dummy ``/health``, and end without a rollback or a ledger line.
So it is refused before anything is read or changed. A run may leave whole pairs
out (``--limit pair_b``: a pair's group holds its gateway too), never the
gateway, which fronts every pair. Read-only commands (``pytest tests/verify``,
``experiment.py status`` and ``diagnose``) may still look at a subset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pyinfra.api import Host
from pyinfra.api.exceptions import PyinfraError

from operations.site.model import PAIR_GROUP_PREFIX

PAIR_GROUPS = ("workstations", "gateway")


class PartialRun(PyinfraError):
    """A run that splits a pair or leaves the gateway out; pyinfra prints it and exits non-zero."""


def pairs_of(host: Host) -> set[str]:
    """The pair groups a workstation is in (one); none for the gateway, whose pairs are all."""
    if "workstations" not in host.groups:
        return set()
    return {group for group in host.groups if group.startswith(PAIR_GROUP_PREFIX)}


def left_out(hosts: Iterable[Host], in_limit: Callable[[Host], bool]) -> list[str]:
    """
    The hosts this run must reach and would not, in inventory order: the gateway,
    and the peer of every workstation it reaches; every workstation when it
    reaches none, since a run moves at least one pair.
    """
    hosts = list(hosts)
    touched = {pair for host in hosts if in_limit(host) for pair in pairs_of(host)}
    return [host.name for host in hosts if not in_limit(host) and (
        "gateway" in host.groups
        or ("workstations" in host.groups and (not touched or pairs_of(host) & touched)))]


def reached(inventory: Iterable[Host], in_limit: Callable[[Host], bool]) -> list[Host]:
    """The run's hosts, workstations first (the first not lost speaks for it), then the gateway."""
    hosts = list(inventory)
    return [host for group in PAIR_GROUPS for host in hosts
            if group in host.groups and in_limit(host)]


def refusal(missing: list[str], state_name: str) -> str:
    return (f"refused: --limit/--exclude leaves {', '.join(missing)} out of this run; a run to "
            f"{state_name} moves both workstations of each pair it reaches and the gateway as "
            "one unit (the rollback, the conclusion and the ledger's stall refusal run on "
            "rank 0, a TP state needs both ranks, and the gateway fronts every pair). Nothing "
            "was changed. Run it without --limit/--exclude, or limit it to whole pairs "
            f"(--limit {PAIR_GROUP_PREFIX}<name>: each pair's group holds the gateway too); "
            "`pytest tests/verify` and `experiment.py status` may still look at a subset")


def lost_hosts(value: object, inherited_lock: object, state_name: str) -> list[str]:
    """
    The hosts a rollback may leave out: those its failed run lost (``--data
    lost_hosts``, a JSON list the failed run sets), which it cannot reach. Only
    a rollback (a run to production that inherits a lock) may; any other run
    moves whole pairs.
    """
    if not inherited_lock or state_name != "production" or value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise PartialRun(f"lost_hosts must be a JSON list of host names, not {value!r}")
    return value


def whole_pairs(hosts: Iterable[Host], in_limit: Callable[[Host], bool], state_name: str,
                lost: Iterable[str] = ()) -> None:
    """
    Raise :class:`PartialRun` unless this run reaches each pair it touches whole,
    and the gateway, but for ``lost`` (:func:`lost_hosts`): a rollback restores
    production on the rest.
    """
    missing = [name for name in left_out(hosts, in_limit) if name not in lost]
    if missing:
        raise PartialRun(refusal(missing, state_name))
