"""The serving layer, end to end: every state, one layer at a time, and back to
production, each verified; and a TP start that crashes or hangs failing in
bounded time with the layer, the host and both ranks' logs named."""

from __future__ import annotations

import subprocess
import time

from e2e_helpers import (
    INIT_SCRIPT,
    PYINFRA,
    REPO,
    client_figures,
    deploy,
    fault,
    lab,
    part,
    refusals,
    small_client,
    ssh,
    verify,
)

from operations import services

# tp2_e2e's round trip is test_states_driver_link's; together they cover every state.
# Each step changes one layer, as a campaign's do: the decoder, then the driver under TP.
OTHER_TP_STATES = ("tp2_stock", "tp2_stock_nospec", "tp2_e2e_nospec")
# The lab's start bound is 60 s; a hang need not cost a whole minute to prove.
SHORT_START = ("--data", "serving_start_timeout_seconds=20")
# deploy.py's step 6: the TP ranks start, then rank 0 is asked for a completion.
RANKS_START = "Starting operation: Serving: the TP ranks run"
# After a failure the run converges production itself.
ROLLBACK = "Starting operation: Rollback"


def services_and_driver() -> dict[str, str]:
    """What the serving and driver layers would change: services, run scripts, module."""
    listing = part(INIT_SCRIPT, services.RUNIT_SVDIR, services.RUNIT_SOURCEDIR,
                   services.SYSTEMD_DIR)
    module = "; cat /sys/module/thunderbolt_net/notes/.note.gnu.build-id " \
             "/sys/module/thunderbolt_net/parameters/* 2>&1 | od -An -tx1"
    return {"wsa": ssh("wsa", listing + module), "wsb": ssh("wsb", listing + module),
            "gw": ssh("gw", listing)}


def reached(state: str) -> None:
    """Deployed: the run's own last step proves every layer with real requests."""
    run = deploy(state)
    assert run.returncode == 0, run.output[-4000:]


def converged(state: str) -> None:
    """Deployed, then checked again from outside by ``pytest tests/verify``."""
    reached(state)
    checks = verify(state)
    assert checks.returncode == 0, checks.stdout[-4000:]


def test_every_other_state_is_reached_one_layer_at_a_time_and_production_restored() -> None:
    for state in (*OTHER_TP_STATES, "production"):
        converged(state)


def test_an_old_sglang_is_refused_before_any_change_naming_host_and_versions() -> None:
    before = services_and_driver()
    run = deploy("tp2_e2e", "--data", "serving_min_sglang_version=9.9")
    assert run.returncode != 0
    assert "serving layer: SGLang 0.5.9 is older than the minimum 9.9" in run.output
    assert "wsa: serving layer" in run.output or "wsb: serving layer" in run.output
    assert services_and_driver() == before


def test_a_rank_crashing_while_the_draft_loads_fails_the_deploy_at_once() -> None:
    """
    ...and is rolled back, while a user asking ``small`` four times a second, with
    no retry of its own, has every request answered within 5 s.
    """
    started = time.monotonic()
    with small_client().asking() as client, fault("draft_init_crash"):
        run = deploy("tp2_stock")
    elapsed = time.monotonic() - started
    print(f"small during the failed run and its rollback ({elapsed:.1f}s): "
          f"{client_figures(client.answers)}")
    try:
        assert client.answers and not refusals(client.answers), refusals(client.answers)
        assert run.returncode != 0
        assert "wsa: serving layer: TP rank 0" in run.output, run.output[-4000:]
        assert "exited and was restarted" in run.output or "is not running" in run.output, \
            run.output[-4000:]
        # Both ranks' logs, with the crash in them: the evidence, not "it is down".
        assert "wsa sglang-tp2-rank0, last lines" in run.output
        assert "wsb sglang-tp2-rank1, last lines" in run.output
        assert "draft" in run.output.split("wsa sglang-tp2-rank0, last lines")[-1]
        # A crash is recognised when it happens, not when the start bound runs out.
        assert "waiting cannot help" in run.output and "timed out" not in run.output
        assert "production was restored and verified" in run.output
        assert elapsed < 150, f"the deploy, its rollback included, took {elapsed:.0f}s"
    finally:
        reached("production")


def deploy_with_fault_between(on: str, off: str, fault_name: str, state: str,
                              *extra: str) -> tuple[int, str]:
    """
    Deploy ``state`` with ``fault_name`` on from the line that says ``on`` to the
    line that says ``off`` (and off whatever happens); the exit code and the output.
    """
    run = subprocess.Popen([str(PYINFRA), "-y", "inventory.py", "deploy.py", "--data",
                            f"state={state}", *extra], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    output = []
    switched = "before"
    try:
        for line in run.stdout:
            output.append(line)
            if switched == "before" and on in line:
                lab("fault", fault_name, "on")
                switched = "on"
                output.append(f"(test: fault {fault_name} on)\n")
            elif switched == "on" and off in line:
                lab("fault", fault_name, "off")
                switched = "after"
                output.append(f"(test: fault {fault_name} off)\n")
        return run.wait(timeout=600), "".join(output)
    finally:
        lab("fault", fault_name, "off")
        if run.poll() is None:
            run.kill()


def test_a_rank_that_hangs_behind_a_green_health_fails_the_deploy_in_bounded_time() -> None:
    started = time.monotonic()
    # rank_hang_green_health (an older SGLang's /health, which does not generate)
    # stalls every simulated server asked to generate, production's replicas and
    # the gateway's large backend too, and for good; so it is on only from the
    # ranks' start to the rollback that restores production.
    returncode, output = deploy_with_fault_between(RANKS_START, ROLLBACK,
                                                   "rank_hang_green_health", "tp2_stock",
                                                   *SHORT_START)
    elapsed = time.monotonic() - started
    try:
        assert "(test: fault rank_hang_green_health off)" in output, output[-4000:]
        assert returncode != 0
        assert "wsa: serving layer: TP rank 0" in output, output[-4000:]
        assert "its /health answers 200, which proves nothing" in output
        assert "timed out after 20s" in output
        assert "production was restored and verified" in output
        assert elapsed < 150, f"the deploy, its rollback included, took {elapsed:.0f}s"
    finally:
        reached("production")


def test_a_tp_group_whose_traffic_misses_the_link_fails_naming_the_transport() -> None:
    # NCCL_SOCKET_IFNAME does not reach the ranks' NCCL: it picks eth0, the management
    # network, and the group forms and serves there; only the transport proof can tell.
    with fault("wrong_interface"):
        run = deploy("tp2_stock")
    assert run.returncode != 0
    assert "wsa: serving layer: TP rank 0" in run.output, run.output[-4000:]
    assert "the TP group's transport is not thunderbolt0: its connections 10.66.0.11:" in run.output
    assert "run outside 169.254.77.1 <-> 169.254.77.2" in run.output
    assert "thunderbolt0 carried" in run.output and "need at least" in run.output
    assert "production was restored and verified" in run.output, run.output[-4000:]
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-4000:]
