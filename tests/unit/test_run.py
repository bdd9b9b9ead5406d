"""A run is one object that pyinfra's state holds; a failure carries its layer as data."""

from __future__ import annotations

from collections.abc import Iterator

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from operations import run as runs
from operations.safety import ledger
from operations.step import Layer, operation


@operation(Layer.LINK)
def a_link_step_that_fails() -> Iterator[str]:
    """A plain command that fails, in an operation of the link layer."""
    yield "false"


def local_state() -> State:
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    return state


def test_a_failed_plain_command_is_recorded_under_its_operations_layer_not_its_title() -> None:
    state = local_state()
    run = runs.begin(state, "tp2_e2e", None)
    add_op(state, a_link_step_that_fails, name="Driver: a title that names another layer",
           _ignore_errors=True)
    run_ops(state)
    assert run.attempt.layers == [Layer.LINK]
    [message] = run.attempt.messages()
    assert message == "@local: Driver: a title that names another layer: a command failed"


def test_a_run_is_begun_once_per_pyinfra_state_and_is_new_for_another() -> None:
    state = local_state()
    first = runs.begin(state, "tp2_e2e", None)
    # The next host's pass over the runbook meets the same run, even with other values.
    assert runs.begin(state, "production", None) is first
    assert first.owner.state == "tp2_e2e"
    another = runs.begin(local_state(), "tp2_e2e", None)
    assert another is not first and another.owner != first.owner
    assert another.proofs.pids == {} and another.attempt.healthy()


def test_a_rollback_is_the_run_whose_lock_it_inherits() -> None:
    failed = runs.begin(local_state(), "tp2_e2e", None)
    rollback = runs.begin(local_state(), "production", failed.owner.line())
    assert rollback.owner == failed.owner


def test_the_stall_rule_reads_the_layer_field() -> None:
    evidence = "wsa: link layer: the link trained, but no traffic moves"
    by_layer = {layer: ledger.record("tp2_e2e", "candidate", "rolled_back", [], layer=layer,
                                     evidence=evidence)["stall"] for layer in Layer}
    assert [layer for layer, stall in by_layer.items() if stall] == [Layer.LINK]


def test_the_command_line_config_py_remembers_is_the_one_the_rollback_repeats() -> None:
    state = local_state()
    runs.remember_command_line(state, {"inventory": "inventory.py", "operations": ["deploy.py"],
                                       "data": ["state=tp2_e2e", "ledger_path=/tmp/l.jsonl"]})
    attempt = runs.begin(state, "tp2_e2e", None).attempt
    assert attempt.rollback_command[-6:] == ["inventory.py", "deploy.py", "--data",
                                             "state=production", "--data", "on_failure=stop"]
    assert attempt.rollback_data == ["ledger_path=/tmp/l.jsonl"]
    # Without one (pyinfra's Python API), there is nothing to run again.
    assert runs.begin(local_state(), "tp2_e2e", None).attempt.rollback_command == []
