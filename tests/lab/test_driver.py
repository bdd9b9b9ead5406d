"""The simulated thunderbolt_net keeps the kernel semantics twinbolt relies on."""

from __future__ import annotations

import subprocess
import time

import pytest
from lab_helpers import carrier, linked, load, read, ssh, wait_until

from lab import faults
from lab.modules import CANDIDATE, STOCK, build_id
from lab.ssh import CLIENT_CONFIG

pytestmark = pytest.mark.usefixtures("restore_stock")
STOCK_PATH = "/lib/modules/$(uname -r)/kernel/drivers/net/thunderbolt/thunderbolt_net.ko.zst"


def loaded_build_id(host: str) -> str:
    note = ssh(host, "od -An -tx1 -v /sys/module/thunderbolt_net/notes/.note.gnu.build-id")
    return "".join(note.stdout.split())[32:]


def test_real_modinfo_reads_the_compressed_stock_file_that_modprobe_would_load() -> None:
    assert ssh("wsa", "modinfo -n thunderbolt_net").stdout.strip().endswith(
        "kernel/drivers/net/thunderbolt/thunderbolt_net.ko.zst")
    # As on Ubuntu 24.04: readelf cannot read the file modprobe loads.
    assert ssh("wsa", f"readelf -n {STOCK_PATH}", check=False).returncode != 0
    info = ssh("wsa", f"modinfo {STOCK_PATH}").stdout
    assert "name:           thunderbolt_net" in info
    assert "parm:           e2e:" in info and "tx_e2e" not in info
    assert ssh("wsa", "uname -r").stdout.strip() in info


def test_boot_loads_the_stock_driver_with_rx_e2e_on() -> None:
    assert read("wsa", "/sys/module/thunderbolt_net/initstate") == "live"
    assert read("wsa", "/sys/module/thunderbolt_net/parameters/e2e") == "Y"
    assert ssh("wsa", "test -e /sys/module/thunderbolt_net/parameters/tx_e2e",
               check=False).returncode == 1
    assert loaded_build_id("wsa") == build_id(STOCK)


def test_candidate_insmod_with_tx_e2e_creates_the_parameter() -> None:
    load("wsa", "candidate", "tx_e2e=1")
    assert read("wsa", "/sys/module/thunderbolt_net/parameters/tx_e2e") == "Y"
    assert loaded_build_id("wsa") == build_id(CANDIDATE)


def test_stock_insmod_ignores_tx_e2e_and_still_loads() -> None:
    ssh("wsa", f"rmmod thunderbolt_net; insmod {STOCK_PATH} tx_e2e=1")
    assert read("wsa", "/sys/module/thunderbolt_net/initstate") == "live"
    assert ssh("wsa", "test -e /sys/module/thunderbolt_net/parameters/tx_e2e",
               check=False).returncode == 1
    assert "unknown parameter 'tx_e2e' ignored" in read("wsa", "/var/log/kern.log")


def test_insmod_refuses_a_loaded_module_and_a_foreign_vermagic(tmp_path) -> None:
    again = ssh("wsa", f"insmod {STOCK_PATH}", check=False)
    assert again.returncode == 1 and "File exists" in again.stderr
    foreign = tmp_path / "foreign.ko"
    release = ssh("wsa", "uname -r").stdout.strip().encode()
    foreign.write_bytes(CANDIDATE.read_bytes().replace(release, b"9".ljust(len(release), b"x")))
    subprocess.run(["scp", "-q", "-F", str(CLIENT_CONFIG),
                    str(foreign), "wsa:/tmp/foreign.ko"], check=True)
    refused = ssh("wsa", "rmmod thunderbolt_net; insmod /tmp/foreign.ko", check=False)
    assert refused.returncode == 1 and "Invalid module format" in refused.stderr
    assert ssh("wsa", "test -e /sys/module/thunderbolt_net", check=False).returncode == 1


def test_rmmod_takes_the_link_down_and_modprobe_brings_it_back_after_retraining() -> None:
    ssh("wsa", "rmmod thunderbolt_net")
    assert not carrier("wsa")
    wait_until(lambda: not carrier("wsb"), timeout=2)
    ssh("wsa", "modprobe thunderbolt_net")
    assert not carrier("wsa"), "the link came back without a retrain delay"
    retrain = wait_until(lambda: carrier("wsa"), timeout=10)
    assert 0.5 <= retrain <= 5
    assert read("wsa", "/sys/bus/thunderbolt/devices/0-3/rx_speed") == "20.0 Gb/s"
    wait_until(lambda: linked("wsa") and linked("wsb"), timeout=10)
    # The stock driver's receivers drop a frame now and then (1.6% a round trip here):
    # one echo of three must come back.
    assert ssh("wsa", "ping -c 3 -i 0.2 -W 2 169.254.77.2", check=False).returncode == 0


def test_xdomain_sysfs_shows_the_peer_beside_a_dock_and_its_network_service() -> None:
    devices = "/sys/bus/thunderbolt/devices"
    # A dock with a faster link sits at a lower index; only the peer is an XDomain.
    assert read("wsa", f"{devices}/0-1/uevent") == "DEVTYPE=thunderbolt_device"
    assert read("wsa", f"{devices}/0-1/rx_lanes") == "2"
    assert read("wsa", f"{devices}/0-3/uevent") == "DEVTYPE=thunderbolt_xdomain"
    device = f"{devices}/0-3"
    assert read("wsa", f"{device}/device_name") == "wsb"
    assert read("wsb", f"{device}/device_name") == "wsa"
    assert read("wsa", f"{device}/rx_lanes") == "1"
    assert read("wsa", f"{device}.0/key") == "network"
    assert read("wsa", f"{device}.0/prtcstns") == "0x00000007"


def test_under_sig_enforce_the_unsigned_candidate_is_refused_and_the_signed_stock_loads() -> None:
    """What the preflight's refusal prevents: the stock driver gone, the candidate refused."""
    faults.switch("sig_enforce", True)
    try:
        assert read("wsa", "/sys/module/module/parameters/sig_enforce") == "Y"
        refused = ssh("wsa", f"rmmod thunderbolt_net; insmod {CANDIDATE}", check=False)
        assert refused.returncode != 0
        assert "Key was rejected by service" in refused.stderr
        assert "Loading of unsigned module is rejected" in read("wsa", "/var/log/kern.log")
        # The distribution's stock file is signed: production's driver still loads.
        ssh("wsa", "modprobe thunderbolt_net")
        assert loaded_build_id("wsa") == build_id(STOCK)
    finally:
        faults.switch("sig_enforce", False)
    assert read("wsa", "/sys/module/module/parameters/sig_enforce") == "N"


def test_rmmod_removes_the_interface_and_a_load_makes_it_anew_without_its_address() -> None:
    ssh("wsa", "rmmod thunderbolt_net")
    wait_until(lambda: ssh("wsa", "test -e /sys/class/net/thunderbolt0", check=False).returncode
               == 1, timeout=2, what="thunderbolt0 gone with the driver")
    wait_until(lambda: not carrier("wsb"), timeout=2, what="the peer's carrier gone")
    ssh("wsa", "modprobe thunderbolt_net")
    wait_until(lambda: carrier("wsa"), timeout=10)
    assert "169.254.77.1" not in ssh("wsa", "ip -br addr show thunderbolt0").stdout
    # The host's network manager applies it, about 2 s after the link comes up.
    wait_until(lambda: linked("wsa"), timeout=10)
    # The simulated receiver counters sit over the new device's statistics again.
    wait_until(lambda: ssh("wsa", "findmnt -n /sys/class/net/thunderbolt0/statistics",
                           check=False).returncode == 0, timeout=2)


def test_without_a_network_manager_a_reload_leaves_the_link_without_its_address() -> None:
    faults.switch("no_network_manager", True)
    try:
        ssh("wsa", "rmmod thunderbolt_net; modprobe thunderbolt_net")
        wait_until(lambda: carrier("wsa"), timeout=10)
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert not linked("wsa"), "something but twinbolt applied the address"
    finally:
        faults.switch("no_network_manager", False)
    wait_until(lambda: linked("wsa"), timeout=10, what="the address applied again")
