"""
The link layer as a harness reads a host: the XDomain peer and the rate it
trained at, the interface, and the peer answering across it.

Status, diagnose and a window's counters read the same facts as the link step,
and judge them by its judges (:func:`cable_problems`, :func:`interface_problems`,
:func:`silent_peer`).
"""

from __future__ import annotations

from typing import Any

from operations.plumbing.reading import Judgement, Query
from operations.site.settings import WorkstationSettings
from operations.thunderbolt.link import (
    ExpectedLink,
    InterfaceState,
    PeerAnswers,
    XDomainLink,
    cable_problems,
    interface_problems,
    silent_peer,
    trained_rate,
)

# Where status shows this layer's lines of a workstation.
SECTION = "link"

def trained(settings: WorkstationSettings) -> list[Query]:
    """The XDomain peer alone: the rate a window's roofline prices the link at."""
    return [Query("xdomain", XDomainLink())]


def reading(settings: WorkstationSettings) -> list[Query]:
    """The XDomain peer, and the interface: its carrier and addresses."""
    return [*trained(settings), Query("interface", InterfaceState(),
                                  {"interface": ExpectedLink.of(settings).interface})]


def answers(settings: WorkstationSettings) -> list[Query]:
    """Whether the peer answers across the interface: what a stalled link no longer does."""
    link = ExpectedLink.of(settings)
    return [Query("answers", PeerAnswers(),
                  {"address": link.peer_link_address, "interface": link.interface})]


def judge_cable(settings: WorkstationSettings, values: dict[str, Any]) -> Judgement:
    """
    The XDomain peer: the rate the link trained at (``rate``: Gb/s and lanes,
    ``None`` without a peer) and the line an operator reads (``seen``); the
    cable's problems.
    """
    link = ExpectedLink.of(settings)
    xdomain = values["xdomain"]
    rate = trained_rate(xdomain) if xdomain else None
    found, _ = cable_problems(xdomain, link.expected_rate_gbps, link.expected_lanes)
    return Judgement({"rate": rate, "seen": f"{rate[0]:g} Gb/s ({rate[1]} lane(s)) to "
                                            f"{xdomain['peer']}" if rate else "no XDomain peer"},
                     found)


def judge_interface(settings: WorkstationSettings, values: dict[str, Any]) -> Judgement:
    """
    The interface: whether it has ``carrier`` and the line an operator reads
    (``seen``); why it cannot carry traffic, and, where the peer's ``answers``
    were read, a silent peer across a link with carrier.
    """
    link = ExpectedLink.of(settings)
    seen = values["interface"]
    found = interface_problems(seen, link.interface, link.link_address, link.address_owner)
    carrier = seen["exists"] and seen["carrier"]
    if carrier and "answers" in values and not values["answers"]:
        found.append(silent_peer(link.interface, link.peer_link_address))
    addresses = ", ".join(seen["addresses"]) or "no address"
    return Judgement({"carrier": carrier, "seen": f"{link.interface} "
                      f"{'carrier' if seen['carrier'] else 'no carrier'}, {addresses}"}, found)


def judge(settings: WorkstationSettings, values: dict[str, Any]) -> Judgement:
    """
    The cable and the interface together: the link's ``rate`` and the line an
    operator reads (``seen``); both judges' problems.
    """
    cable, interface = judge_cable(settings, values), judge_interface(settings, values)
    return Judgement({"rate": cable.observed["rate"],
                      "seen": f"{cable.observed['seen']}; {interface.observed['seen']}"},
                     cable.problems + interface.problems)
