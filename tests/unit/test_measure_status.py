"""The observed state: each layer judged from given facts, then matched or called drifted."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.hosts import remote, status
from harness.hosts.status import Status, Unknown
from harness.hosts.topology import Topology
from operations.serving import reading as serving_reading
from operations.serving.sglang import speculative_of
from operations.site.hosts import InventoryEntry
from operations.states import NEXTN_3_1_4, STATES
from operations.thunderbolt import driver_reading
from operations.thunderbolt.driver import CandidateModule

STOCK, CANDIDATE = "aa" * 20, "cc" * 20


def entry(name: str, rank: int) -> InventoryEntry:
    return InventoryEntry(name, ("workstations",), {
        "rank": rank, "ssh_hostname": f"10.0.0.{rank + 1}", "serving_port": 30000,
        "serving_served_model_name": "qwen", "link_interface": "thunderbolt0",
        "candidate_path": "/nonexistent/thunderbolt_net.ko", "candidate_sha256": "00" * 32,
    })


TOPOLOGY = Topology(
    (entry("wsa", 0), entry("wsb", 1)),
    InventoryEntry("gw", ("gateway",), {"ssh_hostname": "10.0.0.9",
                                        "gateway_roles_router_port": 30080}),
    Path("/nonexistent/ssh_config"),
)


def module(build: str, **parameters: str) -> dict:
    return {"initstate": "live", "build_id": build, "parameters": {"e2e": "Y", **parameters}}


def judged_driver(loaded: dict | None) -> dict:
    """What the driver layer's judge observes of ``loaded``, stock being :data:`STOCK`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CandidateModule, "readable_build_id", property(lambda _: CANDIDATE))
        return driver_reading.judge(TOPOLOGY.rank0.settings,
                                    {"module": loaded, "stock_build": STOCK}).observed


def test_the_driver_is_named_by_build_id_and_parameters():
    assert judged_driver(module(STOCK))["driver"] == "stock"
    assert judged_driver(module(CANDIDATE, tx_e2e="Y"))["driver"] == "candidate"
    # The stock file loaded with e2e=0 is the field report's control, a build of its own.
    assert judged_driver(module(STOCK, e2e="N"))["driver"] == "stock_e2e_off"
    # The candidate without tx_e2e=Y is no declared build.
    seen = judged_driver(module(CANDIDATE, tx_e2e="N"))
    assert seen["driver"] is None and "none of the declared builds" in seen["seen"]
    assert judged_driver(None)["driver"] is None
    # The status shows a driver that is none of the declared ones as unknown.
    for loaded, reason in ((None, "not loaded"), (module(CANDIDATE, tx_e2e="N"),
                                                  f"build {CANDIDATE}")):
        readings = {name: reading(name, module=loaded, stock_build=STOCK)
                    for name in ("wsa", "wsb")}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(CandidateModule, "readable_build_id", property(lambda _: CANDIDATE))
            seen = judged(driver_reading, readings)
        assert status.driver_layer(TOPOLOGY, seen) == Unknown(reason)


def test_nextn_is_recognised_under_the_name_sglang_reports():
    info = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    assert speculative_of(info) == NEXTN_3_1_4
    assert speculative_of({"speculative_algorithm": None}) is None
    with pytest.raises(ValueError):
        speculative_of({**info, "speculative_algorithm": "EAGLE3"})
    # The status shows an algorithm no state declares as unknown.
    rows: list = []
    infos = {"http://10.0.0.1:30000": {**info, "speculative_algorithm": "EAGLE3"},
             "http://10.0.0.2:30000": None}
    assert isinstance(status.speculative_layer(TOPOLOGY, infos, rows), Unknown)


def reading(host: str, **values: object) -> remote.Reading:
    return remote.Reading(host, values, 0.0)


def judged(layer: object, readings: dict[str, remote.Reading]) -> dict:
    """One layer's judgements of the workstations read, as status's one pass gives them."""
    return {entry.name: layer.judge(entry.settings, readings[entry.name].values)
            for entry in TOPOLOGY.workstations if not readings[entry.name].error}


def serving(readings: dict[str, remote.Reading], rows: list, fronted: list) -> object:
    return status.serving_layer(TOPOLOGY, judged(serving_reading, readings), readings, rows,
                                fronted)


def test_serving_is_tp2_only_with_each_rank_on_its_workstation_and_no_router():
    rows: list = []
    readings = {"wsa": reading("wsa", services=["sglang-tp2-rank0"]),
                "wsb": reading("wsb", services=["sglang-tp2-rank1"]),
                "gw": reading("gw", router=[])}
    assert serving(readings, rows, []) == "tp2"
    readings["wsb"] = reading("wsb", services=["sglang-replica"])
    value = serving(readings, rows, [])
    assert isinstance(value, Unknown) and "wsa tp2, wsb replicas" in value.reason


def test_replicas_without_their_router_are_not_production():
    readings = {"wsa": reading("wsa", services=["sglang-replica"]),
                "wsb": reading("wsb", services=["sglang-replica"]),
                "gw": reading("gw", router=["sglang-router"])}
    assert serving(readings, [], []) == "replicas"
    readings["gw"] = reading("gw", router=[])
    assert "without sglang-router" in serving(readings, [], []).reason


def test_a_pairs_tp_group_beside_a_router_that_fronts_other_pairs_is_tp2():
    readings = {"wsa": reading("wsa", services=["sglang-tp2-rank0"]),
                "wsb": reading("wsb", services=["sglang-tp2-rank1"]),
                "gw": reading("gw", router=["sglang-router"])}
    assert "still running" in serving(readings, [], []).reason
    assert serving(readings, [], ["http://10.0.0.14:30000"]) == "tp2"


def test_observed_layers_match_exactly_one_declared_state():
    observed = Status({"driver": "candidate", "serving": "tp2", "speculative": NEXTN_3_1_4,
                       "gateway_fallback": True})
    assert observed.match == "tp2_e2e"
    assert observed.verdict() == "matches: tp2_e2e"
    production = Status({layer: getattr(STATES["production"], layer)
                         for layer in ("driver", "serving", "speculative", "gateway_fallback")})
    assert production.match == "production"


def test_drift_names_the_closest_state_and_each_difference():
    observed = Status({"driver": "stock", "serving": "tp2", "speculative": NEXTN_3_1_4,
                       "gateway_fallback": Unknown("litellm does not answer")},
                      rows=[("driver", "wsa", "stock  build aa"), ("driver", "wsb", "stock")])
    assert observed.match is None
    assert observed.closest() == ("tp2_stock", ["gateway_fallback"])
    text = observed.render()
    assert text.startswith("driver\n  wsa    stock  build aa\n  wsb    stock")
    assert ("drifted: closest is tp2_stock; gateway_fallback is unknown: litellm does not "
            "answer, tp2_stock has present") in text
    assert observed.to_json()["layers"]["gateway_fallback"] == {
        "unknown": "litellm does not answer"}


def test_hosts_that_disagree_make_the_layer_unknown():
    assert status.agreed({"wsa": "stock", "wsb": "stock"}, "the driver") == "stock"
    mixed = status.agreed({"wsa": "stock", "wsb": "candidate"}, "the driver")
    assert mixed == Unknown("the driver differs: wsa stock, wsb candidate")


def test_an_unreachable_workstation_serves_nothing_status_can_name():
    readings = {"wsa": reading("wsa", services=["sglang-replica"]),
                "wsb": remote.Reading("wsb", {}, 0.0, error="ssh: timed out"),
                "gw": reading("gw", router=["sglang-router"])}
    value = serving(readings, [], [])
    assert isinstance(value, Unknown) and "wsb unknown: unreachable" in value.reason
