"""The link layer: trained at the expected rate on both sides, carrier, the peer
answering across thunderbolt0 and nowhere else."""

from __future__ import annotations

DEVICE = "/sys/bus/thunderbolt/devices/0-1"


def test_link_trained_at_the_expected_rate_and_lanes(workstation) -> None:
    expected_rate = workstation.data["link_expected_rate_gbps"]
    expected_lanes = workstation.data["link_expected_lanes"]
    for side in ("rx", "tx"):
        speed = workstation.host.file(f"{DEVICE}/{side}_speed").content_string.strip()
        lanes = int(workstation.host.file(f"{DEVICE}/{side}_lanes").content_string)
        rate = float(speed.split()[0]) * lanes
        assert rate == expected_rate and lanes == expected_lanes, (
            f"{workstation.name}: {side} trained at {speed} x {lanes} lane(s) = {rate:g} Gb/s, "
            f"expected {expected_rate:g} Gb/s over {expected_lanes}; check the cable, then "
            "reload the driver")


def test_interface_has_carrier_and_its_address(workstation) -> None:
    address = workstation.data["thunderbolt_address"]
    interface = workstation.host.interface(workstation.data["link_interface"])
    assert interface.exists, f"{workstation.name}: {interface.name} does not exist"
    carrier = workstation.host.file(f"/sys/class/net/{interface.name}/carrier")
    assert carrier.content_string.strip() == "1", (
        f"{workstation.name}: {interface.name} has no carrier")
    assert address in interface.addresses, (
        f"{workstation.name}: {interface.name} has {interface.addresses}, not {address}")


def test_peer_answers_across_thunderbolt0(workstation) -> None:
    interface = workstation.data["link_interface"]
    peer = workstation.data["peer_thunderbolt_address"]
    ping = workstation.host.run(f"ping -c 1 -i 0.2 -w 2 -I {interface} {peer}")
    assert ping.rc == 0, (
        f"{workstation.name}: {peer} does not answer across {interface}: {ping.stdout.strip()}")
    route = workstation.host.check_output(f"ip route get {peer}")
    assert f"dev {interface}" in route, (
        f"{workstation.name}: traffic to the peer leaves by another interface: {route}")
