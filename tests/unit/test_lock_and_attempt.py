"""The host lock, the management-path refusal and the attempt's conclusion."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from operation_harness import RollbackProcess, a_run, run_operation
from pyinfra.api import OperationError, StringCommand

from operations import step as steps
from operations.plumbing import phase
from operations.run import Run
from operations.safety import lock
from operations.safety import rollback as rollbacks
from operations.safety.lock import HostLock, RunOwner
from operations.site import options
from operations.thunderbolt import link
from operations.thunderbolt.link import RouteInterface

OWNER = RunOwner(socket.gethostname(), "root", 4242, "2026-11-29T13:00:00+0000", "tp2_e2e",
                 "0123456789abcdef01234567", lock.boot_here())


def holding(owner: RunOwner | None):
    return lambda cls, kwargs: owner


def test_a_free_lock_is_taken_without_reporting_a_change() -> None:
    shell: list[str] = []
    assert run_operation(lock.held, holding(None), shell=shell, run_dir="/run/twinbolt",
                         run=Run(OWNER), holder="wsa") == []
    assert shell == [lock.swapped("/run/twinbolt", "", OWNER.line()).get_raw_value()]


def test_a_lock_held_by_a_live_run_is_refused_naming_the_holder() -> None:
    other = RunOwner("operator-laptop", "ana", 77, "2026-11-29T12:00:00+0000", "tp2_stock")
    with pytest.raises(OperationError) as refused:
        run_operation(lock.held, holding(other), run_dir="/run/twinbolt", run=Run(OWNER),
                  holder="wsa")
    assert "wsa: lock layer: another run holds /run/twinbolt/lock: ana@operator-laptop pid 77" \
        in str(refused.value)


def test_a_stale_lock_is_taken_over() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = RunOwner(socket.gethostname(), "root", dead.pid, "earlier", "tp2_e2e", "feed",
                     lock.boot_here())
    shell: list[str] = []
    run_operation(lock.held, holding(stale), shell=shell, run_dir="/run/twinbolt",
                  run=Run(OWNER), holder="wsa")
    assert shell == [lock.swapped("/run/twinbolt", f"present {stale.line()}",
                                  OWNER.line()).get_raw_value()]


def test_a_lock_this_very_run_holds_is_kept_without_a_write() -> None:
    # Live (this process), so only its being this run's own keeps it from a refusal.
    this_run = RunOwner(socket.gethostname(), "root", os.getpid(), "2026-11-29T13:00:00+0000",
                        "tp2_e2e", "fedcba9876543210fedcba98", lock.boot_here())
    shell: list[str] = []
    run = Run(this_run)
    assert run_operation(lock.held, holding(this_run), shell=shell, run_dir="/run/twinbolt",
                         run=run, holder="wsa") == []
    assert shell == [] and run.locks.holds("wsa") and run.locks.taken == []


def test_the_lock_is_only_taken_when_executing_and_released_only_if_ours() -> None:
    shell: list[str] = []
    run_operation(lock.held, holding(None), executing=False, shell=shell,
                  run_dir="/run/twinbolt", run=Run(OWNER), holder="wsa")
    assert shell == []
    run_operation(lock.released, holding(OWNER), shell=shell, run_dir="/run/twinbolt",
                  owner=OWNER)
    removal = lock.swapped("/run/twinbolt", f"present {OWNER.line()}", None).get_raw_value()
    assert shell == [removal]
    other = RunOwner("elsewhere", "ana", 77, "earlier", "production")
    run_operation(lock.released, holding(other), shell=shell, run_dir="/run/twinbolt",
                  owner=OWNER)
    assert shell == [removal]


def test_lock_line_round_trips_through_the_fact() -> None:
    assert HostLock().process([f"owner {OWNER.line()}"]) == OWNER
    assert HostLock().process([]) is None


def test_an_owner_of_another_boot_or_machine_is_never_judged_gone() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    here = RunOwner("same-name", "root", dead.pid, "earlier", "tp2_e2e", "a1", lock.boot_here())
    assert here.gone()
    # Another operator machine with this host name, or this one before a reboot.
    assert not RunOwner(socket.gethostname(), "root", dead.pid, "earlier", "tp2_e2e", "b2",
                        "another-boot/4026531836").gone()
    assert not RunOwner.parse(f"machine={socket.gethostname()} user=root pid={dead.pid}").gone()


def test_two_runs_are_two_owners_even_with_one_machine_and_pid() -> None:
    first = lock.this_run("tp2_e2e")
    second = lock.this_run("tp2_e2e")
    assert (first.machine, first.pid) == (second.machine, second.pid) and first != second
    assert RunOwner.parse(first.line()) == first


@pytest.mark.parametrize("content, why", [("", "empty"), ("\n", "empty")])
def test_an_empty_lock_file_is_refused_naming_the_file_and_the_fix(content: str, why: str,
                                                                   tmp_path) -> None:
    (tmp_path / "lock").write_text(content)
    command = HostLock().command(str(tmp_path)).get_raw_value()
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    found = HostLock().process(output.splitlines())
    assert found == lock.UnreadableLock(why)
    with pytest.raises(OperationError) as refused:
        run_operation(lock.held, holding(found), run_dir=str(tmp_path), run=Run(OWNER),
                  holder="wsa")
    assert (f"{tmp_path}/lock on wsa is {why} and names no run: if no run holds these hosts, "
            f"remove {tmp_path}/lock on wsa") in str(refused.value)


def test_the_lock_fact_reads_a_real_lock_file_and_none_without_one(tmp_path) -> None:
    command = HostLock().command(str(tmp_path)).get_raw_value()
    assert subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout == ""
    (tmp_path / "lock").write_text(OWNER.line() + "\n")
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    assert HostLock().process(output.splitlines()) == OWNER


@pytest.mark.parametrize("stale", [False, True], ids=["free lock", "stale lock"])
def test_racing_takeovers_of_one_lock_have_exactly_one_winner(stale: bool, tmp_path) -> None:
    # The very command lock.held runs, started many times at once, round after round.
    dead = subprocess.Popen(["true"])
    dead.wait()
    previous = RunOwner("ops", "root", dead.pid, "earlier", "tp2_e2e", "dead", lock.boot_here())
    for round_ in range(12):
        run_dir = tmp_path / f"round{round_}"
        run_dir.mkdir()
        if stale:
            (run_dir / "lock").write_text(previous.line() + "\n")
        owners = [RunOwner("ops", "root", 1000 + index, "now", "tp2_e2e", f"token{index}",
                           "b") for index in range(8)]
        seen = lock.seen_as(previous if stale else None)
        racers = [subprocess.Popen(["sh", "-c", lock.swapped(str(run_dir), seen, owner.line())
                                    .get_raw_value()], stderr=subprocess.PIPE, text=True)
                  for owner in owners]
        results = [racer.wait() for racer in racers]
        for racer in racers:
            racer.stderr.close()
        winners = [owner for owner, code in zip(owners, results, strict=True) if code == 0]
        assert len(winners) == 1, f"round {round_}: {len(winners)} runs won"
        assert (run_dir / "lock").read_text() == winners[0].line() + "\n"
        assert sorted(path.name for path in run_dir.iterdir()) == ["lock", "lock.guard"]


def test_a_takeover_of_a_lock_another_run_changed_first_says_so(tmp_path) -> None:
    (tmp_path / "lock").write_text(OWNER.line() + "\n")
    dead = RunOwner("ops", "root", 1, "then", "tp2_e2e", "dead", "b")
    command = lock.swapped(str(tmp_path), lock.seen_as(dead), "machine=x token=y")
    result = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True,
                            text=True)
    assert result.returncode != 0
    assert result.stderr.strip() == f"another run changed it first; it now reads: present " \
                                    f"{OWNER.line()}"
    assert (tmp_path / "lock").read_text() == OWNER.line() + "\n"


def test_a_release_removes_only_this_runs_lock(tmp_path) -> None:
    (tmp_path / "lock").write_text(OWNER.line() + "\n")
    other = RunOwner("ops", "root", 1, "now", "tp2_e2e", "other", "b")
    not_ours = lock.swapped(str(tmp_path), lock.seen_as(other), None).get_raw_value()
    assert subprocess.run(["sh", "-c", not_ours], capture_output=True).returncode != 0
    assert (tmp_path / "lock").exists()
    ours = lock.swapped(str(tmp_path), lock.seen_as(OWNER), None).get_raw_value()
    assert subprocess.run(["sh", "-c", ours], capture_output=True).returncode == 0
    assert not (tmp_path / "lock").exists()


def test_management_over_the_link_is_refused() -> None:
    routes = {"ssh-client": "thunderbolt0", "10.66.0.13": "eth0"}
    with pytest.raises(OperationError, match=r"the operator \(ssh-client\) would leave through "
                                             r"thunderbolt0"):
        run_operation(link.management_path, lambda cls, kwargs: routes[kwargs["address"]],
                      interface="thunderbolt0",
                      addresses={"operator": "ssh-client", "gateway": "10.66.0.13"})
    routes["ssh-client"] = "eth0"
    assert run_operation(link.management_path, lambda cls, kwargs: routes[kwargs["address"]],
                         interface="thunderbolt0",
                         addresses={"operator": "ssh-client", "gateway": "10.66.0.13"}) == []


def test_route_fact_command_names_the_interface_on_this_machine() -> None:
    command = RouteInterface().command(address="127.0.0.1").get_raw_value()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    assert RouteInterface().process(out.splitlines()) == "lo"


@pytest.fixture
def fresh_attempt() -> steps.Attempt:
    """The attempt of a run of its own, which the operations below are given."""
    return steps.Attempt()


def no_facts(cls, kwargs):
    raise AssertionError("the conclusion reads no facts")


def test_a_failing_command_runs_as_pyinfra_runs_it_and_records_the_evidence() -> None:
    logged: list[str] = []
    wsb = SimpleNamespace(name="wsb", executing_op_hash="op1", connector=None,
                          log_styled=lambda message, **_: logged.append(message))
    command = steps.failing(steps.Layer.LINK, ["thunderbolt0 has no carrier"])
    pyinfra_state = SimpleNamespace(**{steps.RUN_ATTRIBUTE: a_run()})
    assert command.execute(pyinfra_state, wsb, {}) is False
    fresh_attempt = steps.of(pyinfra_state)
    assert logged == ["wsb: link layer: thunderbolt0 has no carrier"]
    assert fresh_attempt.messages() == ["wsb: link layer: thunderbolt0 has no carrier"]
    assert fresh_attempt.layers == ["link"]


def test_conclusion_is_silent_after_success(fresh_attempt) -> None:
    assert run_operation(rollbacks.concluded, no_facts, attempt=fresh_attempt,
                         on_failure="rollback", speakers=("wsa",)) == []


def test_conclusion_names_the_failure_and_the_restoration(fresh_attempt) -> None:
    fresh_attempt.record("wsa", "op1", "wsa: link layer: the link to wsb trained at 10 Gb/s")
    fresh_attempt.rollback_exit, fresh_attempt.rollback_ending = 0, "accepted"
    with pytest.raises(OperationError) as error:
        run_operation(rollbacks.concluded, no_facts, attempt=fresh_attempt,
                      on_failure="rollback", speakers=("wsa",))
    assert str(error.value) == ("wsa: link layer: the link to wsb trained at 10 Gb/s | "
                                "production was restored and verified")
    with pytest.raises(OperationError, match="LEFT AS THEY ARE"):
        run_operation(rollbacks.concluded, no_facts, attempt=fresh_attempt,
                      on_failure="stop", speakers=("wsa",))
    fresh_attempt.rollback_exit = 1
    with pytest.raises(OperationError, match=r"the rollback to production failed too \(exit 1"):
        run_operation(rollbacks.concluded, no_facts, attempt=fresh_attempt,
                      on_failure="rollback", speakers=("wsa",))
    assert run_operation(rollbacks.concluded, no_facts, attempt=fresh_attempt,
                         on_failure="rollback", speakers=("gw",)) == []


def test_the_rollback_runs_once_and_only_after_a_failure(fresh_attempt) -> None:
    assert run_operation(rollbacks.rolled_back, no_facts, attempt=fresh_attempt,
                         on_failure="rollback", speakers=("wsa",)) == []
    fresh_attempt.record("wsb", "op1", "wsb: link layer: no carrier")
    assert run_operation(rollbacks.rolled_back, no_facts, attempt=fresh_attempt,
                         on_failure="stop", speakers=("wsa",)) == []
    assert run_operation(rollbacks.rolled_back, no_facts, attempt=fresh_attempt,
                         on_failure="rollback", speakers=("gw",)) == []
    assert run_operation(rollbacks.rolled_back, no_facts, attempt=fresh_attempt,
                         executing=False,
                         on_failure="rollback", speakers=("wsa",)) == []


def test_a_data_secret_reaches_the_rollback_in_its_environment_not_its_command_line(
        monkeypatch) -> None:
    fresh_attempt = rollbacks.for_command_line(parsed([
        "inventory.py", "deploy.py", "--data", "state=tp2_e2e",
        "--data", "_sudo_password=hunter2", "--data", "campaign_retries=3",
    ]))
    assert not any("hunter2" in word for word in fresh_attempt.rollback_command)
    # (The inventory reads it back: test_inventory's rollback test; carried_data
    # imports pyinfra's CLI, which monkey-patches whatever process imports it.)
    environment = rollbacks.environment(fresh_attempt, [lock.inheriting(OWNER)])
    assert json.loads(environment[options.CARRIED_DATA_ENV]) == [
        "_sudo_password=hunter2", "campaign_retries=3", lock.inheriting(OWNER)]
    rollback = RollbackProcess.ending("accepted")
    monkeypatch.setattr(rollbacks.subprocess, "Popen", rollback)
    logged: list[str] = []
    fake_host = SimpleNamespace(log_styled=lambda message, **_: logged.append(message))
    pyinfra_state = SimpleNamespace(**{steps.RUN_ATTRIBUTE: Run(OWNER, fresh_attempt)})
    assert rollbacks.run_rollback(pyinfra_state, fake_host, fresh_attempt.rollback_command,
                                  [lock.inheriting(OWNER)])
    [(command, env)] = rollback.ran
    assert "hunter2" not in " ".join(command) + logged[0]
    assert logged[0].endswith("(carrying --data _sudo_password, campaign_retries, "
                              "lock_inherited)")
    assert "hunter2" in env[options.CARRIED_DATA_ENV]


def test_the_rollback_holds_the_failed_runs_lock_and_leaves_it_to_that_run(fresh_attempt
                                                                          ) -> None:
    fresh_attempt.rollback_command = ["pyinfra", "-y", "inventory.py", "deploy.py"]
    fresh_attempt.record("wsb", "op1", "wsb: link layer: no carrier")
    assert run_operation(rollbacks.rolled_back, no_facts, attempt=fresh_attempt,
                         on_failure="rollback", speakers=("wsa",),
                         carried=(lock.inheriting(OWNER),)) == ["call run_rollback"]
    # The rollback is the owner it was given: the lock is its own, not another run's.
    inherited = lock.run_owner("production", OWNER.line())
    assert inherited == OWNER
    assert run_operation(lock.held, holding(OWNER), run_dir="/run/twinbolt",
                         run=Run(inherited), holder="wsa") == []
    shell: list[str] = []
    run_operation(lock.released, holding(OWNER), shell=shell, run_dir="/run/twinbolt",
                  owner=inherited, inherited=True)
    assert shell == []


def test_a_command_run_at_once_runs_as_the_operation_does_under_sudo(monkeypatch) -> None:
    """The lock and the address are written by direct commands: they need the site's _sudo."""
    ran: list[dict] = []

    class Host:
        current_op_global_arguments = {"_sudo": True, "_sudo_user": None,
                                       "_ignore_errors": True, "_if": []}

        def run_shell_command(self, command: object, **arguments: object) -> tuple[bool, None]:
            ran.append(arguments)
            return True, None

    monkeypatch.setattr(phase, "host", Host())
    assert phase.run_now(StringCommand("true")) == (True, None)
    assert ran == [{"_sudo": True, "_sudo_user": None}]


PARSE = ("import json, sys; from pyinfra_cli.cli import cli; "
         "print(json.dumps(cli.make_context('pyinfra', sys.argv[1:]).params, default=list))")


def parsed(arguments: list[str]) -> dict:
    """
    pyinfra's own command line parser's view of ``arguments``; nothing runs. In a
    process of its own: importing pyinfra's CLI monkey-patches the interpreter.
    """
    result = subprocess.run([sys.executable, "-c", PARSE, *arguments], capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout)


def test_the_rollback_reaches_the_hosts_as_the_run_did() -> None:
    """The rollback is the same command line aimed at production: --sudo and friends too."""
    fresh_attempt = rollbacks.for_command_line(parsed([
        "--sudo", "--sudo-user", "root", "--ssh-user", "admin", "--ssh-port", "2222",
        "--ssh-key", "/keys/id", "--limit", "workstations", "--limit", "gateway",
        "--ssh-password", "secret", "inventory.py", "deploy.py",
        "--data", "state=tp2_e2e", "--data", "ledger_path=/tmp/l.jsonl",
    ]))
    command = fresh_attempt.rollback_command
    assert "secret" not in command, "a password must not reach the process list"
    again = parsed(command[1:])
    assert (again["sudo"], again["sudo_user"], again["ssh_user"], again["ssh_port"],
            again["ssh_key"], again["limit"]) == (True, "root", "admin", 2222, "/keys/id",
                                                  ["workstations", "gateway"])
    assert again["yes"] and again["data"] == ["state=production", "on_failure=stop"]
    assert fresh_attempt.rollback_data == ["ledger_path=/tmp/l.jsonl"]
    assert (again["inventory"], again["operations"]) == ("inventory.py", ["deploy.py"])


def test_a_dry_run_is_remembered_as_one() -> None:
    fresh_attempt = rollbacks.for_command_line(parsed(["inventory.py", "deploy.py",
                                                       "--dry"]))
    assert fresh_attempt.dry
    assert "--sudo" not in fresh_attempt.rollback_command


# The lock's judgement, branch by branch (issue 29 part 5)


def test_a_lost_race_for_the_lock_is_refused_in_the_swaps_own_words(monkeypatch) -> None:
    lost = "another run changed it first; it now reads: present machine=x"
    monkeypatch.setattr(lock, "run_now", lambda command: (False, SimpleNamespace(stderr=lost)))
    with pytest.raises(OperationError) as refused:
        run_operation(lock.held, holding(None), run_dir="/run/twinbolt", run=Run(OWNER),
                  holder="wsa")
    assert f"wsa: lock layer: /run/twinbolt/lock could not be taken: {lost}" in str(refused.value)


def test_where_no_boot_can_be_read_no_owner_is_judged_gone(monkeypatch) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    monkeypatch.setattr(lock, "boot_here", lambda: "")
    assert not RunOwner(socket.gethostname(), "root", dead.pid, "earlier", "tp2_e2e").gone()


def test_a_killed_run_left_unreaped_is_gone() -> None:
    zombie = subprocess.Popen(["true"])
    try:
        for _ in range(200):
            stat = open(f"/proc/{zombie.pid}/stat").read()
            if stat.rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert RunOwner(socket.gethostname(), "root", zombie.pid, "earlier", "tp2_e2e", "z",
                        lock.boot_here()).gone()
    finally:
        zombie.wait()


def test_a_lock_of_this_boot_with_an_unreadable_pid_names_no_live_process() -> None:
    garbled = RunOwner.parse(f"machine=m user=u pid=4x2 boot={lock.boot_here()}")
    assert garbled.pid == 0 and garbled.gone()


def test_a_live_run_that_sleeps_is_not_gone() -> None:
    sleeping = subprocess.Popen(["sleep", "30"])
    try:
        for _ in range(200):
            if open(f"/proc/{sleeping.pid}/stat").read().rpartition(")")[2].split()[0] == "S":
                break
            time.sleep(0.01)
        assert not RunOwner(socket.gethostname(), "root", sleeping.pid, "earlier", "tp2_e2e",
                            "s", lock.boot_here()).gone()
    finally:
        sleeping.kill()
        sleeping.wait()


# The pair's lock is all or nothing (issue 44)


def test_each_hosts_lock_is_taken_in_its_own_step_and_the_others_pass() -> None:
    run = Run(OWNER)
    shell: list[str] = []
    assert run_operation(lock.held, holding(None), shell=shell, host_name="wsb",
                         run_dir="/run/twinbolt", run=run, holder="wsa") == []
    assert shell == [] and not run.locks.holding


def test_a_run_refused_on_a_later_host_releases_the_locks_it_took() -> None:
    run = Run(OWNER)
    shell: list[str] = []
    run_operation(lock.held, holding(None), shell=shell, run_dir="/run/twinbolt", run=run,
                  holder="wsa")
    [(wsa, _, _)] = run.locks.taken
    other = RunOwner("operator-laptop", "ana", 77, "2026-11-29T12:00:00+0000", "tp2_stock")
    with pytest.raises(OperationError, match="wsb: lock layer: another run holds"):
        run_operation(lock.held, holding(other), shell=shell, host_name="wsb",
                      run_dir="/run/twinbolt", run=run, holder="wsb")
    assert shell == [lock.swapped("/run/twinbolt", "", OWNER.line()).get_raw_value(),
                     lock.swapped("/run/twinbolt", lock.seen_as(OWNER), None).get_raw_value()]
    assert wsa.name == "wsa" and run.locks.taken == [] and not run.locks.holds("wsa")
    assert run.attempt.ending.outcome == "refused"


def test_only_a_refusal_releases_the_locks_at_once() -> None:
    """Any other ending is the run's own: its release step comes after the rollback."""
    run = Run(OWNER)
    shell: list[str] = []
    run_operation(lock.held, holding(None), shell=shell, run_dir="/run/twinbolt", run=run,
                  holder="wsa")
    run.attempt.end(steps.Ending("accepted"))
    assert len(shell) == 1 and run.locks.holds("wsa")


def test_a_lock_of_another_machine_names_its_holder_age_and_the_command_that_clears_it(
        ) -> None:
    started = time.strftime(lock.STARTED_FORMAT, time.localtime(time.time() - 3723))
    other = RunOwner("operator-laptop", "ana", 77, started, "tp2_stock", "a1", "another-boot/1")
    with pytest.raises(OperationError) as refused:
        run_operation(lock.held, holding(other), run_dir="/run/twinbolt", run=Run(OWNER),
                      holder="wsa")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"wsa: lock layer: another run holds /run/twinbolt/lock: ana@operator-laptop pid 77 "
        f"since {started} (state tp2_stock), for 1:02:0")
    assert message.endswith(
        "it was taken on another machine (or before this one rebooted), so it is never judged "
        "stale from here: if no such run exists any more, clear it on each host with "
        "`pyinfra inventory.py exec -- rm -f /run/twinbolt/lock`")


def test_a_live_run_of_this_machine_is_said_to_still_run() -> None:
    here = RunOwner(socket.gethostname(), "root", os.getpid(), "not a time", "tp2_e2e", "h",
                    lock.boot_here())
    with pytest.raises(OperationError) as refused:
        run_operation(lock.held, holding(here), run_dir="/run/twinbolt", run=Run(OWNER),
                      holder="wsa")
    assert str(refused.value).endswith(
        f"pid {os.getpid()} since not a time (state tp2_e2e), for an unknown time; it still "
        "runs on this machine")


def test_a_lost_race_for_the_lock_names_the_run_that_won(monkeypatch) -> None:
    winner = RunOwner("operator-laptop", "ana", 77, "2026-11-29T12:00:00+0000", "tp2_stock")
    reads = iter([None, winner])
    monkeypatch.setattr(lock, "run_now", lambda command: (False, SimpleNamespace(stderr="")))
    with pytest.raises(OperationError, match="another run holds /run/twinbolt/lock: "
                                             "ana@operator-laptop pid 77"):
        run_operation(lock.held, lambda cls, kwargs: next(reads), run_dir="/run/twinbolt",
                      run=Run(OWNER), holder="wsa")
