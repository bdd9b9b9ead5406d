"""
The link layer as a harness reads a host: the XDomain peer and the rate it
trained at, the interface, and the peer answering across it.

Status, diagnose and a window's counters read the same facts as the link step,
and judge them by its judges (:func:`cable_problems`, :func:`interface_problems`).
"""

from __future__ import annotations

from typing import Any, Protocol

from operations.plumbing.reading import Judgement, Query
from operations.thunderbolt.link import (
    ExpectedLink,
    InterfaceState,
    PeerAnswers,
    XDomainLink,
    cable_problems,
    interface_problems,
    trained_rate,
)


class Host(Protocol):
    """What the link layer reads a workstation by: the link it expects."""

    @property
    def expected_link(self) -> ExpectedLink: ...


def trained(host: Host) -> list[Query]:
    """The XDomain peer alone: the rate a window's roofline prices the link at."""
    return [Query("xdomain", XDomainLink())]


def reading(host: Host) -> list[Query]:
    """The XDomain peer, and the interface: its carrier and addresses."""
    return [*trained(host), Query("interface", InterfaceState(),
                                  {"interface": host.expected_link.interface})]


def answers(host: Host) -> list[Query]:
    """Whether the peer answers across the interface: what a stalled link no longer does."""
    link = host.expected_link
    return [Query("answers", PeerAnswers(),
                  {"address": link.peer_link_address, "interface": link.interface})]


def judge(host: Host, values: dict[str, Any]) -> Judgement:
    """
    The rate the link trained at (``rate``: Gb/s and lanes, ``None`` without a
    peer) and the line an operator reads (``seen``); the cable's and the
    interface's problems.
    """
    link = host.expected_link
    xdomain, interface = values["xdomain"], values["interface"]
    rate = trained_rate(xdomain) if xdomain else None
    peer = (f"{rate[0]:g} Gb/s ({rate[1]} lane(s)) to {xdomain['peer']}" if rate
            else "no XDomain peer")
    carrier = "carrier" if interface["carrier"] else "no carrier"
    addresses = ", ".join(interface["addresses"]) or "no address"
    cable, _ = cable_problems(xdomain, link.expected_rate_gbps, link.expected_lanes)
    return Judgement({"rate": rate, "seen": f"{peer}; {link.interface} {carrier}, {addresses}"},
                     cable + interface_problems(interface, link.interface, link.link_address,
                                                link.address_owner))
