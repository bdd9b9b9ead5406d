"""The cable pulled and put back, and a workstation asleep: the link as real hardware does it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_helpers import carrier, counters, lab, linked, load, read, ssh, transfer, wait_until

from lab import cable, faults
from lab.topology import LINK_SPEED_GBPS, host_named, read_pid

pytestmark = pytest.mark.usefixtures("restore_stock")
PEER = "/sys/bus/thunderbolt/devices/0-3"


@pytest.fixture(autouse=True)
def cable_back() -> Iterator[None]:
    """The cable in again, whatever the test did (the stock driver is restore_stock's)."""
    yield
    wire = cable.read("a")
    if wire.plugged and wire.rate_gbps != LINK_SPEED_GBPS:
        assert lab("unplug", "wsa").returncode == 0
    if not cable.read("a").plugged:
        assert lab("plug", "wsa").returncode == 0
    for host in ("wsa", "wsb"):
        wait_until(lambda host=host: linked(host), timeout=10, what=f"{host} linked")


def interface_exists(host: str) -> bool:
    return ssh(host, "test -e /sys/class/net/thunderbolt0", check=False).returncode == 0


def peer_present(host: str) -> bool:
    return ssh(host, f"test -e {PEER}", check=False).returncode == 0


def test_an_unplug_takes_link_and_peer_away_and_tcp_across_it_stalls_until_the_plug() -> None:
    size = 4 << 30
    moved: list[int] = []
    before = counters("wsa")["retrans"]
    sending = threading.Thread(target=lambda: moved.append(transfer(size, timeout=60)))
    sending.start()
    wait_until(lambda: counters("wsb")["rx_bytes"] > 200 << 20, timeout=20,
               what="the transfer under way")
    unplugged = lab("unplug", "wsb")
    assert unplugged.returncode == 0, unplugged.stderr
    assert "cable unplugged from wsb" in unplugged.stdout
    for host in ("wsa", "wsb"):
        assert not interface_exists(host) and not peer_present(host), host
    # The module stays loaded, with its parameters, on both sides.
    assert read("wsb", "/sys/module/thunderbolt_net/parameters/e2e") == "Y"
    time.sleep(3)
    assert sending.is_alive(), "the transfer ended while the cable was out"
    plugged = lab("plug", "wsb")
    assert plugged.returncode == 0, plugged.stderr
    sending.join(timeout=60)
    # Stalled, not reset: TCP retransmitted, and once the cable was back every byte arrived.
    assert moved == [size]
    assert counters("wsa")["retrans"] > before


def test_a_plug_trains_at_the_rate_given_on_a_new_device_without_an_address() -> None:
    load("wsb", "candidate", "tx_e2e=1")
    wait_until(lambda: linked("wsb"), timeout=10, what="wsb linked on the candidate")
    assert counters("wsb")["rx_bytes"] > 0 or transfer(64 << 20) == 64 << 20
    assert lab("unplug", "wsa").returncode == 0
    faults.switch("no_network_manager", True)
    plugged = lab("plug", "wsa", "--rate", "10")
    assert plugged.returncode == 0, plugged.stderr
    assert "the link trained at 10 Gb/s" in plugged.stdout
    for host in ("wsa", "wsb"):
        wait_until(lambda host=host: carrier(host), timeout=10, what=f"{host} carrier")
        assert read(host, f"{PEER}/rx_speed") == "10.0 Gb/s"
        # A new thunderbolt0: no address until something applies one, counters from zero.
        assert "169.254." not in ssh(host, "ip -br addr show thunderbolt0").stdout
        assert counters(host)["rx_bytes"] < 1 << 20
    assert read("wsb", "/sys/module/thunderbolt_net/parameters/tx_e2e") == "Y"
    assert "rate" in lab("plug", "wsa", "--rate", "5").stderr
    assert "already plugged in" in lab("plug", "wsa").stderr


def test_a_suspended_workstation_freezes_drops_the_link_and_resumes_with_its_module() -> None:
    load("wsb", "candidate", "tx_e2e=1")
    wait_until(lambda: linked("wsb"), timeout=10, what="wsb linked on the candidate")
    host_process = read_pid(f"host-{host_named('wsb').name}")
    asleep = threading.Thread(target=lambda: lab("suspend", "wsb", "--seconds", "4"))
    started = time.monotonic()
    asleep.start()
    wait_until(lambda: cable.suspended() == ["wsb"], timeout=5, what="wsb asleep")
    wait_until(lambda: not peer_present("wsa") and not interface_exists("wsa"), timeout=5,
               what="wsa losing the link")
    state = Path(f"/proc/{host_process}/status").read_text()
    assert "State:\tT (stopped)" in state, state
    asleep.join(timeout=30)
    assert time.monotonic() - started >= 4
    for host in ("wsa", "wsb"):
        wait_until(lambda host=host: linked(host), timeout=10, what=f"{host} linked after wake")
    # The module kept its parameters through the sleep; the link retrained at its rate.
    assert read("wsb", "/sys/module/thunderbolt_net/parameters/tx_e2e") == "Y"
    assert read("wsa", f"{PEER}/rx_speed") == "20.0 Gb/s"
    assert transfer(64 << 20) == 64 << 20
