"""The driver and link layers, end to end: transitions, idempotency, refusals."""

from __future__ import annotations

import time

from e2e_helpers import (
    client_figures,
    deploy,
    dry_run,
    fault,
    guard_disarmed,
    pyinfra_table,
    refusals,
    reported_changes,
    small_client,
    snapshot,
    ssh,
    verify,
)

from operations.gateway.proxy import DEPLOYMENTS


def test_production_to_tp2_e2e_and_back_each_verified() -> None:
    """
    A user asking ``small`` four times a second, with no retry of its own, for the
    whole round trip: every request answered 200 within 5 s, by the deployment each
    state implies. The proxy's config changes twice (the fallback added, then
    removed) and its port never closes.
    """
    legs = {}
    with small_client().asking() as client:
        time.sleep(1)
        for state in ("tp2_e2e", "production"):
            started = time.monotonic()
            run = deploy(state)
            legs[state] = (started, time.monotonic())
            assert run.returncode == 0, run.output[-3000:]
            checks = verify(state)
            assert checks.returncode == 0, checks.stdout[-3000:]
        time.sleep(1)
    to_tp, back = legs["tp2_e2e"], legs["production"]
    for what, (start, end) in {"to tp2_e2e": to_tp, "back to production": back}.items():
        print(f"small during the run {what} ({end - start:.1f}s): "
              f"{client_figures(client.between(start, end))}")
    assert client.answers and not refusals(client.answers), refusals(client.answers)
    # Between the legs small is served through the fallback; after, by the replicas again.
    assert {answer.served_by for answer in client.between(to_tp[1], back[0])} == {
        DEPLOYMENTS["large"]}
    assert {answer.served_by for answer in client.between(back[1])} == {DEPLOYMENTS["small"]}


def test_a_run_cut_between_the_reload_and_the_address_converges_when_run_again() -> None:
    """
    A run killed right after the driver reload leaves ``thunderbolt0`` without its
    address, and the peer unanswered on the other host; the next run's preflight
    must leave both to the link step, which applies the address. The run had
    disarmed both guards before the reload (an armed one applies the address itself).
    """
    run = deploy("tp2_e2e")
    assert run.returncode == 0, run.output[-3000:]
    for host in ("wsa", "wsb"):
        guard_disarmed(host)
    ssh("wsa", "ip addr flush dev thunderbolt0")
    assert "169.254.77.1" not in ssh("wsa", "ip -brief addr show dev thunderbolt0")
    again = deploy("tp2_e2e")
    assert again.returncode == 0, again.output[-3000:]
    assert "169.254.77.1/16" in ssh("wsa", "ip -brief addr show dev thunderbolt0")
    checks = verify("tp2_e2e")
    assert checks.returncode == 0, checks.stdout[-3000:]


def test_a_second_run_changes_nothing_and_dry_predicts_nothing() -> None:
    first = deploy("production")
    assert first.returncode == 0, first.output[-3000:]
    second = deploy("production")
    assert second.returncode == 0
    assert second.changed_hosts() == set(), second.output[-3000:]
    # --dry prints pyinfra's plan ("--> Detected changes:"): one row per operation,
    # with the hosts it would change and would change conditionally. Converged, no
    # row names a host.
    dry = dry_run("production")
    assert dry.returncode == 0, dry.output[-3000:]
    plan = pyinfra_table(dry.output, "Detected changes:")
    assert plan, dry.output[-3000:]
    assert reported_changes(plan) == {}, dry.output[-3000:]


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


def test_a_link_that_trains_at_10g_fails_the_experiment_and_production_is_restored() -> None:
    with fault("link_10g"):
        run = deploy("tp2_e2e")
        assert run.returncode != 0
        assert "wsa: link layer: the link to wsb trained at 10 Gb/s" in run.output
        assert "expected 20 Gb/s" in run.output
        # Production's replicas do not use the link: the cable does not fail the rollback.
        assert "production was restored and verified" in run.output, run.output[-3000:]
        assert "the target state does not use the link" in run.output
        for host in ("wsa", "wsb"):
            assert "tx_e2e" not in ssh(host, "ls /sys/module/thunderbolt_net/parameters")
        checks = verify("production")
        assert checks.returncode == 0, checks.stdout[-3000:]
        assert "trained at 10.0 Gb/s" in checks.stdout and "does not use the link" in checks.stdout
    # The cable re-seated, the link retrains at 20 Gb/s under the same stock driver.
    restored = deploy("production")
    assert restored.returncode == 0, restored.output[-3000:]
    assert "20.0 Gb/s" in ssh("wsa", "cat /sys/bus/thunderbolt/devices/0-3/rx_speed")
