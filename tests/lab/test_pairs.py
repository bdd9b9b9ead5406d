"""
Two pairs behind one gateway (``python -m lab up --pairs 2``): each cable carries
its own pair's traffic and is pulled alone, and a fault switched on for one pair
bites its hosts alone. The test leaves the one-pair lab the rest of the suite uses.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator

import pytest
from lab_helpers import carrier, lab, linked, ssh, wait_until

from lab import network
from lab.control import processes
from lab.topology import EVERY_HOST, PAIRS_FILE, REPO, host_named, pair_named, read_pid

PAIRS = {"a": ("wsa", "wsb"), "b": ("wsc", "wsd")}
PAIRS_B = pair_named("b").workstations
# Whether the simulator on a host, asking as it does for its own host, finds the fault on.
SIMULATOR_SEES = (f"cd {REPO} && PYTHONPATH=. .venv/bin/python -c 'from lab.sglang_sim.knobs "
                  "import Knobs; print(Knobs.from_env().fault_on(\"draft_init_crash\"))'")


@pytest.fixture(scope="module", autouse=True)
def two_pairs() -> Iterator[None]:
    built = lab("up", "--pairs", "2")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "rebuilding" in built.stdout and "2 pairs" in built.stdout, built.stdout
    yield
    restored = lab("up")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "1 pair)" in lab("status").stdout


def answers_across_the_link(host: str) -> bool:
    """The peer answers ``host``'s ping across its own thunderbolt0."""
    peer = host_named(host_named(host).peer or "").link_address
    return ssh(host, f"ping -q -c 1 -W 1 -I thunderbolt0 {peer}", check=False).returncode == 0


def test_status_shows_each_pair_its_cable_and_its_hosts() -> None:
    shown = lab("status")
    assert shown.returncode == 0, shown.stdout
    assert "up (systemd, 2 pairs)" in shown.stdout or "up (runit, 2 pairs)" in shown.stdout
    for pair, hosts in PAIRS.items():
        assert f"pair {pair}: cable plugged, trains at 20 Gb/s" in shown.stdout
        for host in hosts:
            address = host_named(host).management_address
            assert re.search(rf"\b{host}\s+{address}\s+sshd up\s+thunderbolt0 .* carrier",
                             shown.stdout), host


def test_each_pairs_ranks_reach_each_other_across_their_own_cable() -> None:
    for hosts in PAIRS.values():
        for host in hosts:
            wait_until(lambda host=host: linked(host), timeout=10, what=f"{host} linked")
            assert answers_across_the_link(host), host
    # The cables are two: pair b's link does not reach pair a's.
    assert ssh("wsc", "ping -q -c 1 -W 1 -I thunderbolt0 169.254.77.2",
               check=False).returncode != 0


def test_unplugging_wsc_drops_pair_bs_link_and_leaves_pair_as_up() -> None:
    unplugged = lab("unplug", "wsc")
    assert unplugged.returncode == 0, unplugged.stderr
    try:
        assert not carrier("wsc") and not carrier("wsd")
        assert answers_across_the_link("wsa") and answers_across_the_link("wsb")
        assert "pair b: cable unplugged from wsc" in lab("status").stdout
    finally:
        plugged = lab("plug", "wsc")
    assert plugged.returncode == 0, plugged.stderr
    assert answers_across_the_link("wsc")


def test_a_fault_on_for_pair_b_bites_pair_bs_simulators_alone() -> None:
    switched = lab("fault", "draft_init_crash", "on", "--pair", "b")
    assert switched.returncode == 0, switched.stderr
    try:
        assert "faults: draft_init_crash (wsc, wsd)" in lab("status").stdout
        seen = {host: ssh(host, SIMULATOR_SEES).stdout.strip() for host in ("wsa", "wsd")}
        assert seen == {"wsa": "False", "wsd": "True"}
    finally:
        assert lab("fault", "draft_init_crash", "off").returncode == 0


def test_a_stale_two_pair_lab_without_its_record_is_rebuilt_as_one_pair() -> None:
    """A session's processes die, its namespaces survive, and the record of the pairs is gone."""
    for name in processes(EVERY_HOST):
        if (pid := read_pid(name)) is not None:
            os.kill(pid, signal.SIGKILL)
    PAIRS_FILE.unlink()
    rebuilt = lab("up")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert "stale" in rebuilt.stdout and "1 pair)" in rebuilt.stdout, rebuilt.stdout
    gone = [*(host.name for host in PAIRS_B), *(network.parking(host) for host in PAIRS_B)]
    assert not [name for name in gone if network.netns_exists(name)]
    assert not network.link_exists("tblab-wsc")
