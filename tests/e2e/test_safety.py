"""
Safe transitions on the lab: a failure after the GPUs are borrowed ends in a
verified production, ``on_failure=stop`` leaves the hosts for debugging, the
host lock keeps runs apart, and bad input changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from functools import partial

import pytest
from e2e_helpers import (
    PYINFRA,
    PYTHON,
    REPO,
    SHORT_LINK_WAIT,
    deploy,
    deploy_meanwhile,
    fault,
    files_under,
    lab,
    places_holding,
    refused_for_a_recorded_stall,
    secrets,
    service_process,
    snapshot,
    ssh,
    verify,
)

from lab.topology import STATE, host_named
from operations.safety import ledger
from operations.safety.lock import RunOwner, boot_here
from operations.serving import sglang

LOCK = "/run/twinbolt/lock"
# The lab's JHL8540s on the firmware tx_credit_stall runs, which never returns TX
# credits, and on their own.
STALLED_PAIRING = "8086:1137 (NVM 35.0) + 8086:1137 (NVM 35.0)"
HEALTHY_PAIRING = "8086:1137 (NVM 36.0) + 8086:1137 (NVM 36.0)"


def assert_production_verified() -> None:
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-3000:]


def pairing_now() -> list[ledger.Controller]:
    """The workstations' controllers and firmware, as the deploy's own fact reads them."""
    fact = ledger.ThunderboltController()
    return sorted((ledger.Controller.of(fact.process(ssh(host, fact.command()).splitlines()))
                   for host in ("wsa", "wsb")), key=str)


# Under a TP group, and under production's replicas, which never use the link: in
# both the candidate's driver is on trial, so a stall is a failure.
@pytest.mark.parametrize("state", ["tp2_e2e", "production_tx_e2e"])
def test_a_candidate_that_stalls_the_link_is_rolled_back_and_its_controllers_remembered(
        tmp_path, state: str) -> None:
    """
    The stall is recorded in the ledger with the firmware it ran on, the next
    candidate run on that firmware is refused, and the pair back on its healthy
    firmware meets no recorded stall.
    """
    own_ledger = ("--data", f"ledger_path={tmp_path / 'ledger.jsonl'}")
    started = time.monotonic()
    with fault("tx_credit_stall"):
        # At -vvv: the attempt's output and its rollback's, which it prints, hold no key.
        run = deploy(state, *SHORT_LINK_WAIT, *own_ledger, "-vvv")
        print(f"failure to verified production: {time.monotonic() - started:.1f}s")
        refused_for_a_recorded_stall(STALLED_PAIRING, *own_ledger)
    assert run.returncode != 0
    assert "link layer" in run.output and "no traffic moves" in run.output
    assert "production was restored and verified" in run.output
    # One message, no Python traceback (from the failure or from the conclusion).
    assert "Traceback" not in run.output, run.output[-3000:]
    for host in ("wsa", "wsb"):
        assert "tx_e2e" not in ssh(host, "ls /sys/module/thunderbolt_net/parameters")
    # The rollback is a run of its own, and ends first.
    rollback, attempt, refusal = ledger.read(tmp_path / "ledger.jsonl")
    assert (rollback["state"], rollback["outcome"]) == ("production", "accepted")
    assert (attempt["state"], attempt["outcome"], attempt["layer"], attempt["stall"]) == (
        state, "rolled_back", "link", True)
    # Recorded as it ran: the candidate loaded with tx_e2e, before the rollback.
    assert {part["parameters"].get("tx_e2e") for part in attempt["hosts"]} == {"Y"}
    assert ledger.describe_pairing(ledger.controllers(attempt)) == STALLED_PAIRING
    assert (refusal["state"], refusal["outcome"]) == ("tp2_e2e", "refused")

    texts = {"the attempt and its rollback at -vvv": run.output, **files_under(tmp_path)}
    assert {name: places_holding(secret, texts) for name, secret in secrets().items()} == {
        name: [] for name in secrets()}

    # The fault off, the controllers are back on their healthy firmware: not refused.
    healthy = pairing_now()
    assert ledger.describe_pairing(healthy) == HEALTHY_PAIRING
    assert ledger.stall_reports(ledger.read(tmp_path / "ledger.jsonl"), healthy) == []
    assert_production_verified()


def test_on_failure_stop_leaves_the_hosts_as_they_are_and_says_so() -> None:
    with fault("link_10g"):
        run = deploy("tp2_e2e", "--data", "on_failure=stop")
    assert run.returncode != 0
    assert "link layer" in run.output and "trained at 10 Gb/s" in run.output
    assert "THE HOSTS WERE LEFT AS THEY ARE" in run.output
    assert "rollback: converging production" not in run.output
    assert "tx_e2e" in ssh("wsa", "ls /sys/module/thunderbolt_net/parameters")
    restored = deploy("production")
    assert restored.returncode == 0, restored.output[-3000:]
    assert_production_verified()


def test_a_run_refuses_while_another_live_run_holds_the_lock() -> None:
    holder = "machine=operator-laptop user=ana pid=77 started=2026-11-29T12:00:00 state=tp2_stock"
    ssh("wsb", f"mkdir -p /run/twinbolt && echo '{holder}' > {LOCK}")
    try:
        before = snapshot()
        started = time.monotonic()
        run = deploy("tp2_e2e")
        assert run.returncode != 0
        assert "another run holds /run/twinbolt/lock: ana@operator-laptop pid 77" in run.output
        assert "Traceback" not in run.output, run.output[-3000:]
        assert time.monotonic() - started < 60
        # wsa's lock, taken before wsb refused, was released: nothing changed.
        assert snapshot() == before
        # Taken on another machine, it is never stale: the message says how to clear it.
        clearing = re.search(r"clear it on each host with `pyinfra ([^`]+)`", run.output)
        assert clearing, run.output[-3000:]
        cleared = subprocess.run([str(PYINFRA), *shlex.split(clearing.group(1))], cwd=REPO,
                                 capture_output=True, text=True, timeout=120)
        assert cleared.returncode == 0, cleared.stdout[-3000:] + cleared.stderr[-3000:]
        assert ssh("wsb", f"test -e {LOCK} && echo held").strip() == ""
    finally:
        ssh("wsb", f"rm -f {LOCK}")


def test_a_stale_lock_is_taken_over_with_a_warning() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    machine = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    # Judged gone only on its own boot and pid namespace: this machine's, the deploy's.
    stale = RunOwner(machine, "root", gone.pid, "earlier", "tp2_e2e", "stale", boot_here())
    ssh("wsa", f"mkdir -p /run/twinbolt && echo {shlex.quote(stale.line())} > {LOCK}")
    run = deploy("production")
    assert run.returncode == 0, run.output[-3000:]
    assert "taking over the stale lock" in run.output
    assert ssh("wsa", f"test -e {LOCK} && echo held").strip() == ""


def test_of_two_runs_started_together_exactly_one_proceeds_and_no_lock_is_left(
        tmp_path) -> None:
    """
    The pair's locks are taken host by host in one order: the run that takes wsa's
    converges, the other is refused there, naming it, and leaves no host locked.
    """
    own_ledger = ("--data", f"ledger_path={tmp_path / 'ledger.jsonl'}")
    started = time.monotonic()
    with ThreadPoolExecutor(2) as together:
        runs = list(together.map(lambda _: deploy("tp2_stock", *own_ledger), range(2)))
    print(f"two tp2_stock runs started together: {time.monotonic() - started:.1f}s")
    [winner] = [run for run in runs if run.returncode == 0]
    [loser] = [run for run in runs if run is not winner]
    assert loser.returncode != 0, [run.output[-2000:] for run in runs]
    assert re.search(r"wsa: lock layer: another run holds /run/twinbolt/lock: \S+@\S+ pid \d+ "
                     r"since \S+ \(state tp2_stock\), for [\d:]+; it still runs on this machine",
                     loser.output), loser.output[-3000:]
    assert "Traceback" not in loser.output, loser.output[-3000:]
    for host in ("wsa", "wsb", "gw"):
        assert ssh(host, f"test -e {LOCK} && echo held").strip() == "", host
    assert sorted(entry["outcome"] for entry in ledger.read(tmp_path / "ledger.jsonl")) == [
        "accepted", "refused"]
    restored = deploy("production", *own_ledger)
    assert restored.returncode == 0, restored.output[-3000:]
    assert_production_verified()
    print(f"... and back in a verified production: {time.monotonic() - started:.1f}s")


@contextmanager
def unreachable(host: str) -> Iterator[None]:
    """The host's sshd stops answering (its own namespace's firewall), then answers again."""
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"]
    subprocess.run(["ip", "netns", "exec", host, "iptables", "-w", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "exec", host, "iptables", "-w", "-D", *rule], check=True)


# The step during which the host is lost: rank 1 starting, rank 0 about to be proven.
WHILE_THE_RANKS_START = "Starting operation: Serving: the TP ranks run"
# Rank 0's proof waits this long for a rank 1 that is gone (the lab's replicas
# start in seconds, and the rollback gets the same bound).
SHORT_START_WAIT = ("--data", "serving_start_timeout_seconds=20")


def test_a_host_lost_mid_attempt_is_named_the_rest_rolled_back_and_a_later_run_converges(
        tmp_path) -> None:
    """
    wsb is lost while the TP ranks start, twice in one chain: its management
    path cut (its sshd's packets dropped, silently, as a pulled cable or a
    firewall does), then a reboot (its kernel closes the connection). Each time
    the run names wsb, rolls back wsa and the gateway to a verified production
    without it, releases their locks, records the outcome and exits non-zero;
    and once wsb answers again, the next run converges the whole pair.
    """
    own_ledger = ("--data", f"ledger_path={tmp_path / 'ledger.jsonl'}")
    losses = {
        "management path cut": lambda stack, _: stack.enter_context(unreachable("wsb")),
        "rebooted": lambda stack, _: lab("reboot", "wsb"),
    }
    for how, lose in losses.items():
        started = time.monotonic()
        with ExitStack() as stack:
            run = deploy_meanwhile("tp2_e2e", WHILE_THE_RANKS_START, partial(lose, stack),
                                   *SHORT_START_WAIT, *own_ledger)
            print(f"wsb {how}: failure to production on wsa and gw: "
                  f"{time.monotonic() - started:.1f}s")
            # A string, which pytest prints whole (a tuple's repr is cut to 240 characters).
            said = f"{how}:\n{run.output[-8000:]}"
            assert run.returncode != 0, said
            assert "the connection to wsb was lost during" in run.output, said
            assert ("production was restored and verified on wsa, gw, without wsb"
                    in run.output), said
            # Not a crash: pyinfra's own words for one (the logs' tails, rank 0's
            # included, may hold the servers' tracebacks: that is their evidence).
            assert "An internal exception occurred" not in run.output, said
            assert "Unexpected error in Python callback" not in run.output, how
            # The rollback reached what it could: wsa back on the stock driver, its
            # replica serving; the locks it could reach released.
            assert "tx_e2e" not in ssh("wsa", "ls /sys/module/thunderbolt_net/parameters")
            assert service_process("wsa", sglang.REPLICA)["running"], how
            for host in ("wsa", "gw"):
                assert ssh(host, f"test -e {LOCK} && echo held").strip() == "", (how, host)
        *_, rollback, attempt = ledger.read(tmp_path / "ledger.jsonl")
        assert (rollback["state"], rollback["outcome"]) == ("production", "accepted"), how
        assert [part["host"] for part in rollback["hosts"]] == ["wsa"], how
        assert (attempt["state"], attempt["outcome"], attempt["lost"]) == (
            "tp2_e2e", "rolled_back", ["wsb"]), how

        started = time.monotonic()
        restored = deploy("production", *own_ledger)
        print(f"wsb {how}: back, the whole pair in production: "
              f"{time.monotonic() - started:.1f}s")
        assert restored.returncode == 0, f"{how}:\n{restored.output[-8000:]}"
        if how == "management path cut":
            # wsb kept the failed run's lock: its run is gone, so it is stale.
            assert "taking over the stale lock" in restored.output, restored.output[-3000:]
        assert_production_verified()


def test_bad_input_is_refused_with_the_reason_and_changes_nothing() -> None:
    cases = [
        (("--data", "candidate_path=/nonexistent/thunderbolt_net.ko"),
         "--data candidate_path: no such file: /nonexistent/thunderbolt_net.ko"),
        # An override is a site value: it gets the site file's check.
        (("--data", "serving_user=root"), "--data serving_user: must not be root"),
        (("--data", "serving_working_directory=/srv\nExecStartPre=+/usr/bin/id"),
         "--data serving_working_directory: holds the control character(s)"),
        (("--data", "serving_model_path=/var/lib/models/missing"), "/var/lib/models/missing"),
        (("--data", "on_failure=shrug"), "on_failure"),
        # No key but a site key or a run option: / would be staged on (issue 44).
        (("--data", "run_dir=/"), "refused: --data run_dir: no site key, and no run option"),
        (("--data", "lock_inherited=machine=m user=u pid=1"),
         "--data lock_inherited: a rollback's own key"),
        # The pair is one unit: a subset would load the candidate on one side alone.
        (("--limit", "wsb"), "refused: --limit/--exclude leaves wsa, gw out of this run"),
        (("--exclude", "gw"), "refused: --limit/--exclude leaves gw out of this run"),
    ]
    before = snapshot()
    for extra, reason in cases:
        run = deploy("tp2_e2e", *extra)
        assert run.returncode != 0, extra
        assert reason in run.output, (extra, run.output[-2000:])
        assert snapshot() == before, extra


def test_a_workstation_rebooted_mid_experiment_is_drift_that_production_repairs() -> None:
    run = deploy("tp2_e2e")
    assert run.returncode == 0, run.output[-3000:]
    lab("reboot", "wsb")
    status = subprocess.run([str(PYTHON), "experiment.py", "status"], cwd=REPO,
                            capture_output=True, text=True, timeout=180)
    assert status.returncode != 0 and "drifted" in status.stdout, status.stdout
    # wsb came back on the stock driver; its TP rank, start-only, did not start alone.
    assert "tx_e2e" not in ssh("wsb", "ls /sys/module/thunderbolt_net/parameters")
    assert not any(service_process("wsb", rank)["running"] for rank in sglang.TP_RANKS)
    restored = deploy("production")
    assert restored.returncode == 0, restored.output[-3000:]
    assert_production_verified()
    for host in ("wsa", "wsb"):
        assert "tx_e2e" not in ssh(host, "ls /sys/module/thunderbolt_net/parameters")
        assert "thunderbolt_net.ko" not in ssh(host, "ls /run/twinbolt 2>/dev/null; true")


@contextmanager
def round_trip_verified(under: tuple[str, ...]) -> Iterator[None]:
    """
    production -> tp2_e2e -> production, each leg verified, with the lab faults
    ``under`` on; the block runs before they go off.
    """
    with ExitStack() as faults:
        for name in under:
            faults.enter_context(fault(name))
        run = deploy("tp2_e2e")
        assert run.returncode == 0, run.output[-3000:]
        checks = verify("tp2_e2e")
        assert checks.returncode == 0, checks.stdout[-3000:]
        restored = deploy("production")
        assert restored.returncode == 0, restored.output[-3000:]
        assert_production_verified()
        yield


def test_with_no_network_manager_and_udev_reloading_stock_the_swaps_end_where_declared() -> None:
    """
    Round trip on workstations where two things a distribution may do are both
    so: no network manager, so twinbolt's link layer owns the address every
    reload takes; and udev, which loads the stock module again the moment one is
    removed, so each swap must still end on the build its state declares.
    """
    with round_trip_verified(under=("no_network_manager", "udev_autoload")):
        for host, address in (("wsa", "169.254.77.1"), ("wsb", "169.254.77.2")):
            assert f"{address}/16" in ssh(host, "ip -br addr show thunderbolt0")


def test_a_system_owned_address_is_waited_for_and_named_when_no_manager_applies_it() -> None:
    """
    ``link.address_owner = system`` leaves the address to the host's network
    manager: with one (the lab's default) the candidate's reload gets its address
    and the TP state passes; with none, the next reload (the swap back to the
    stock driver) leaves ``thunderbolt0`` bare, the bounded wait ends naming the
    address, and production is restored.
    """
    system = ("--data", "link_address_owner=system")
    run = deploy("tp2_e2e", *system)
    assert run.returncode == 0, run.output[-3000:]
    with fault("no_network_manager"):
        failed = deploy("tp2_stock", *system, *SHORT_LINK_WAIT)
        assert failed.returncode != 0
        assert "link layer:" in failed.output and "169.254.77." in failed.output
        assert "(link.address_owner = system) has not applied it" in failed.output
        assert "production was restored and verified" in failed.output, failed.output[-3000:]
    assert_production_verified()


def test_an_unsigned_candidate_is_refused_before_any_change_where_signatures_are_enforced(
        ) -> None:
    before = snapshot()
    with fault("sig_enforce"):
        run = deploy("tp2_e2e")
    assert run.returncode != 0
    # Whichever workstation's refusal pyinfra meets first; both refuse.
    assert re.search(r"ws[ab]: driver layer: this kernel refuses unsigned modules "
                     r"\(sig_enforce=Y\)", run.output), run.output[-3000:]
    assert "mokutil --import" in run.output and "Traceback" not in run.output
    assert snapshot() == before


def test_gpu_memory_held_by_a_process_twinbolt_did_not_start_is_refused() -> None:
    stranger = ssh("wsb", "sleep 300 >/dev/null 2>&1 & echo $!").strip()
    ssh("wsb", f"echo 9000 > /run/lab-gpu/{stranger}")
    try:
        before = snapshot()
        run = deploy("tp2_e2e")
        assert run.returncode != 0
        assert (f"wsb: gpu layer: pid {stranger} (sleep 300) holds 9000 MiB of GPU memory and "
                "was not started by twinbolt") in run.output, run.output[-3000:]
        assert snapshot() == before
    finally:
        ssh("wsb", f"kill {stranger}; rm -f /run/lab-gpu/{stranger}")


def test_a_candidate_built_for_another_kernel_is_refused_before_upload(tmp_path) -> None:
    candidate = STATE / "modules" / "candidate" / "thunderbolt_net.ko"
    release = os.uname().release.encode()
    foreign = tmp_path / "thunderbolt_net.ko"
    foreign.write_bytes(candidate.read_bytes().replace(release, b"9".ljust(len(release), b"x")))
    before = snapshot()
    run = deploy("tp2_e2e", "--data", f"candidate_path={foreign}",
                 "--data", f"candidate_sha256={hashlib.sha256(foreign.read_bytes()).hexdigest()}")
    assert run.returncode != 0
    assert f"candidate {foreign} was built for kernel 9x" in run.output, run.output[-3000:]
    assert snapshot() == before


def test_management_traffic_over_the_link_is_refused_before_any_change() -> None:
    gateway = host_named("gw").management_address
    route = ["ip", "netns", "exec", "wsa", "ip", "route"]
    before = snapshot()
    subprocess.run([*route, "add", f"{gateway}/32", "dev", "thunderbolt0"], check=True)
    try:
        run = deploy("tp2_e2e")
    finally:
        subprocess.run([*route, "del", f"{gateway}/32", "dev", "thunderbolt0"], check=True)
    assert run.returncode != 0
    assert (f"wsa: link layer: traffic to the gateway ({gateway}) would leave through "
            "thunderbolt0") in run.output, run.output[-3000:]
    assert snapshot() == before


def test_an_unreachable_host_stops_the_run_before_any_change() -> None:
    before = snapshot()
    with unreachable("gw"):
        run = deploy("tp2_e2e")
    assert run.returncode != 0
    assert "gw" in run.output
    assert snapshot() == before
