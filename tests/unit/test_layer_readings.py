"""
Each layer's reading of a host and its judge (operations/*/reading.py,
operations/thunderbolt/*_reading.py), and that the harness reads the hosts only
through them.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from operations.gateway import reading as gateway_reading
from operations.plumbing import probes
from operations.safety import reading as safety_reading
from operations.serving import reading as serving_reading
from operations.site.hosts import InventoryEntry
from operations.site.settings import WorkstationSettings
from operations.states import Driver
from operations.thunderbolt import driver_reading, link_reading
from operations.thunderbolt.driver import CandidateModule

ROOT = Path(__file__).resolve().parents[2]
STOCK, CANDIDATE = "aa" * 20, "cc" * 20
WORKSTATION = WorkstationSettings.of(InventoryEntry("wsa", ("workstations",), {
    "rank": 0, "thunderbolt_address": "169.254.77.1", "peer_thunderbolt_address": "169.254.77.2",
    "link_interface": "thunderbolt0", "link_expected_rate_gbps": 20.0, "link_expected_lanes": 1,
    "link_address_owner": "twinbolt", "link_prefix_length": 16, "link_wait_seconds": 30.0,
    "candidate_path": "/nonexistent/thunderbolt_net.ko", "candidate_sha256": None}))


@pytest.fixture(autouse=True)
def candidate_build(monkeypatch) -> None:
    """The candidate's build-id, as its file on the operator's machine would give it."""
    monkeypatch.setattr(CandidateModule, "readable_build_id", property(lambda _: CANDIDATE))
GATEWAY = SimpleNamespace(roles=SimpleNamespace(litellm_service="litellm"))


def module(build: str, **parameters: str) -> dict:
    return {"initstate": "live", "build_id": build, "parameters": {"e2e": "Y", **parameters}}


NOT_DECLARED = ("none of the declared builds (stock, with e2e on or off, or the candidate)"
                f"  build {CANDIDATE}  e2e=Y tx_e2e=N")


@pytest.mark.parametrize(("loaded", "expected", "observed", "problems"), [
    (module(STOCK), None, {"driver": "stock", "seen": f"stock  build {STOCK}  e2e=Y"}, []),
    (module(STOCK, e2e="N"), "stock_e2e_off", {"driver": "stock_e2e_off"}, []),
    (module(CANDIDATE, tx_e2e="Y"), "candidate",
     {"driver": "candidate", "seen": f"candidate  build {CANDIDATE}  e2e=Y tx_e2e=Y"}, []),
    (module(STOCK), "candidate", {"driver": "stock"},
     ["the stock driver is loaded, not the candidate driver"]),
    (module(CANDIDATE, tx_e2e="N"), None, {"driver": None, "build_id": CANDIDATE,
                                           "seen": NOT_DECLARED}, [NOT_DECLARED]),
    (None, "stock", {"driver": None, "build_id": None, "seen": "thunderbolt_net is not loaded"},
     ["thunderbolt_net is not loaded"]),
])
def test_the_driver_judge(loaded, expected, observed, problems) -> None:
    judged = driver_reading.judge(WORKSTATION, {"module": loaded, "stock_build": STOCK},
                                  expected)
    assert {key: judged.observed[key] for key in observed} == observed
    assert judged.problems == problems


def xdomain(rate: float = 20.0, lanes: int = 1, others: tuple[str, ...] = ()) -> dict:
    return {"device": "0-1", "peer": "wsb", "rx_speed_gbps": rate, "tx_speed_gbps": rate,
            "rx_lanes": lanes, "tx_lanes": lanes, "others": list(others)}


UP = {"exists": True, "carrier": True, "addresses": ["169.254.77.1"]}


@pytest.mark.parametrize(("seen", "interface", "observed", "problems"), [
    (xdomain(), UP, "20 Gb/s (1 lane(s)) to wsb; thunderbolt0 carrier, 169.254.77.1", []),
    (xdomain(10.0), UP, "10 Gb/s (1 lane(s)) to wsb; thunderbolt0 carrier, 169.254.77.1",
     ["the link to wsb trained at 10 Gb/s over 1 lane(s), expected 20 Gb/s over 1 "
      "(check the cable and the ports)"]),
    (None, {"exists": True, "carrier": False, "addresses": []},
     "no XDomain peer; thunderbolt0 no carrier, no address",
     ["no XDomain peer is connected", "thunderbolt0 has no carrier"]),
    (xdomain(), {"exists": True, "carrier": True, "addresses": []},
     "20 Gb/s (1 lane(s)) to wsb; thunderbolt0 carrier, no address",
     ["thunderbolt0 lacks its address 169.254.77.1 (has none)"]),
])
def test_the_link_judge(seen, interface, observed, problems) -> None:
    judged = link_reading.judge(WORKSTATION, {"xdomain": seen, "interface": interface})
    assert judged.observed["seen"] == observed
    assert judged.problems == problems


SILENT = ("the peer 169.254.77.2 does not answer across thunderbolt0 although it has carrier: "
          "no traffic moves (a TX credit stall under tx_e2e=1?)")


@pytest.mark.parametrize(("interface", "answers", "carrier", "problems"), [
    (UP, True, True, []),
    # Only a link with carrier can be silent; without answers read, nobody asked.
    (UP, False, True, [SILENT]),
    (UP, None, True, []),
    ({"exists": False, "carrier": False, "addresses": []}, False, False,
     ["thunderbolt0 does not exist (is the driver loaded?)"]),
])
def test_the_interface_judge_hears_a_silent_peer(interface, answers, carrier, problems) -> None:
    values = {"interface": interface} | ({} if answers is None else {"answers": answers})
    judged = link_reading.judge_interface(WORKSTATION, values)
    assert judged.observed["carrier"] is carrier
    assert judged.problems == problems


@pytest.mark.parametrize(("running", "serving", "seen", "problems"), [
    (["sglang-replica"], "replicas", "sglang-replica", []),
    (["sglang-tp2-rank0"], "tp2", "sglang-tp2-rank0", []),
    # Rank 1's service on rank 0, or two at once, is no declared mode.
    (["sglang-tp2-rank1"], None, "sglang-tp2-rank1",
     ["runs sglang-tp2-rank1, no declared mode"]),
    (["sglang-replica", "sglang-tp2-rank0"], None, "sglang-replica, sglang-tp2-rank0",
     ["runs sglang-replica, sglang-tp2-rank0, no declared mode"]),
    ([], None, "no SGLang service", ["runs nothing, no declared mode"]),
])
def test_the_serving_judge(running, serving, seen, problems) -> None:
    judged = serving_reading.judge(WORKSTATION, {"services": running})
    assert judged.observed == {"serving": serving, "running": running, "seen": seen}
    assert judged.problems == problems


FALLBACK = {"fallbacks": {"small": ["large"]}, "context_window_fallbacks": {"small": ["large"]}}
NONE = {"fallbacks": {}, "context_window_fallbacks": {"small": ["large"]}}


@pytest.mark.parametrize(("live", "config", "observed", "problems"), [
    (FALLBACK, FALLBACK, {"fallback": True, "seen": "litellm: small -> large on any error; "
                          "small -> large on context overflow; config file: general fallback "
                          "present"}, []),
    (NONE, FALLBACK, {"fallback": False, "seen": "litellm: small -> nothing on any error; "
                      "small -> large on context overflow; config file: general fallback "
                      "present"}, []),
    (None, None, {"fallback": None, "seen": "litellm running, its API does not answer; "
                  "config file: general fallback absent"}, ["litellm does not answer"]),
])
def test_the_gateway_judge(live, config, observed, problems) -> None:
    judged = gateway_reading.judge(GATEWAY, {"live": live, "config": config,
                                             "proxy": ["litellm"]})
    assert judged.observed == observed
    assert judged.problems == problems


STALL = {"kind": "stall", "time": 0, "peer": "169.254.77.2", "stalled_seconds": 30,
         "tx_e2e": "Y", "state": "done", "restored": True}


@pytest.mark.parametrize(("guard", "armed", "events", "problems"), [
    ({"armed": True, "events": []}, True, 0, []),
    ({"armed": False, "events": []}, False, 0, ["the guard is not armed"]),
    # A guard that restored stock has exited: its event says so, not "not armed".
    ({"armed": False, "events": [STALL]}, False, 1, ["the guard restored stock: "]),
])
def test_the_guard_judge(guard, armed, events, problems) -> None:
    judged = safety_reading.judge(WORKSTATION, {"guard": guard})
    assert judged.observed["armed"] is armed and len(judged.observed["events"]) == events
    assert [problem[:len(prefix)] for problem, prefix
            in zip(judged.problems, problems, strict=True)] == problems
    assert [f"the guard {event}" for event in judged.observed["events"]] == \
        judged.problems[:events]


@pytest.mark.parametrize(("peer", "expected", "observed", "problems"), [
    (None, "stock", {"peer": False, "seen": "no peer advertises a ThunderboltIP service"},
     ["no peer advertises a ThunderboltIP service"]),
    ({"service": 1, "prtcstns": 0x1}, "candidate",
     {"peer": True, "seen": "the peer advertises prtcstns 0x00000001"}, []),
    # tx_e2e=1 needs the peer's E2E bit; the stock driver does not.
    ({"service": 1, "prtcstns": 0x2}, "candidate",
     {"peer": True, "seen": "the peer does not advertise E2E (service 1 prtcstns 0x00000002, "
                            "bit 0 clear) under tx_e2e=1"},
     ["the peer does not advertise E2E (service 1 prtcstns 0x00000002, bit 0 clear) under "
      "tx_e2e=1"]),
    ({"service": 1, "prtcstns": 0x2}, "stock",
     {"peer": True, "seen": "the peer advertises prtcstns 0x00000002"}, []),
])
def test_the_peer_judge(peer, expected, observed, problems) -> None:
    judged = driver_reading.judge_peer({"peer": peer}, Driver(expected))
    assert judged.observed == observed
    assert judged.problems == problems


def connection(local: str, peer: str, *pids: int) -> dict:
    return {"local": local, "peer": peer, "pids": list(pids)}


ADDRESSES = ["127.0.0.1", "169.254.77.1", "10.0.0.1"]
ACROSS = connection("169.254.77.1:40000", "169.254.77.2:5000", 11)
OFF_LINK = connection("10.0.0.1:40001", "10.0.0.2:5000", 11)


@pytest.mark.parametrize(("pid", "held", "problems"), [
    # The rank's child holds the group's connection across the link.
    (10, [ACROSS], []),
    (10, [ACROSS, OFF_LINK], ["the TP group's transport is not thunderbolt0"]),
    # A rank that is not running holds nothing, so none crosses the link.
    (None, [], ["the TP group has no connection"]),
])
def test_the_connections_judge(pid, held, problems) -> None:
    connections = {"connections": [ACROSS, OFF_LINK][:len(held)] if held else [ACROSS],
                   "parents": {11: 10}, "addresses": ADDRESSES}
    judged = serving_reading.judge_connections(WORKSTATION, {"pid": pid}, connections)
    assert judged.observed["held"] == held
    assert [problem[:len(prefix)] for problem, prefix
            in zip(judged.problems, problems, strict=True)] == problems


def answer(model_id: str, tokens: int = 8, status: int = 200) -> probes.Answer:
    return probes.Answer("http://gw:4000", status, {
        "choices": [{"message": {"content": "hello"}}], "usage": {"completion_tokens": tokens}},
        {"x-litellm-model-id": model_id}, seconds=0.25)


@pytest.mark.parametrize(("small", "fallback", "seen", "problems"), [
    (answer("small-router"), False, "role small: served by small-router in 0.25s", []),
    (answer("large-backend"), True, "role small: served by large-backend in 0.25s", []),
    # Served, but not by whom the state says: small still on large after a return.
    (answer("large-backend"), False, "role small: served by large-backend in 0.25s",
     ["role small: it was served by deployment 'large-backend', not 'small-router'"]),
    (answer("small-router", tokens=3), False, "role small: served by small-router in 0.25s",
     ["role small: the completion has 3 tokens, 8 were asked for"]),
])
def test_the_roles_judge(small, fallback, seen, problems) -> None:
    judged = gateway_reading.judge_roles(
        {"roles": {"small": small, "large": answer("large-backend")}}, fallback, 8)
    assert [each.observed["seen"] for each in judged] == [
        seen, "role large: served by large-backend in 0.25s"]
    assert [problem[:len(prefix)] for problem, prefix
            in zip(judged[0].problems, problems, strict=True)] == problems
    assert judged[1].problems == []


def query_constructions(path: Path) -> list[int]:
    """The lines of ``path`` that call ``Query(...)`` or ``<module>.Query(...)``."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) == "Query"
                 or getattr(node.func, "attr", None) == "Query")]


def test_the_harness_reads_hosts_only_through_the_layers_readings() -> None:
    """No module of harness/ picks facts of its own: each layer's reading names them."""
    found = {str(path.relative_to(ROOT)): lines
             for path in sorted((ROOT / "harness").rglob("*.py"))
             if (lines := query_constructions(path))}
    assert found == {}
    # The check sees a construction where there is one.
    assert query_constructions(ROOT / "operations" / "thunderbolt" / "link_reading.py")
