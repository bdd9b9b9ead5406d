"""The link layer: trained at the expected rate on both sides, carrier, the peer
answering across thunderbolt0 and nowhere else.

Only the TP states use the link. In a state that does not (production), a link
that falls short is reported as a warning, not a failure: the replicas serve
without it, and leaving production refuses such a link before any change.
"""

from __future__ import annotations

import warnings

from operations.states import State
from operations.thunderbolt.link import XDOMAIN_PEERS


class UnusedLinkWarning(UserWarning):
    """The link falls short in a state that does not use it."""


def holds(state: State, condition: bool, message: str) -> None:
    if state.uses_link:
        assert condition, message
    elif not condition:
        warnings.warn(UnusedLinkWarning(f"{message} ({state.name} does not use the link)"),
                      stacklevel=2)


DEVICES = "/sys/bus/thunderbolt/devices"


def xdomain_peers(workstation) -> list[str]:
    """The XDomain peers' sysfs directories, found as the link layer finds them."""
    listing = workstation.host.check_output(XDOMAIN_PEERS + 'echo "$d"; done; true')
    return listing.split()


def test_exactly_one_xdomain_peer_is_connected(workstation, state: State) -> None:
    peers = xdomain_peers(workstation)
    holds(state, len(peers) == 1,
          f"{workstation.name}: {len(peers)} XDomain peers under {DEVICES} "
          f"({', '.join(peers) or 'none'}); twinbolt drives exactly one")


def test_link_trained_at_the_expected_rate_and_lanes(workstation, state: State) -> None:
    link = workstation.settings.link
    expected_rate, expected_lanes = link.expected_rate_gbps, link.expected_lanes
    peers = xdomain_peers(workstation)
    holds(state, bool(peers), f"{workstation.name}: no XDomain peer is connected ({DEVICES})")
    for side in ("rx", "tx") if peers else ():
        speed = workstation.host.file(f"{peers[0]}/{side}_speed").content_string.strip()
        lanes = int(workstation.host.file(f"{peers[0]}/{side}_lanes").content_string)
        rate = float(speed.split()[0]) * lanes
        holds(state, rate == expected_rate and lanes == expected_lanes,
              f"{workstation.name}: {side} trained at {speed} x {lanes} lane(s) = {rate:g} Gb/s, "
              f"expected {expected_rate:g} Gb/s over {expected_lanes}; check the cable, then "
              "reload the driver")


def test_interface_has_carrier_and_its_address(workstation, state: State) -> None:
    settings = workstation.settings
    address = settings.link_address
    interface = workstation.host.interface(settings.link.interface)
    holds(state, interface.exists, f"{workstation.name}: {interface.name} does not exist")
    if not interface.exists:
        return
    carrier = workstation.host.file(f"/sys/class/net/{interface.name}/carrier")
    holds(state, carrier.content_string.strip() == "1",
          f"{workstation.name}: {interface.name} has no carrier")
    holds(state, address in interface.addresses,
          f"{workstation.name}: {interface.name} has {interface.addresses}, not {address}")


def test_peer_answers_across_thunderbolt0(workstation, state: State) -> None:
    settings = workstation.settings
    interface, peer = settings.link.interface, settings.peer_link_address
    ping = workstation.host.run(f"ping -c 1 -i 0.2 -w 2 -I {interface} {peer}")
    holds(state, ping.rc == 0,
          f"{workstation.name}: {peer} does not answer across {interface}: {ping.stdout.strip()}")
    route = workstation.host.run(f"ip route get {peer}")
    holds(state, f"dev {interface}" in route.stdout,
          f"{workstation.name}: traffic to the peer does not leave by {interface}: "
          f"{(route.stdout or route.stderr).strip()}")
