"""
The lab kernel's controllers, read by the ledger's own fact from the files the
kernel writes: the host router's NVM firmware follows ``tx_credit_stall``, and
that firmware is what withholds the TX credits. Pair b's controllers run a later
firmware than pair a's, and a fault switched on for one pair leaves the other's
controllers as they were.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab import faults, kernel, topology
from lab.kernel import HostLink, ModuleState
from lab.topology import NHI_SLOT, host_named, pair_named, workstations
from operations.safety.ledger import ThunderboltController

CANDIDATE = ModuleState(loaded_at=1.0, parameters={"e2e": "Y", "tx_e2e": "Y"})


@pytest.fixture
def links(monkeypatch, tmp_path) -> dict[str, HostLink]:
    """Each workstation's files under a state of this test's own, ``domain0`` as hostfs lays it."""
    monkeypatch.setattr(topology, "STATE", tmp_path)
    monkeypatch.setattr(faults, "FAULTS_DIR", tmp_path / "faults")
    for host in workstations(2):
        (host.root / "sys-bus" / "pci" / "devices" / NHI_SLOT / "domain0").mkdir(parents=True)
        devices = host.root / "sys-bus" / "thunderbolt" / "devices"
        devices.mkdir(parents=True)
        (devices / "domain0").symlink_to(f"../../pci/devices/{NHI_SLOT}/domain0")
    return {host.name: HostLink(host) for host in workstations(2)}


def controllers(links: dict[str, HostLink]) -> dict[str, dict | None]:
    """One tick's routers written, then each host's controller as the deploy reads it."""
    fact = ThunderboltController()
    read = {}
    for name, link in links.items():
        kernel.write_device_routers(link)
        command = fact.command().replace("/sys/bus/", f"{link.host.root}/sys-bus/")
        output = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
        read[name] = fact.process(output.splitlines())
    return read


def stalled(links: dict[str, HostLink], pair: str = "a") -> bool:
    rank0, rank1 = pair_named(pair).workstations
    return kernel.sending(links[rank0.name], CANDIDATE, rank1, CANDIDATE, 20.0).stalled


HEALTHY = {"domain": "domain0", "nhi": "8086:1137", "router": "Intel JHL8540 (8087:1137)",
           "nvm_version": "36.0"}
# Pair b's controllers: the same chip on a later NVM firmware, a row of its own in the ledger.
LATER_NVM = {**HEALTHY, "nvm_version": "40.0"}


def test_each_host_router_shows_its_firmware_and_tx_credit_stall_switches_it(links) -> None:
    each_pairs = {"wsa": HEALTHY, "wsb": HEALTHY, "wsc": LATER_NVM, "wsd": LATER_NVM}
    assert controllers(links) == each_pairs
    assert not stalled(links) and not stalled(links, "b")

    faults.switch("tx_credit_stall", True)
    assert controllers(links) == {name: {**HEALTHY, "nvm_version": "35.0"} for name in links}
    assert stalled(links) and stalled(links, "b")

    faults.switch("tx_credit_stall", False)
    assert controllers(links) == each_pairs
    assert not stalled(links) and not stalled(links, "b")


def test_the_asm4242_shows_its_own_firmware_and_withholds_credits_on_any(links) -> None:
    faults.switch("asm4242", True)
    read = controllers(links)
    assert (read["wsb"]["nhi"], read["wsb"]["nvm_version"]) == ("1b21:2425", "2.1")
    assert (read["wsd"]["nhi"], read["wsd"]["nvm_version"]) == ("1b21:2425", "2.1")
    assert read["wsa"]["nvm_version"] == "36.0"
    assert stalled(links)
    faults.switch("tx_credit_stall", True)
    assert controllers(links)["wsb"]["nvm_version"] == "2.0"
    assert stalled(links)


def test_a_fault_on_for_one_pair_leaves_the_other_pairs_controllers_alone(links) -> None:
    faults.switch("tx_credit_stall", True, pair_named("b").workstations)
    read = controllers(links)
    assert (read["wsa"], read["wsb"]) == (HEALTHY, HEALTHY)
    assert read["wsc"]["nvm_version"] == read["wsd"]["nvm_version"] == "35.0"
    assert not stalled(links) and stalled(links, "b")

    faults.switch("asm4242", True, [host_named("wsd")])
    assert controllers(links)["wsd"]["nhi"] == "1b21:2425"
    assert controllers(links)["wsb"]["nhi"] == "8086:1137"


def test_a_process_that_ends_while_its_stat_is_read_is_not_alive(monkeypatch) -> None:
    """Its /proc file opened, then ESRCH on the read: gone, as a missing file is."""
    def vanished(self: Path, *args: object, **kwargs: object) -> str:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(Path, "read_text", vanished)
    assert topology.alive(123456) is False
