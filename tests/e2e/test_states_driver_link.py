"""The driver and link layers, end to end: transitions, idempotency, refusals."""

from __future__ import annotations

from e2e_helpers import deploy, fault, snapshot, ssh, verify


def test_production_to_tp2_e2e_and_back_each_verified() -> None:
    for state in ("tp2_e2e", "production"):
        run = deploy(state)
        assert run.returncode == 0, run.output[-3000:]
        checks = verify(state)
        assert checks.returncode == 0, checks.stdout[-3000:]


def test_a_second_run_changes_nothing_and_dry_predicts_nothing() -> None:
    first = deploy("production")
    assert first.returncode == 0, first.output[-3000:]
    second = deploy("production")
    assert second.returncode == 0
    assert second.changed_hosts() == set(), second.output[-3000:]
    dry = deploy("production", "--dry")
    assert dry.returncode == 0
    assert "Would change" not in dry.output or "(wsa" not in dry.output


def test_unknown_state_is_refused_before_connecting() -> None:
    before = snapshot()
    run = deploy("tp3_turbo")
    assert run.returncode != 0
    assert "unknown state 'tp3_turbo'" in run.output and "tp2_e2e_nospec" in run.output
    assert "Connecting" not in run.output
    assert snapshot() == before


def test_wrong_candidate_checksum_changes_nothing() -> None:
    before = snapshot()
    run = deploy("tp2_e2e", "--data", "candidate_sha256=" + "ab" * 32)
    assert run.returncode != 0
    assert "but the pinned one is abab" in run.output
    assert snapshot() == before


def test_peer_without_e2e_is_refused_before_either_host_changes() -> None:
    before = snapshot()
    with fault("peer_no_e2e"):
        run = deploy("tp2_e2e")
    assert run.returncode != 0
    assert "does not advertise E2E" in run.output and "prtcstns 0x00000006" in run.output
    assert snapshot() == before


def test_a_link_that_trains_at_10g_is_a_link_error_naming_host_and_rates() -> None:
    with fault("link_10g"):
        run = deploy("tp2_e2e")
    assert run.returncode != 0
    assert "link layer" in run.output
    assert "trained at 10 Gb/s" in run.output and "expected 20 Gb/s" in run.output
    assert "wsa" in run.output or "wsb" in run.output
    restored = deploy("production")
    assert restored.returncode == 0, restored.output[-3000:]
    assert "20.0 Gb/s" in ssh("wsa", "cat /sys/bus/thunderbolt/devices/0-1/rx_speed")
