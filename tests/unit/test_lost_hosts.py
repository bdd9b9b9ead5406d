"""
A host lost in mid-attempt (its connection dead) and any other unexpected error:
each is a failure the run records and rolls back from, never a crash; the
rollback leaves the lost host out and restores production on the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from operation_harness import RollbackProcess, a_run, run_operation
from pyinfra.api import Inventory, OperationError

from operations import services
from operations import step as steps
from operations.safety import rollback as rollbacks
from operations.safety.scope import PartialRun, lost_hosts, whole_pairs
from operations.site import options


def no_facts(cls: type, kwargs: dict) -> None:
    raise AssertionError(f"no fact should be read, {cls.__name__} was")


@steps.operation(steps.Layer.DRIVER)
def parses_sysfs(text: str) -> Iterator[str]:
    """A step whose body meets text it cannot parse, as right after a driver swap."""
    yield f"echo {int(text)}"


def executed(command, run, host_name: str = "wsb", step: str = "Driver: the swap") -> bool:
    """Run a ``FunctionCommand`` as pyinfra does, on a host named ``host_name``."""
    logged: list[str] = []
    host = SimpleNamespace(name=host_name, executing_op_hash="op1", connector=None,
                           log_styled=lambda message, **_: logged.append(message))
    state = SimpleNamespace(get_op_meta=lambda op_hash: SimpleNamespace(names={step}),
                            **{steps.RUN_ATTRIBUTE: run})
    return command.execute(state, host, {})


def test_an_unexpected_exception_fails_the_step_with_it_as_evidence() -> None:
    run = a_run()
    [command] = run_operation(parses_sysfs, no_facts, run=run, text="0x1f\n")
    assert command == ("fail: driver layer: ValueError: invalid literal for int() with "
                       "base 10: '0x1f\\n'")
    # Only while executing: predicting changes, the error is raised as it was.
    with pytest.raises(ValueError):
        run_operation(parses_sysfs, no_facts, executing=False, text="0x1f\n")


def test_a_failing_step_records_the_exception_under_its_layer(monkeypatch) -> None:
    run = a_run()
    commands: list = []
    monkeypatch.setattr("operation_harness.describe", lambda command: commands.append(
        command) or "command")
    run_operation(parses_sysfs, no_facts, run=run, text="0x1f\n")
    assert executed(commands[0], run, "wsa") is False
    assert run.attempt.messages() == [
        "wsa: driver layer: ValueError: invalid literal for int() with base 10: '0x1f\\n'"]
    assert run.attempt.layers == ["driver"]


def test_a_lost_host_runs_nothing_and_its_loss_is_recorded_once(monkeypatch) -> None:
    run = a_run()
    monkeypatch.setattr(steps.connect, "lost", lambda host: True)
    commands: list = []
    monkeypatch.setattr("operation_harness.describe", lambda command: commands.append(
        command) or "command")
    run_operation(parses_sysfs, no_facts, run=run, text="12")
    assert [command.function for command in commands] == [steps.lose]
    for step in ("Driver: the swap", "Ledger: what the attempt ran"):
        assert executed(commands[0], run, step=step) is False
    assert run.attempt.lost == {"wsb": "Driver: the swap"}
    assert run.attempt.messages() == [
        "wsb: driver layer: the connection to wsb was lost during 'Driver: the swap'; "
        "nothing more was done there"]
    # Evidence a step judged from a dead host's default facts is not recorded either.
    assert executed(steps.failing(steps.Layer.LINK, ["no carrier"]), run) is False
    assert len(run.attempt.messages()) == 1


def test_the_first_host_still_reachable_speaks_and_says_what_was_restored() -> None:
    run = a_run()
    run.attempt.lose("wsb", "Serving: the TP ranks run", steps.Layer.SERVING)
    assert run.attempt.speaker(("wsb", "wsa", "gw")) == "wsa"
    assert run.attempt.speaker(("wsb",)) is None
    run.attempt.rollback_exit, run.attempt.rollback_ending = 0, "accepted"
    # The lost host neither rolls back nor concludes: the harness's host, wsa, does.
    assert run_operation(rollbacks.rolled_back, no_facts, run=run, on_failure="rollback",
                         speakers=("gw", "wsb")) == []
    with pytest.raises(OperationError) as error:
        run_operation(rollbacks.concluded, no_facts, run=run, on_failure="rollback",
                      speakers=("wsb", "wsa", "gw"))
    assert "production was restored and verified on wsa, gw, without wsb" in str(error.value)
    assert "once wsb answers again" in str(error.value)
    assert run.attempt.ending.lost == ("wsb",)


def test_the_rollback_leaves_the_lost_hosts_out_and_says_so_in_its_data(monkeypatch) -> None:
    run = a_run()
    run.attempt.rollback_command = ["pyinfra", "-y", "inventory.py", "deploy.py"]
    run.attempt.lose("wsb", "Serving: the TP ranks run", steps.Layer.SERVING)
    rollback = RollbackProcess.ending("accepted")
    monkeypatch.setattr(rollbacks.subprocess, "Popen", rollback)
    assert executed(steps.FunctionCommand(
        rollbacks.run_rollback, (run.attempt.rollback_command, ["lock_inherited=x"]), {}),
        run, "wsa")
    [(command, env)] = rollback.ran
    assert command[-2:] == ["--exclude", "wsb"]
    assert json.loads(env[options.CARRIED_DATA_ENV]) == ["lock_inherited=x",
                                                         'lost_hosts=["wsb"]']


INVENTORY = Inventory((["wsa", "wsb", "gw"], {}), workstations=(["wsa", "wsb"], {}),
                      gateway=(["gw"], {}), pair_a=(["wsa", "wsb", "gw"], {}))


def test_only_a_rollback_to_production_may_leave_out_the_hosts_its_run_lost() -> None:
    without_wsb = lambda host: host.name != "wsb"  # noqa: E731
    whole_pairs(INVENTORY, without_wsb, "production",
               lost=lost_hosts(["wsb"], "lock-line", "production"))
    for value, inherited, state in ((["wsb"], None, "production"),
                                    (["wsb"], "lock-line", "tp2_e2e"),
                                    (None, "lock-line", "production")):
        with pytest.raises(PartialRun, match="leaves wsb out"):
            whole_pairs(INVENTORY, without_wsb, state, lost=lost_hosts(value, inherited, state))
    # Another lost host does not excuse leaving wsb out.
    with pytest.raises(PartialRun, match="leaves wsb out"):
        whole_pairs(INVENTORY, without_wsb, "production",
                   lost=lost_hosts(["gw"], "lock-line", "production"))
    with pytest.raises(PartialRun, match="lost_hosts must be a JSON list"):
        lost_hosts("wsb", "lock-line", "production")


def test_a_lost_hosts_log_is_not_read_and_its_loss_is_said(monkeypatch) -> None:
    monkeypatch.setattr(services.connect, "lost", lambda host: host.name == "wsb")
    wsb = SimpleNamespace(name="wsb", get_fact=no_facts)
    assert services.log_tails([(wsb, "sglang-tp2-rank1", "systemd")]) == (
        "  wsb sglang-tp2-rank1: not read, the connection to wsb was lost")
