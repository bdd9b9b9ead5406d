"""
Signals on the lab: a run interrupted mid-transition, as a terminal's Ctrl-C or a
service manager's stop interrupts it, ends in a verified production and says so.
"""

from __future__ import annotations

import os
import signal
import time
from functools import partial

from e2e_helpers import (
    client_figures,
    deploy,
    deploy_meanwhile,
    refusals,
    small_client,
    ssh,
    verify,
)

from operations.safety import ledger

# The steps a signal is sent in: the candidate being loaded, then the TP ranks starting.
AT_THE_DRIVER = "Driver: thunderbolt_net is the candidate build"
AT_THE_RANKS = "Serving: the TP ranks run"
# On the way back: the candidate being replaced.
AT_THE_STOCK_DRIVER = "Driver: thunderbolt_net is the stock build"
# Where it may land: the lab's insmod takes milliseconds, and the ranks' start
# about one second, so the signal, sent once the run has printed the step's
# title, may find the next step begun: the candidate is loaded in both, and the
# ranks started in both.
LANDS_IN = {AT_THE_DRIVER: (AT_THE_DRIVER, "Link: trained at the expected rate, the peer answers"),
            AT_THE_RANKS: (AT_THE_RANKS, "Serving: rank 0 serves a real completion as declared")}


def send(signum: int, sent: list[float], pid: int) -> None:
    """Signal the run's process group, as a terminal does, noting when."""
    sent.append(time.monotonic())
    os.killpg(pid, signum)


def ended_in_verified_production(output: str, what: str, sent: float) -> None:
    """The run said it restored production, verify proves it, and no candidate is left."""
    assert "production was restored and verified" in output, output[-3000:]
    checks = verify("production")
    print(f"{what} to a verified production: {time.monotonic() - sent:.1f}s")
    assert checks.returncode == 0, checks.stdout[-3000:]
    for host in ("wsa", "wsb"):
        assert "tx_e2e" not in ssh(host, "ls /sys/module/thunderbolt_net/parameters"), host


def test_a_signal_mid_transition_ends_in_a_verified_production_and_exits_as_shells_expect(
        tmp_path) -> None:
    """
    From production towards tp2_e2e, SIGINT to the run's process group (a Ctrl-C)
    in the driver step, then SIGTERM in the serving step: each run skips the rest
    of its attempt, rolls back, exits 130 or 143, leaves no candidate loaded
    and production verified, and records ``interrupted`` at that step. Each ends
    in production, where the next starts. A user asking ``small`` four times a
    second, with no retry of its own, has every request answered within 5 s.
    """
    own_ledger = ("--data", f"ledger_path={tmp_path / 'ledger.jsonl'}")
    for signum, step in ((signal.SIGINT, AT_THE_DRIVER), (signal.SIGTERM, AT_THE_RANKS)):
        name, sent = signal.Signals(signum).name, []
        started = time.monotonic()
        with small_client().asking() as client:
            run = deploy_meanwhile("tp2_e2e", f"Starting operation: {step}",
                                   partial(send, signum, sent), *own_ledger)
        print(f"small during the run {name} interrupted and its rollback "
              f"({time.monotonic() - started:.1f}s): {client_figures(client.answers)}")
        assert client.answers and not refusals(client.answers), refusals(client.answers)
        assert run.returncode == 128 + signum, (name, run.output[-3000:])
        landed = next((where for where in LANDS_IN[step]
                       if f"interrupted by {name} during {where!r}" in run.output), None)
        assert landed, run.output[-3000:]
        ended_in_verified_production(run.output, f"{name} in {step!r}", sent[0])
        *_, rollback, interrupted = ledger.read(tmp_path / "ledger.jsonl")
        assert (rollback["state"], rollback["outcome"]) == ("production", "accepted")
        assert (interrupted["state"], interrupted["outcome"], interrupted["interrupted"]) == (
            "tp2_e2e", "interrupted", {"signal": name, "step": landed})


def test_a_killed_run_is_converged_by_the_next_and_a_signal_on_the_way_back_restores_production(
        tmp_path) -> None:
    """
    SIGKILL, as a lost laptop ends a run, while the TP ranks start: nothing rolls
    back, so the next run to tp2_e2e must converge through what was left (its
    locks, a candidate loaded, ranks half started). Then, on the way back, SIGINT
    while the stock driver replaces the candidate: the run restores production
    and exits 130. What ``make soak`` sweeps at many points, once each here.
    """
    own_ledger = ("--data", f"ledger_path={tmp_path / 'ledger.jsonl'}")
    killed = deploy_meanwhile("tp2_e2e", f"Starting operation: {AT_THE_RANKS}",
                              partial(send, signal.SIGKILL, []), *own_ledger)
    assert killed.returncode == -signal.SIGKILL, killed.output[-3000:]
    assert "production was restored" not in killed.output
    converged = deploy("tp2_e2e", *own_ledger)
    assert converged.returncode == 0, converged.output[-3000:]
    checks = verify("tp2_e2e")
    assert checks.returncode == 0, checks.stdout[-3000:]

    sent: list[float] = []
    run = deploy_meanwhile("production", f"Starting operation: {AT_THE_STOCK_DRIVER}",
                           partial(send, signal.SIGINT, sent), *own_ledger)
    assert run.returncode == 128 + signal.SIGINT, run.output[-3000:]
    assert "interrupted by SIGINT during" in run.output, run.output[-3000:]
    ended_in_verified_production(run.output, "SIGINT on the way back to production", sent[0])
