"""Each lab fault does what it says, and switching it off leaves no trace."""

from __future__ import annotations

import pytest
from lab_helpers import carrier, linked, load, read, ssh, transfer, wait_until

from lab import faults
from operations.safety.ledger import ThunderboltController

pytestmark = pytest.mark.usefixtures("restore_stock")


def test_unknown_fault_is_refused_with_the_list() -> None:
    with pytest.raises(KeyError, match="tx_credit_stall"):
        faults.switch("no_such_fault", True)


def assert_only_tx_e2e_stalls() -> None:
    """The stock driver moves data; the candidate with tx_e2e=1 at both ends moves nothing."""
    assert transfer(64 << 20, timeout=15) == 64 << 20, "stock driver must be unaffected"
    for host in ("wsa", "wsb"):
        load(host, "candidate", "tx_e2e=1")
    for host in ("wsa", "wsb"):
        wait_until(lambda host=host: linked(host))
    assert ssh("wsa", "ping -c 2 -W 1 169.254.77.2", check=False).returncode != 0
    assert transfer(64 << 20, timeout=5) == 0


def controller(host: str) -> dict | None:
    """The host's controller as the ledger's own fact reads it, over SSH."""
    fact = ThunderboltController()
    return fact.process(ssh(host, fact.command()).stdout.splitlines())


def test_tx_credit_stall_is_a_firmware_that_stops_all_traffic_under_tx_e2e_only() -> None:
    """Each host router shows the stalling firmware's NVM version while the fault is on."""
    assert {controller(host)["nvm_version"] for host in ("wsa", "wsb")} == {"36.0"}
    faults.switch("tx_credit_stall", True)
    wait_until(lambda: {controller(host)["nvm_version"] for host in ("wsa", "wsb")} == {"35.0"},
               timeout=2)
    assert_only_tx_e2e_stalls()


def test_asm4242_gives_wsb_that_controller_and_stalls_the_link_under_tx_e2e_only() -> None:
    """A real host's sysfs: domain0 links to its NHI, a PCI device with the chip's ids."""
    assert controller("wsb") == {"domain": "domain0", "nhi": "8086:1137",
                                 "router": "Intel JHL8540 (8087:1137)", "nvm_version": "36.0"}
    faults.switch("asm4242", True)
    wait_until(lambda: controller("wsb")["nhi"] == "1b21:2425", timeout=2)
    assert controller("wsb")["router"] == "ASMedia ASM4242 (1b21:2425)"
    assert controller("wsb")["nvm_version"] == "2.1"
    assert controller("wsa")["nhi"] == "8086:1137"
    assert_only_tx_e2e_stalls()


def test_peer_no_e2e_clears_bit_zero_of_the_peer_capabilities() -> None:
    faults.switch("peer_no_e2e", True)
    wait_until(lambda: read("wsa", "/sys/bus/thunderbolt/devices/0-3.0/prtcstns")
               == "0x00000006", timeout=2)
    faults.switch("peer_no_e2e", False)
    wait_until(lambda: read("wsa", "/sys/bus/thunderbolt/devices/0-3.0/prtcstns")
               == "0x00000007", timeout=2)


def test_link_10g_makes_the_next_retrain_slow() -> None:
    faults.switch("link_10g", True)
    ssh("wsa", "rmmod thunderbolt_net; modprobe thunderbolt_net")
    wait_until(lambda: carrier("wsa"))
    assert read("wsa", "/sys/bus/thunderbolt/devices/0-3/rx_speed") == "10.0 Gb/s"
    assert "rate 10Gbit" in ssh("wsa", "tc qdisc show dev thunderbolt0").stdout


def test_switching_link_10g_off_reseats_the_cable_and_the_link_retrains_at_20g() -> None:
    faults.switch("link_10g", True)
    ssh("wsa", "rmmod thunderbolt_net; modprobe thunderbolt_net")
    wait_until(lambda: read("wsa", "/sys/bus/thunderbolt/devices/0-3/rx_speed") == "10.0 Gb/s")
    faults.switch("link_10g", False)
    wait_until(lambda: not carrier("wsa"), timeout=2)
    wait_until(lambda: read("wsa", "/sys/bus/thunderbolt/devices/0-3/rx_speed") == "20.0 Gb/s")
    wait_until(lambda: carrier("wsa"))
    # No longer held to 10 Gb/s: on a wire faster than the receiver's drain, a stock
    # sender is not shaped at all (lab.kernel.sending).
    assert "tbf" not in ssh("wsa", "tc qdisc show dev thunderbolt0").stdout


def test_server_faults_are_visible_to_every_host() -> None:
    for name in ("draft_init_crash", "rank_hang"):
        faults.switch(name, True)
        for host in ("wsa", "wsb", "gw"):
            assert ssh(host, f"test -e {faults.FAULTS_DIR / name}", check=False).returncode == 0
        faults.switch(name, False)
        assert not faults.is_on(name)
