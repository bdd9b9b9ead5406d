"""diagnose's rungs, judged from readings of the real shape, and the cause it names."""

from __future__ import annotations

from pathlib import Path

from harness.hosts import diagnose
from harness.hosts.remote import Reading
from harness.hosts.topology import Topology, Workstation
from operations.plumbing.probes import Answer
from operations.serving.sglang import TP_RANKS
from operations.serving.transport import Connections
from operations.states import STATES

TP2_E2E, PRODUCTION = STATES["tp2_e2e"], STATES["production"]


def workstation(name: str, rank: int, address: str, peer: str, **more) -> Workstation:
    return Workstation(name, ("workstations",), {
        "rank": rank, "ssh_hostname": f"10.0.0.{rank + 1}", "thunderbolt_address": address,
        "peer_thunderbolt_address": peer, "link_interface": "thunderbolt0",
        "link_expected_rate_gbps": 20.0, "link_expected_lanes": 1, "serving_port": 30000,
        "link_address_owner": "twinbolt",
        "candidate_module_name": "thunderbolt_net", "candidate_path": None,
        "candidate_sha256": None, **more})


TOPOLOGY = Topology((workstation("wsa", 0, "169.254.77.1", "169.254.77.2"),
                     workstation("wsb", 1, "169.254.77.2", "169.254.77.1")), None, Path("x"))


def readings(at: float, **values: object) -> dict[str, Reading]:
    """Both workstations read alike: a healthy link unless ``values`` says otherwise."""
    healthy = {
        "interface": {"exists": True, "carrier": True,
                      "addresses": ["169.254.77.1", "169.254.77.2"]},
        "counters": {"rx_errors": 0}, "answers": True, "sockets": {},
        "xdomain": {"device": "0-1", "peer": "peer", "rx_speed_gbps": 20.0,
                    "tx_speed_gbps": 20.0, "rx_lanes": 1, "tx_lanes": 1, "others": []},
    }
    return {name: Reading(name, {**healthy, **values}, at) for name in ("wsa", "wsb")}


def test_the_cause_is_the_lowest_failing_rung_with_its_fix() -> None:
    rungs = [diagnose.Rung(number, name) for number, name in
             enumerate(("route", "serving", "ranks", "sockets", "thunderbolt0"), start=1)]
    rungs[1].saw("rank 0 serves nothing", diagnose.FAIL)
    rungs[4].saw("no traffic moves", diagnose.FAIL)
    rungs[2].saw("old lines", diagnose.WARN)
    found = diagnose.Diagnosis("tp2_e2e", "matches", rungs, 1.0)
    assert found.cause is rungs[4]
    assert "cause: rung 5 (thunderbolt0) is the first boundary from the cable up" in found.render()
    assert found.to_json()["cause"]["rung"] == 5
    assert diagnose.Diagnosis("tp2_e2e", "matches", rungs[:1], 1.0).cause is None


def test_a_stalled_link_fails_thunderbolt0_and_a_rising_error_count_fails_the_candidate() -> None:
    before = readings(0.0)
    after = readings(2.0, answers=False, counters={"rx_errors": 4})
    rung = diagnose.interface_rung(TOPOLOGY, TP2_E2E, before, after)
    assert rung.verdict == diagnose.FAIL
    assert ("FAIL: wsa: the peer 169.254.77.2 does not answer across thunderbolt0 although it "
            "has carrier: no traffic moves (a TX credit stall under tx_e2e=1?)") in rung.evidence
    assert "FAIL: wsb: thunderbolt0 up, 169.254.77.2; 4 receiver error(s) in 2.0s" in rung.evidence


def test_the_rungs_judge_the_link_as_the_link_layer_does() -> None:
    """One judge: a second XDomain peer fails the xdomain rung; a bare interface, rung 5."""
    two_peers = readings(0.0, xdomain={"device": "0-1", "peer": "wsb", "rx_speed_gbps": 20.0,
                                       "tx_speed_gbps": 20.0, "rx_lanes": 1, "tx_lanes": 1,
                                       "others": ["1-1"]})
    rung = diagnose.xdomain_rung(TOPOLOGY, TP2_E2E, two_peers)
    assert rung.verdict == diagnose.FAIL
    assert any("2 XDomain peers are connected (0-1, 1-1)" in line for line in rung.evidence)
    bare = readings(0.0, interface={"exists": True, "carrier": True, "addresses": []})
    rung = diagnose.interface_rung(TOPOLOGY, TP2_E2E, bare, readings(2.0))
    assert "FAIL: wsa: thunderbolt0 lacks its address 169.254.77.1 (has none)" in rung.evidence


def test_receiver_errors_under_the_stock_driver_are_a_warning_not_a_failure() -> None:
    rung = diagnose.interface_rung(TOPOLOGY, PRODUCTION, readings(0.0),
                                   readings(2.0, counters={"rx_errors": 4}))
    assert rung.verdict == diagnose.WARN


def test_a_link_at_10g_fails_the_xdomain_rung_naming_rate_and_peer() -> None:
    slow = {"device": "0-1", "peer": "wsb", "rx_speed_gbps": 10.0, "tx_speed_gbps": 10.0,
            "rx_lanes": 1, "tx_lanes": 1, "others": []}
    rung = diagnose.xdomain_rung(TOPOLOGY, TP2_E2E, readings(0.0, xdomain=slow))
    assert rung.verdict == diagnose.FAIL
    assert rung.evidence[0] == ("FAIL: wsa: 10 Gb/s over 1 lane(s) to wsb (device 0-1), "
                                "expected 20 over 1")
    assert diagnose.xdomain_rung(TOPOLOGY, TP2_E2E, readings(0.0)).verdict == diagnose.PASS


def test_in_production_a_link_that_cannot_carry_a_tp_group_only_warns() -> None:
    """The replicas do not use the link: a cable out or at 10 Gb/s loses production nothing."""
    slow = {"device": "0-1", "peer": "wsb", "rx_speed_gbps": 10.0, "tx_speed_gbps": 10.0,
            "rx_lanes": 1, "tx_lanes": 1, "others": []}
    rung = diagnose.xdomain_rung(TOPOLOGY, PRODUCTION, readings(0.0, xdomain=slow))
    assert rung.verdict == diagnose.WARN
    assert rung.evidence[0].startswith("WARN: wsa: 10 Gb/s over 1 lane(s) to wsb")
    unplugged = readings(0.0, xdomain=None,
                         interface={"exists": False, "carrier": False, "addresses": []})
    assert diagnose.xdomain_rung(TOPOLOGY, PRODUCTION, unplugged).verdict == diagnose.WARN
    assert diagnose.xdomain_rung(TOPOLOGY, TP2_E2E, unplugged).verdict == diagnose.FAIL
    rung = diagnose.interface_rung(TOPOLOGY, PRODUCTION, unplugged, readings(2.0))
    assert rung.verdict == diagnose.WARN
    assert "WARN: wsa: thunderbolt0 does not exist (is the driver loaded?)" in rung.evidence


def test_a_rank_log_counts_only_since_the_server_last_started() -> None:
    lines = ["[TP0] Scheduler hit an exception: PeerLost", "[TP0] server_args=ServerArgs(...)",
             "[TP0] The server is fired up and ready to roll!"]
    assert diagnose.since_start(lines) == lines[1:]
    process = {"running": True, "pid": 7, "seconds": 12.0, "status": "run"}
    healthy = readings(0.0, **{"process sglang-tp2-rank0": process, "log sglang-tp2-rank0": lines})
    assert diagnose.ranks_rung(TOPOLOGY, healthy).verdict == diagnose.PASS
    crashed = readings(0.0, **{"process sglang-tp2-rank0": process,
                               "log sglang-tp2-rank0": [*lines, "[TP0] NCCL WARN timeout"]})
    rung = diagnose.ranks_rung(TOPOLOGY, crashed)
    assert rung.verdict == diagnose.FAIL
    assert "FAIL: wsa sglang-tp2-rank0 log: [TP0] NCCL WARN timeout" in rung.evidence


def test_the_route_names_who_served_each_role_and_fails_a_missing_fallback() -> None:
    def answered(deployment: str) -> Answer:
        return Answer("http://gw:4000/v1/chat/completions", 200,
                      {"choices": [{"message": {"content": "a b c d e f g h"}}],
                       "usage": {"completion_tokens": 8}},
                      {"x-litellm-model-id": deployment}, None, 0.2)

    gateway = Reading("gw", {"roles": {"small": answered("small-router"),
                                       "large": answered("large-backend")}}, 0.0)
    assert diagnose.route_rung(gateway, PRODUCTION.gateway_fallback).verdict == diagnose.PASS
    rung = diagnose.route_rung(gateway, TP2_E2E.gateway_fallback)
    assert rung.verdict == diagnose.FAIL
    assert "FAIL: role small: it was served by deployment 'small-router', not 'large-backend'" \
        in " ".join(rung.evidence)
    # A pair's TP group while other pairs serve small: small stays on its own deployment.
    assert diagnose.route_rung(gateway, fallback=False).verdict == diagnose.PASS


def test_every_query_of_both_readings_builds_its_command() -> None:
    """A fact's command may be a method or a plain string (Gpus): both must reach the script."""
    entry = workstation("wsa", 0, "169.254.77.1", "169.254.77.2",
                        serving_init_system="runit", run_dir="/run/twinbolt")
    for state in (TP2_E2E, PRODUCTION):
        for query in (*diagnose.first_reading(entry, state), *diagnose.second_reading(entry)):
            assert isinstance(query.command(), str) and query.command(), query.key


def group_reading(pid: int, scheduler: int, address: str, peer: str, *sockets: str) -> dict:
    """``ps``, ``ss`` and ``ip -o addr`` of a rank whose scheduler holds ``sockets``."""
    return Connections().process([
        f"{pid} 1", f"{scheduler} {pid}", "@@",
        *(f'0 0 {line} users:(("python",pid={scheduler},fd=9))' for line in sockets), "@@",
        "1: lo    inet 127.0.0.1/8 scope host lo",
        f"3: thunderbolt0    inet {address}/16 scope link thunderbolt0"])


def test_the_sockets_rung_leaves_a_real_groups_own_connections_aside() -> None:
    """Rank 0's store holds both ends of its own client; each rank reaches its own proxy."""
    wsa = group_reading(4242, 4250, "169.254.77.1", "169.254.77.2",
                        "[::ffff:169.254.77.1]:5757 [::ffff:169.254.77.1]:42848",
                        "169.254.77.1:42848 169.254.77.1:5757",
                        "[::ffff:169.254.77.1]:5757 [::ffff:169.254.77.2]:51022",
                        "169.254.77.1:39157 169.254.77.1:43311",
                        "169.254.77.1:43311 169.254.77.1:39157",
                        "169.254.77.1%thunderbolt0:36022 169.254.77.2:45233")
    wsb = group_reading(5242, 5250, "169.254.77.2", "169.254.77.1",
                        "169.254.77.2:51022 169.254.77.1:5757",
                        "169.254.77.2:40811 169.254.77.2:35533",
                        "169.254.77.2:35533 169.254.77.2:40811",
                        "169.254.77.2:45233 169.254.77.1:36022")
    first = {name: Reading(name, {f"process {TP_RANKS[rank]}": {"pid": pid}, "sockets": {}}, 0.0)
             for name, rank, pid in (("wsa", 0, 4242), ("wsb", 1, 5242))}

    def second(wsa_reading: dict) -> dict[str, Reading]:
        return {name: Reading(name, {"connections": reading, "sockets": {}}, 2.0)
                for name, reading in (("wsa", wsa_reading), ("wsb", wsb))}

    rung = diagnose.sockets_rung(TOPOLOGY, TP2_E2E, first, second(wsa))
    assert rung.verdict != diagnose.FAIL, rung.evidence
    assert "wsa: 6 connection(s) of the rank; 0 socket(s) to the peer retransmitted 0 " \
           "segment(s) during the probes" in " ".join(rung.evidence)
    stray = dict(wsa, connections=[*wsa["connections"], {
        "local": "10.66.0.11%eth0:41000", "peer": "10.66.0.12:38000", "pids": [4250]}])
    rung = diagnose.sockets_rung(TOPOLOGY, TP2_E2E, first, second(stray))
    assert rung.verdict == diagnose.FAIL
    assert any("wsa: the TP group's transport is not thunderbolt0: its connections "
               "10.66.0.11:41000 -> 10.66.0.12:38000 run outside" in line
               for line in rung.evidence)


def test_rank_0_must_report_the_groups_size_as_the_site_gives_it() -> None:
    served = Answer("http://10.0.0.1:30000/v1/chat/completions", 200,
                    {"choices": [{"message": {"content": "a b c d e f g h"}}],
                     "usage": {"completion_tokens": 8}}, {}, None, 0.2)
    info = Answer("http://10.0.0.1:30000/server_info", 200,
                  {"tp_size": 2, "served_model_name": "qwen", "speculative_algorithm": "EAGLE",
                   "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                   "speculative_num_draft_tokens": 4}, {}, None, 0.1)
    answers = {"http://10.0.0.1:30000": (served, info)}
    assert diagnose.serving_rung(answers, TP2_E2E, "qwen", 2).verdict == diagnose.PASS
    rung = diagnose.serving_rung(answers, TP2_E2E, "qwen", 3)
    assert "FAIL: http://10.0.0.1:30000: /server_info reports tp_size=2, expected 3" \
        in rung.evidence
