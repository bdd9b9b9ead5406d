"""A run moves the whole pair or nothing: --limit and --exclude are judged before anything."""

import pytest
from pyinfra.api import Inventory

from operations.safety.scope import PartialRun, left_out, whole_pair

INVENTORY = Inventory((["wsa", "wsb", "gw", "bastion"], {}),
                      workstations=(["wsa", "wsb"], {}), gateway=(["gw"], {}))


def limited(*names: str):
    return lambda host: host.name in names


def test_the_whole_pair_passes_and_a_host_outside_it_does_not_matter() -> None:
    assert left_out(INVENTORY, limited("wsa", "wsb", "gw")) == []
    whole_pair(INVENTORY, limited("wsa", "wsb", "gw"), "tp2_e2e")


@pytest.mark.parametrize(("active", "missing"), [
    (("wsb", "gw"), ["wsa"]),
    (("wsa", "gw"), ["wsb"]),
    (("wsa", "wsb"), ["gw"]),
    (("wsb",), ["wsa", "gw"]),
])
def test_a_run_that_leaves_a_host_of_the_pair_out_is_refused_naming_it(active, missing) -> None:
    assert left_out(INVENTORY, limited(*active)) == missing
    with pytest.raises(PartialRun) as refused:
        whole_pair(INVENTORY, limited(*active), "tp2_e2e")
    assert str(refused.value).startswith(
        f"refused: --limit/--exclude leaves {', '.join(missing)} out of this run; a run to "
        "tp2_e2e moves both workstations and the gateway as one unit")
    assert "Nothing was changed" in str(refused.value)
