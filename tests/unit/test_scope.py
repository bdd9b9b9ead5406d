"""A run moves whole pairs and the gateway: --limit and --exclude are judged before anything."""

import pytest
from pyinfra.api import Inventory

from operations.safety.scope import PartialRun, left_out, reached, whole_pairs

ONE_PAIR = Inventory((["wsa", "wsb", "gw", "bastion"], {}),
                     workstations=(["wsa", "wsb"], {}), gateway=(["gw"], {}),
                     pair_a=(["wsa", "wsb", "gw"], {}))
TWO_PAIRS = Inventory((["wsa", "wsb", "wsc", "wsd", "gw"], {}),
                      workstations=(["wsa", "wsb", "wsc", "wsd"], {}), gateway=(["gw"], {}),
                      pair_a=(["wsa", "wsb", "gw"], {}), pair_b=(["wsc", "wsd", "gw"], {}))


def limited(*names: str):
    return lambda host: host.name in names


def names(hosts) -> list[str]:
    return [host.name for host in hosts]


def test_the_whole_pair_passes_and_a_host_outside_it_does_not_matter() -> None:
    assert left_out(ONE_PAIR, limited("wsa", "wsb", "gw")) == []
    whole_pairs(ONE_PAIR, limited("wsa", "wsb", "gw"), "tp2_e2e")


@pytest.mark.parametrize(("inventory", "active", "missing"), [
    (ONE_PAIR, ("wsb", "gw"), ["wsa"]),
    (ONE_PAIR, ("wsa", "gw"), ["wsb"]),
    (ONE_PAIR, ("wsa", "wsb"), ["gw"]),
    (ONE_PAIR, ("wsb",), ["wsa", "gw"]),
    # A run reaches at least one pair.
    (ONE_PAIR, ("gw",), ["wsa", "wsb"]),
    (TWO_PAIRS, ("gw",), ["wsa", "wsb", "wsc", "wsd"]),
    # One workstation of pair b: its peer, not pair a.
    (TWO_PAIRS, ("wsc", "gw"), ["wsd"]),
    (TWO_PAIRS, ("wsa", "wsb", "wsd", "gw"), ["wsc"]),
    # Pair b without the gateway, which fronts every pair.
    (TWO_PAIRS, ("wsc", "wsd"), ["gw"]),
])
def test_a_run_that_splits_a_pair_or_leaves_the_gateway_out_is_refused_naming_them(
        inventory, active, missing) -> None:
    assert left_out(inventory, limited(*active)) == missing
    with pytest.raises(PartialRun) as refused:
        whole_pairs(inventory, limited(*active), "tp2_e2e")
    assert str(refused.value).startswith(
        f"refused: --limit/--exclude leaves {', '.join(missing)} out of this run; a run to "
        "tp2_e2e moves both workstations of each pair it reaches and the gateway as one unit")
    assert "--limit pair_<name>" in str(refused.value)
    assert "Nothing was changed" in str(refused.value)


@pytest.mark.parametrize("active", [
    ("wsc", "wsd", "gw"),
    ("wsa", "wsb", "gw"),
    ("wsa", "wsb", "wsc", "wsd", "gw"),
])
def test_a_run_may_leave_whole_pairs_out(active) -> None:
    whole_pairs(TWO_PAIRS, limited(*active), "tp2_e2e")
    assert names(reached(TWO_PAIRS, limited(*active))) == list(active)


def test_a_pairs_group_is_what_a_limit_to_it_reaches() -> None:
    """``--limit pair_b``: pyinfra's limit is the group's hosts, the gateway among them."""
    pair_b = TWO_PAIRS.get_group("pair_b")
    whole_pairs(TWO_PAIRS, lambda host: host in pair_b, "tp2_e2e")
    assert names(reached(TWO_PAIRS, lambda host: host in pair_b)) == ["wsc", "wsd", "gw"]
