"""The state registry, and the CLI refusing a bad state before it connects anywhere."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from operations.states import (
    DECLARED,
    NEXTN_3_1_4,
    STATES,
    ServingMode,
    State,
    UnknownState,
    layers_changed,
    resolve_state,
)

NAMES = ["production", "production_tx_e2e", "production_e2e_off", "tp2_stock", "tp2_e2e",
         "tp2_stock_nospec", "tp2_e2e_nospec"]

# The README's states table: driver, serving, speculative, gateway fallback.
TABLE = {
    "production": ("stock", "replicas", None, False),
    "production_tx_e2e": ("candidate", "replicas", None, False),
    "production_e2e_off": ("stock_e2e_off", "replicas", None, False),
    "tp2_stock": ("stock", "tp2", NEXTN_3_1_4, True),
    "tp2_e2e": ("candidate", "tp2", NEXTN_3_1_4, True),
    "tp2_stock_nospec": ("stock", "tp2", None, True),
    "tp2_e2e_nospec": ("candidate", "tp2", None, True),
}


def test_registry_holds_the_seven_states_in_the_tables_order():
    assert list(STATES) == NAMES
    assert all(STATES[name].name == name for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_state_has_the_layers_design_gives_it(name):
    state = resolve_state(name)
    assert tuple(getattr(state, layer) for layer in DECLARED) == TABLE[name]


def test_nextn_is_3_1_4():
    assert NEXTN_3_1_4.model_dump() == {
        "algorithm": "NEXTN",
        "num_steps": 3,
        "eagle_topk": 1,
        "num_draft_tokens": 4,
    }


def test_states_are_frozen_values():
    with pytest.raises(ValidationError):
        STATES["production"].driver = "candidate"


def test_a_state_rejects_an_unknown_layer_value():
    with pytest.raises(ValidationError, match="'stock', 'stock_e2e_off' or 'candidate'"):
        State(name="x", driver="patched", serving="tp2", speculative=None)


def test_the_fallback_follows_the_serving_layer_and_cannot_be_declared_beside_it():
    assert [state.gateway_fallback for state in STATES.values()] == [
        state.serving == "tp2" for state in STATES.values()]
    with pytest.raises(ValidationError, match="gateway_fallback"):
        State(name="x", driver="stock", serving="replicas", speculative=None,
              gateway_fallback=True)


def test_the_serving_mode_is_compared_by_member_and_still_shown_as_tp2():
    # Reports and the status show the field report's name; code compares the member.
    assert [state.name for state in STATES.values() if state.tensor_parallel] == NAMES[3:]
    assert STATES["tp2_e2e"].serving is ServingMode.TENSOR_PARALLEL
    assert STATES["tp2_e2e"].model_dump(mode="json")["serving"] == "tp2"
    assert f"{STATES['production'].serving}" == "replicas"
    assert State(name="x", driver="stock", serving="tp2", speculative=None).uses_link


@pytest.mark.parametrize("name", ["tp2", "", "Production", 1, ["production"]])
def test_unknown_state_lists_the_valid_names(name):
    with pytest.raises(UnknownState) as raised:
        resolve_state(name)
    assert repr(name) in str(raised.value)
    assert ", ".join(NAMES) in str(raised.value)


def test_missing_state_lists_the_valid_names():
    with pytest.raises(UnknownState, match="no state given.*" + ", ".join(NAMES)):
        resolve_state(None)


def test_unknown_state_is_a_value_error():
    assert issubclass(UnknownState, ValueError)


@pytest.mark.parametrize(
    ("a", "b", "changed"),
    [
        ("production", "production", []),
        ("tp2_stock", "tp2_e2e", ["driver"]),
        ("tp2_stock", "tp2_stock_nospec", ["speculative"]),
        ("tp2_e2e_nospec", "tp2_stock_nospec", ["driver"]),
        ("production", "tp2_stock_nospec", ["serving"]),
        ("production", "tp2_e2e", ["driver", "serving", "speculative"]),
    ],
)
def test_layers_changed(a, b, changed):
    assert layers_changed(STATES[a], STATES[b]) == changed
    assert layers_changed(STATES[b], STATES[a]) == changed


@pytest.fixture
def stub_deploy(tmp_path: Path) -> Path:
    """Stands in for deploy.py: it would print the state it resolved, had it run."""

    deploy = tmp_path / "deploy.py"
    deploy.write_text(
        "from pyinfra import host\n"
        "from operations.states import resolve_state\n"
        "print('resolved', resolve_state(host.data.state).name)\n"
    )
    return deploy


@pytest.mark.parametrize("data", [["--data", "state=tp2"], []], ids=["unknown", "missing"])
def test_cli_refuses_a_bad_state_before_connecting(data, stub_deploy, write_site, run_pyinfra):
    result = run_pyinfra(
        "inventory.py", str(stub_deploy), *data, "-y", TWINBOLT_SITE=str(write_site())
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert ", ".join(NAMES) in output
    assert "Loading inventory" not in output
    assert "Connecting" not in output
    assert "Could not connect" not in output
    assert "resolved" not in output


def test_cli_with_a_good_state_goes_on_to_connect(stub_deploy, write_site, run_pyinfra):
    # The control for the test above: the same unreachable inventory, a real
    # state, and pyinfra does try to connect (and fails, as nothing listens).
    result = run_pyinfra(
        "inventory.py",
        str(stub_deploy),
        "--data",
        "state=production",
        "-y",
        TWINBOLT_SITE=str(write_site()),
    )
    assert result.returncode != 0
    assert "Connecting to hosts" in result.stderr
    assert "Could not connect" in result.stderr


def test_cli_needs_no_state_to_show_the_inventory(write_site, run_pyinfra):
    result = run_pyinfra("inventory.py", "debug-inventory", TWINBOLT_SITE=str(write_site()))
    assert result.returncode == 0, result.stderr


def test_cli_refuses_an_unknown_state_given_to_any_command(write_site, run_pyinfra):
    result = run_pyinfra(
        "inventory.py",
        "debug-inventory",
        "--data",
        "state=bogus",
        TWINBOLT_SITE=str(write_site()),
    )
    assert result.returncode != 0
    assert "unknown state 'bogus'" in result.stderr


def test_the_link_must_hold_under_a_tp_group_and_under_any_driver_but_plain_stock() -> None:
    # The transport states keep the replicas, which never use the link, but their
    # driver is the experiment: a stall there is a failure, not a warning.
    assert {name for name, state in STATES.items() if state.uses_link} == {
        name for name in STATES if name != "production"}
    assert not State(name="x", driver="stock", serving="replicas", speculative=None).uses_link
    assert State(name="x", driver="stock_e2e_off", serving="replicas", speculative=None).uses_link
