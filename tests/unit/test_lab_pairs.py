"""
The lab's pairs: which hosts and cables a lab of one or two pairs has, and a
fault switched on for one pair's hosts, as the lab kernel and the simulators
ask for it, each for its own host.
"""

from __future__ import annotations

import pytest

from lab import faults, topology
from lab.sglang_sim import knobs
from lab.sglang_sim.knobs import Knobs
from lab.topology import LabError, hosts, lab_pairs, pair_named, workstations


@pytest.fixture
def two_pairs(monkeypatch, tmp_path) -> None:
    """A lab recorded as two pairs, its faults under this test's own state."""
    monkeypatch.setattr(topology, "PAIRS_FILE", tmp_path / "pairs")
    monkeypatch.setattr(faults, "FAULTS_DIR", tmp_path / "faults")
    (tmp_path / "pairs").write_text("2\n")


def test_one_pair_is_the_demos_lab_and_two_add_a_pair_behind_the_same_gateway() -> None:
    assert [host.name for host in hosts(1)] == ["wsa", "wsb", "gw"]
    assert [host.name for host in hosts(2)] == ["wsa", "wsb", "wsc", "wsd", "gw"]
    assert [host.management_address for host in hosts(2)] == [
        "10.66.0.11", "10.66.0.12", "10.66.0.14", "10.66.0.15", "10.66.0.13"]
    assert [(host.ssh_user, host.pair) for host in workstations(2)] == [
        ("twinbolt", "a"), ("root", "a"), ("twinbolt", "b"), ("root", "b")]
    assert len({host.unique_id for host in workstations(2)}) == 4


def test_each_pair_has_its_own_cable_and_link_network() -> None:
    a, b = lab_pairs(2)
    assert (a.cable_bridge, b.cable_bridge) == ("cable0", "cable1")
    assert [host.link_address for host in a.workstations] == ["169.254.77.1", "169.254.77.2"]
    assert [host.link_address for host in b.workstations] == ["169.254.78.1", "169.254.78.2"]
    for pair in (a, b):
        rank0, rank1 = pair.workstations
        assert (rank0.peer, rank1.peer) == (rank1.name, rank0.name)
    ports = [host.cable_port for host in workstations(2)]
    assert len(set(ports)) == len(ports)


def test_the_pair_count_is_the_labs_record_and_one_without_it(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(topology, "PAIRS_FILE", tmp_path / "pairs")
    assert topology.pair_count() == 1 and [p.name for p in lab_pairs()] == ["a"]
    (tmp_path / "pairs").write_text("2\n")
    assert [host.name for host in workstations()] == ["wsa", "wsb", "wsc", "wsd"]


def test_the_gateway_has_no_pair() -> None:
    with pytest.raises(LabError, match="gw has no Thunderbolt link"):
        topology.pair_of(topology.GATEWAY)


@pytest.mark.parametrize(("scope", "on", "named", "after"), [
    (None, True, None, []),
    ([], False, None, None),
    (None, True, ["wsc", "wsd"], ["wsc", "wsd"]),
    (["wsc", "wsd"], True, ["wsa", "wsb"], ["wsc", "wsd", "wsa", "wsb"]),
    (["wsc", "wsd"], True, ["wsd"], ["wsc", "wsd"]),
    ([], True, ["wsc"], []),
    (["wsc", "wsd"], False, ["wsc", "wsd"], None),
    (None, False, ["wsc"], None),
    ([], False, ["wsc", "wsd"], ["wsa", "wsb", "gw"]),
])
def test_a_faults_hosts_after_a_switch(scope, on, named, after, monkeypatch, tmp_path) -> None:
    """``[]`` is every host, ``None`` off; off for some of every host leaves the lab's others."""
    monkeypatch.setattr(topology, "PAIRS_FILE", tmp_path / "pairs")
    (tmp_path / "pairs").write_text("2\n")
    assert faults.narrowed(scope, on, named) == after


def test_a_fault_on_for_pair_b_bites_its_hosts_alone(two_pairs) -> None:
    faults.switch("draft_init_crash", True, pair_named("b").workstations)
    assert [faults.is_on("draft_init_crash", name) for name in ("wsa", "wsb", "wsc", "wsd")] == [
        False, False, True, True]
    assert faults.is_on("draft_init_crash")
    assert faults.described() == ["draft_init_crash (wsc, wsd)"]

    faults.switch("draft_init_crash", False, pair_named("b").workstations)
    assert not faults.is_on("draft_init_crash") and faults.described() == []


def test_a_fault_on_for_every_host_then_off_for_one_pair_stays_on_for_the_rest(two_pairs) -> None:
    faults.switch("peer_no_e2e", True)
    assert faults.described() == ["peer_no_e2e"]
    assert all(faults.is_on("peer_no_e2e", host.name) for host in hosts())
    faults.switch("peer_no_e2e", False, pair_named("a").workstations)
    assert [faults.is_on("peer_no_e2e", name) for name in ("wsa", "wsb", "wsc", "wsd")] == [
        False, False, True, True]
    faults.clear()
    assert faults.active() == []


def test_the_gateways_fault_bites_no_pair_alone(two_pairs) -> None:
    with pytest.raises(LabError, match="fallback_down is the gateway's fault"):
        faults.switch("fallback_down", True, pair_named("b").workstations)
    assert not faults.is_on("fallback_down")


def test_the_simulator_asks_for_the_host_it_runs_on(two_pairs, monkeypatch) -> None:
    faults.switch("draft_init_crash", True, pair_named("b").workstations)
    simulator = Knobs(faults_dir=faults.FAULTS_DIR)
    for name, crashes in (("wsa", False), ("wsd", True)):
        monkeypatch.setattr(knobs.socket, "gethostname", lambda name=name: name)
        assert simulator.fault_on("draft_init_crash") is crashes
