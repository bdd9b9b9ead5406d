"""The serving layer's pure parts: argv and environment from a state, and the evidence."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
from operation_harness import a_run, local_key_file, run_operation
from pyinfra.api import OperationError
from pyinfra.facts.apt import AptSources
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Which
from pyinfra_fakes import FakeHost, commands, on
from sglang_router.launch_router import parse_router_args

from lab.sglang_sim.args import parse_server_args
from operations import services
from operations.plumbing import keys, probes
from operations.plumbing.facts import FileDigest, digest
from operations.plumbing.probes import Proofs, Proven
from operations.plumbing.venvs import lock_pins
from operations.serving import router as serving_router
from operations.serving import sglang as serving
from operations.serving.router import ROUTER_LOCK, Router, router_service
from operations.serving.sglang import (
    ACCEPTANCE_TOKENS,
    Sglang,
    SglangVersion,
    process_problems,
    replica_service,
    server_info_problems,
    tp_rank_service,
    version_problems,
)
from operations.states import NEXTN_3_1_4, STATES, ServingMode

REPO = Path(__file__).resolve().parents[2]

RANK0 = Sglang(
    address="10.66.0.11", rank=0, tp_size=2, link_address="169.254.77.1",
    peer_link_address="169.254.77.2", rank0_link_address="169.254.77.1", interface="thunderbolt0",
    python="/opt/sglang/bin/python", sglang_module="sglang.launch_server",
    model_path="/srv/models/qwen", served_model_name="qwen", quantization="modelopt_fp4",
    context_length=32768, mem_fraction_static=0.85, draft_model_path=None, port=30000,
    dist_init_port=5757, min_sglang_version="0.5.9", user="sglang", init_system="systemd",
    working_directory="/", start_timeout_seconds=900,
    api_key_file=local_key_file("sglang_api_key"),
    admin_api_key_file=local_key_file("sglang_admin_key", "sk-admin0123456789abcdef"),
    keys_file="/etc/twinbolt/sglang_keys.yaml",
)
RANK1 = replace(RANK0, address="10.66.0.12", rank=1, link_address="169.254.77.2",
                peer_link_address="169.254.77.1")


def flags(argv: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs (value ``None`` for a bare switch), after the module."""
    parsed: dict[str, str | None] = {}
    words = argv[3:]
    for index, word in enumerate(words):
        if word.startswith("--"):
            following = words[index + 1] if index + 1 < len(words) else "--"
            parsed[word] = None if following.startswith("--") else following
    return parsed


def test_a_replica_is_one_gpu_with_metrics_and_cache_report() -> None:
    service = replica_service(RANK0)
    assert service.name == "sglang-replica"
    assert service.command[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    assert flags(service.command) == {
        "--config": "/etc/twinbolt/sglang_keys.yaml",
        "--model-path": "/srv/models/qwen", "--served-model-name": "qwen",
        "--host": "0.0.0.0", "--port": "30000", "--enable-metrics": None,
        "--enable-cache-report": None, "--quantization": "modelopt_fp4",
        "--context-length": "32768", "--mem-fraction-static": "0.85",
    }
    assert service.environment == {}


@pytest.mark.parametrize("workstation", [RANK0, RANK1], ids=["rank0", "rank1"])
def test_a_tp_rank_meets_at_rank_0s_link_address_with_every_socket_pinned(
        workstation: Sglang) -> None:
    service = tp_rank_service(workstation, NEXTN_3_1_4)
    assert service.name == f"sglang-tp2-rank{workstation.rank}"
    parsed = flags(service.command)
    assert parsed["--tp-size"] == "2" and parsed["--nnodes"] == "2"
    assert parsed["--node-rank"] == str(workstation.rank)
    assert parsed["--dist-init-addr"] == "169.254.77.1:5757"
    assert service.environment == {
        "NCCL_SOCKET_IFNAME": "=thunderbolt0", "NCCL_SOCKET_FAMILY": "AF_INET",
        "GLOO_SOCKET_IFNAME": "thunderbolt0", "SGLANG_HOST_IP": workstation.link_address,
        "NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket",
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
    }


def test_a_tp_rank_is_one_node_of_a_group_as_large_as_its_data_says() -> None:
    # The site gives tp_size (its count of workstations); nothing here assumes two.
    wider = replace(RANK1, tp_size=3, rank0_link_address="169.254.77.9")
    parsed = flags(tp_rank_service(wider, None).command)
    assert (parsed["--tp-size"], parsed["--nnodes"], parsed["--node-rank"]) == ("3", "3", "1")
    assert parsed["--dist-init-addr"] == "169.254.77.9:5757"


def test_nextn_3_1_4_flags_and_none_without_speculation() -> None:
    nextn = flags(tp_rank_service(RANK0, NEXTN_3_1_4).command)
    assert {key: value for key, value in nextn.items() if key.startswith("--speculative")} == {
        "--speculative-algorithm": "NEXTN", "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "4",
    }
    plain = tp_rank_service(RANK0, None).command
    assert not any(word.startswith("--speculative") for word in plain)


def test_the_draft_weights_path_is_passed_only_where_the_site_sets_one() -> None:
    drafted = tp_rank_service(replace(RANK0, draft_model_path="/srv/models/mtp"), NEXTN_3_1_4)
    assert flags(drafted.command)["--speculative-draft-model-path"] == "/srv/models/mtp"
    assert "--speculative-draft-model-path" not in tp_rank_service(
        replace(RANK0, draft_model_path="/srv/models/mtp"), None).command


def test_unset_site_values_leave_sglang_its_defaults() -> None:
    bare = replace(RANK0, context_length=None, mem_fraction_static=None, quantization=None)
    parsed = flags(replica_service(bare).command)
    assert not {"--context-length", "--mem-fraction-static", "--quantization"} & set(parsed)


@pytest.mark.parametrize("state", list(STATES.values()), ids=lambda state: state.name)
def test_every_rendered_command_passes_sglangs_strict_parser(state, tmp_path: Path) -> None:
    # The simulator's parser has SGLang's flag names and exits 2 on anything else,
    # so a typo in a flag fails here before it fails on a workstation; the keys'
    # file is read as SGLang's --config reads it.
    for workstation in (RANK0, RANK1):
        service = (tp_rank_service(workstation, state.speculative) if state.serving == "tp2"
                   else replica_service(workstation))
        keys_file = tmp_path / "sglang_keys.yaml"
        keys_file.write_text(workstation.keys_config())
        argv = [str(keys_file) if word == workstation.keys_file else word
                for word in service.command[3:]]
        args = parse_server_args(argv)
        assert args.tp_size == (2 if state.serving == "tp2" else 1)
        assert args.speculative_algorithm == ("EAGLE" if state.speculative else None)
        assert (args.api_key, args.admin_api_key) == (
            keys.local_key(workstation.api_key_file),
            keys.local_key(workstation.admin_api_key_file))


def test_the_router_fronts_only_the_replicas_with_cache_aware_policy() -> None:
    router = Router(address="10.66.0.13", listen_address="0.0.0.0", port=30080,
                    venv="/opt/twinbolt/sglang-router",
                    user="nobody", init_system="systemd", pip_options=(),
                    key_file="/etc/twinbolt/router_control_key",
                    worker_key_file="/etc/twinbolt/router_worker_key",
                    api_key_file=RANK0.api_key_file,
                    workers=("http://10.66.0.12:30000", "http://10.66.0.11:30000"),
                    served_model_name="qwen", start_timeout_seconds=900)
    service = router_service(router)
    # Its control key read from its file as it starts (test_router_workers.py), then:
    program = service.command.index("/opt/twinbolt/sglang-router/bin/python")
    assert service.command[program:program + 3] == [
        "/opt/twinbolt/sglang-router/bin/python", "-m", "sglang_router.launch_router"]
    parsed = parse_router_args(service.command[program + 3:])
    assert parsed.worker_urls == sorted(router.workers)
    # It binds the listening address, never the gateway's name (127.0.1.1 on Debian).
    assert (parsed.policy, parsed.host, parsed.port) == ("cache_aware", "0.0.0.0", 30080)


def test_the_gateway_installs_the_router_the_lab_tests_with() -> None:
    """The router's lock pins the version the lab's venv has, which these tests import."""
    assert lock_pins(ROUTER_LOCK)["sglang-router"] == version("sglang-router") == "0.3.2"


def test_settings_come_from_host_data_rank_1_meets_at_its_peers_address() -> None:
    data = {
        "ssh_hostname": "10.66.0.12", "rank": 1, "tp_size": 3,
        "thunderbolt_address": "169.254.77.2", "peer_thunderbolt_address": "169.254.77.1",
        "rank0_thunderbolt_address": "169.254.77.1", "link_interface": "thunderbolt0",
        "serving_python": "/p", "serving_sglang_module": "sglang.launch_server",
        "serving_model_path": "/m", "serving_served_model_name": "qwen",
        "serving_quantization": None, "serving_context_length": None,
        "serving_mem_fraction_static": None, "serving_draft_model_path": None,
        "serving_port": 30000, "serving_dist_init_port": 5757,
        "serving_min_sglang_version": "0.5.9", "serving_user": "sglang",
        "serving_init_system": "runit", "serving_working_directory": "/",
        "serving_start_timeout_seconds": 60, "serving_listen_address": "10.66.0.12",
    }
    host = SimpleNamespace(name="wsb", data=SimpleNamespace(**data, get=data.get))
    workstation = Sglang.from_host(host)
    assert flags(serving.server_command(workstation))["--host"] == "10.66.0.12"
    assert workstation.rank0_link_address == "169.254.77.1"
    # The group's size is the host's datum, not a count this module assumes.
    assert workstation.tp_size == 3
    assert workstation.url == "http://10.66.0.12:30000"
    assert workstation.tp_rank_name == "sglang-tp2-rank1"


# The SGLang version


@pytest.mark.parametrize("found, problem", [
    ({"version": "0.5.9"}, None),
    ({"version": "0.5.10"}, None),
    ({"version": "0.5.9.post1"}, None),
    ({"version": "0.5.8"}, "SGLang 0.5.8 is older than the minimum 0.5.9"),
    ({"version": "0.5.9rc0"}, "SGLang 0.5.9rc0 is older than the minimum 0.5.9"),
    ({"version": "banana"}, "unreadable version 'banana'"),
    ({"error": "No module named 'sglang'"}, "cannot read the SGLang version: No module"),
])
def test_version_problems_name_both_versions(found: dict, problem: str | None) -> None:
    found_problems = version_problems(found, "0.5.9")
    if problem is None:
        assert found_problems == []
    else:
        assert len(found_problems) == 1 and problem in found_problems[0]


# The quantization the installed SGLang accepts


@pytest.mark.parametrize("installed, quantization, refusal", [
    ("0.5.9", "marlin", None),
    ("0.5.19", "marlin", None),
    ("0.5.20", "marlin", "only SGLang before 0.5.20 accepts it"),
    ("0.5.23", "marlin", "only SGLang before 0.5.20 accepts it"),
    ("0.5.15", "humming", "only SGLang 0.5.16 and later accepts it"),
    ("0.5.16", "humming", None),
    ("0.5.9", "qoq", None),
    ("0.5.16.post1", "qoq", "only SGLang before 0.5.16 accepts it"),
    ("0.5.23", "modelopt_fp4", None),
    ("0.5.9", None, None),                  # SGLang's own default
])
def test_a_quantization_is_judged_by_the_installed_release(installed: str, quantization: str,
                                                           refusal: str | None) -> None:
    found = serving.quantization_problems({"version": installed}, quantization, "/opt/sglang/py")
    assert found == [] if refusal is None else (len(found) == 1 and refusal in found[0])


def test_a_refused_quantization_names_the_value_the_release_and_both_fixes() -> None:
    [newer] = serving.quantization_problems({"version": "0.5.23"}, "marlin", "/opt/sglang/py")
    assert newer.startswith("SGLang 0.5.23 refuses --quantization marlin (serving.quantization)")
    assert "Set serving.quantization to a value 0.5.23 accepts (awq, fp8, mxfp8, gptq, " in newer
    assert "gptq_marlin" in newer and " marlin," not in newer
    assert newer.endswith("or install an SGLang before 0.5.20 for /opt/sglang/py")
    [older] = serving.quantization_problems({"version": "0.5.9"}, "humming", "/opt/sglang/py")
    assert older.endswith("or upgrade SGLang to 0.5.16 or later for /opt/sglang/py")


@pytest.mark.parametrize("found", [{"error": "No module named 'sglang'"}, {"version": "banana"}])
def test_without_a_readable_version_the_quantization_is_not_judged(found: dict) -> None:
    # The minimum version's judge says so, in the states that need a version.
    assert serving.quantization_problems(found, "marlin", "/opt/sglang/py") == []


def preflight_facts(installed: str, read: list[dict] | None = None):
    """Weights present, no replica running, SGLang ``installed``; each read kept in ``read``."""

    def facts(cls: type, kwargs: dict) -> object:
        if cls is SglangVersion:
            (read if read is not None else []).append(kwargs)
            return {"version": installed}
        return {Directory: {"mode": 755}, services.RunningServices: []}[cls]

    return facts


@pytest.mark.parametrize("state", ["production", "tp2_stock_nospec", "tp2_e2e"])
def test_preflight_refuses_a_quantization_the_installed_sglang_refuses(state: str) -> None:
    target = STATES[state]
    with pytest.raises(OperationError) as refused:
        run_operation(serving.admissible, preflight_facts("0.5.23"),
                      sglang=replace(RANK0, quantization="marlin"), serving=target.serving,
                      speculative=target.speculative)
    assert str(refused.value).startswith(
        "wsa: serving layer: SGLang 0.5.23 refuses --quantization marlin (serving.quantization)")
    assert "install an SGLang before 0.5.20 for /opt/sglang/bin/python" in str(refused.value)


def test_preflight_refuses_keys_missing_or_unsafe_where_twinbolt_runs(tmp_path: Path) -> None:
    """Before the first change, as every other prerequisite, naming the file and the fix."""
    unsafe = tmp_path / "sglang_admin_key"
    unsafe.write_text("sk-0123456789abcdef0123\n")
    unsafe.chmod(0o644)
    keys.local_key.cache_clear()
    with pytest.raises(OperationError) as refused:
        run_operation(serving.admissible, preflight_facts("0.5.23"),
                      sglang=replace(RANK0, admin_api_key_file=str(unsafe)),
                      serving="replicas", speculative=None)
    assert str(refused.value).startswith(
        f"wsa: serving layer: the SGLang servers' keys, on the machine running twinbolt: "
        f"{unsafe}: must be a regular file of mode 0600, not -rw-r--r--; make one with: "
        f"install -D -m 600 /dev/null {unsafe}")


def test_preflight_reads_the_version_once_and_only_when_something_depends_on_it() -> None:
    read: list[dict] = []
    run_operation(serving.admissible, preflight_facts("0.5.23", read), sglang=RANK0,
                  serving="tp2", speculative=NEXTN_3_1_4)
    # Read as the serving user, not as root (the venv and its directory are that user's).
    assert read == [{"python": "/opt/sglang/bin/python", "module": "sglang.launch_server",
                     "working_directory": "/", "user": "sglang"}]
    read.clear()
    run_operation(serving.admissible, preflight_facts("0.5.23", read),
                  sglang=replace(RANK0, quantization=None), serving="replicas", speculative=None)
    assert read == []


@pytest.mark.parametrize("module, package_version", [
    ("lab.sglang_sim", "0.5.9"),  # a package run with -m: its own __version__
    ("httpx._api", None),          # a module inside a package: the package's
])
def test_the_version_probe_imports_the_package_that_provides_the_server(
        module: str, package_version: str | None) -> None:
    import httpx
    run = subprocess.run([sys.executable, "-c", SglangVersion.SCRIPT, module], cwd=REPO,
                         capture_output=True, text=True)
    found = SglangVersion().process(run.stdout.splitlines())
    assert found == {"version": package_version or httpx.__version__}


def test_a_missing_server_module_is_reported_not_raised() -> None:
    run = subprocess.run([sys.executable, "-c", SglangVersion.SCRIPT, "sglang_nowhere.server"],
                         cwd=REPO, capture_output=True, text=True)
    found = SglangVersion().process((run.stdout + run.stderr).splitlines())
    assert "sglang_nowhere" in found["error"]


# Evidence


def test_server_info_must_report_tp2_and_nextn_as_eagle() -> None:
    info = {"tp_size": 2, "served_model_name": "qwen", "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4}
    assert server_info_problems(info, 2, NEXTN_3_1_4, "qwen") == []
    assert server_info_problems({**info, "tp_size": 1}, 2, NEXTN_3_1_4, "qwen") == [
        "/server_info reports tp_size=1, expected 2"]
    assert server_info_problems(info, 2, None, "qwen") == [
        "/server_info reports speculative_algorithm='EAGLE', expected None"]
    assert server_info_problems("<html>", 2, None, "qwen")[0].startswith("/server_info is not")
    # Another model answering on the replica's port is not the declared one.
    assert server_info_problems({**info, "served_model_name": "llama"}, 2, NEXTN_3_1_4,
                                "qwen") == [
        "/server_info reports served_model_name='llama', expected 'qwen'"]


def test_process_problems_compare_what_runs_with_what_is_rendered() -> None:
    service = tp_rank_service(RANK0, None)
    running = {"running": True, "pid": 7, "status": "run", "argv": list(service.command),
               "environment": {**service.environment, "HOME": "/root"}}
    assert process_problems(running, service) == []
    stale = {**running, "argv": [*service.command, "--speculative-algorithm", "NEXTN"]}
    assert "not the rendered" in process_problems(stale, service)[0]
    unpinned = {**running, "environment": {"NCCL_SOCKET_IFNAME": "eth0"}}
    found = process_problems(unpinned, service)
    assert "NCCL_SOCKET_IFNAME=eth0, not =thunderbolt0" in found[0]
    assert "NCCL_SOCKET_FAMILY=(unset)" in found[1]
    assert "GLOO_SOCKET_IFNAME=(unset)" in found[2]
    assert "SGLANG_HOST_IP=(unset), not 169.254.77.1" in found[3]
    assert process_problems({"running": False, "status": "down: 3s"}, service) == [
        "sglang-tp2-rank0 is not running (down: 3s)"]
    renamed = {**running, "argv": ["sglang::router"]}
    assert process_problems(renamed, service, argv=False) == []


def answer(body: object, status: int = 200) -> probes.Answer:
    return probes.Answer("http://wsa:30000/v1/chat/completions", status, body)


def test_only_a_real_completion_of_the_requested_length_counts() -> None:
    real = {"choices": [{"message": {"content": "the link"}}],
            "usage": {"completion_tokens": 32}}
    assert probes.completion_problems(answer(real), 32) == []
    assert probes.completion_problems(answer(real), 16) == [
        "the completion has 32 tokens, 16 were asked for"]
    assert "HTTP 503" in probes.completion_problems(answer({"message": "loading"}, 503), 32)[0]
    refused = probes.Answer("http://wsa:30000/v1/chat/completions", error="ConnectError: refused")
    assert "ConnectError" in probes.completion_problems(refused, 32)[0]
    empty = {"choices": [{"message": {"content": " "}}], "usage": {"completion_tokens": 32}}
    assert probes.completion_problems(answer(empty), 32) == ["the completion is empty"]


def test_access_log_lines_are_left_out_of_the_evidence() -> None:
    assert services.ACCESS_LOG_LINE.search(
        '[2026-11-29 13:40:37 TP0] 10.66.0.1:45686 - "POST /v1/chat/completions HTTP/1.1" 503')
    assert not services.ACCESS_LOG_LINE.search("[TP0] Waiting for rank 1 to join (55 s)")


# Operations, given facts


def test_a_tp_rank_running_as_declared_over_a_staying_driver_is_left_alone() -> None:
    wanted = tp_rank_service(RANK0, NEXTN_3_1_4)
    rendered = services.rendered_path(wanted.name, "systemd")
    unit = digest(services.render(wanted, "systemd"), "644")
    host = FakeHost({services.RunningServices: ["sglang-tp2-rank0"],
                     FileDigest: lambda path: unit if path == rendered else None})
    done = commands(serving.tp_rank_stopped_for_change, host, sglang=RANK0,
                    speculative=NEXTN_3_1_4)
    assert done == [] and re.search("runs as declared", host.noops[0])


@pytest.mark.parametrize(("mode", "speculative"), [
    ("644", None),  # the speculative setting changes
    ("600", NEXTN_3_1_4),  # the same unit with another mode: present would rewrite and restart it
])
def test_a_tp_rank_whose_unit_would_change_is_stopped_first(monkeypatch, mode: str,
                                                            speculative: object) -> None:
    running = digest(services.render(tp_rank_service(RANK0, NEXTN_3_1_4), "systemd"), mode)
    stopped: list[str] = []

    def absent(service: str, init_system: str):
        stopped.append(service)
        yield f"stop {service}"

    host = FakeHost({services.RunningServices: ["sglang-tp2-rank0"], FileDigest: running})
    monkeypatch.setattr(services.absent, "_inner", absent)
    done = commands(serving.tp_rank_stopped_for_change, host, sglang=RANK0,
                    speculative=speculative)
    assert stopped == ["sglang-tp2-rank0"] and done == ["stop sglang-tp2-rank0"]


@pytest.mark.parametrize(("running", "serves"), [
    (["sglang-replica"], True),
    ([], False),
    (["sglang-tp2-rank0"], False),  # a TP group: no replica for a refusal to keep
])
def test_what_a_refusal_keeps_is_the_replica_running_here(running: list[str],
                                                          serves: bool) -> None:
    asked = []

    def replicas(prefix: str, init_system: str) -> list[str]:
        asked.append((prefix, init_system))
        return [name for name in running if name.startswith(prefix)]

    with on(FakeHost({services.RunningServices: replicas})):
        assert serving.replica_runs(RANK0) is serves
        assert serving.replica_runs(RANK0, running=False) is not serves
    assert asked == [("sglang-replica", RANK0.init_system)] * 2


def test_serving_operations_do_nothing_on_a_host_without_the_role() -> None:
    host = FakeHost({}, name="gw")
    for operation, arguments in (
        (serving.replica, {"sglang": None}),
        (serving.tp_rank, {"sglang": None}),
        (serving.tp_accepted, {"sglang": None}),
        (serving_router.router, {"router": None}),
        (serving_router.router_accepted, {"router": None}),
    ):
        assert commands(operation, host, **arguments) == []
    assert host.noops.count("this host is not a workstation") == 3


def replica_process(seconds: float) -> dict:
    service = replica_service(RANK0)
    return {"running": True, "status": "run", "pid": 7, "seconds": seconds,
            "argv": list(service.command), "environment": {}}


def completions_answered(monkeypatch) -> list[str]:
    """Every chat completion answered in full; the servers asked, in order."""
    asked: list[str] = []
    monkeypatch.setattr(probes, "chat_completion",
                        lambda url, *args, **kwargs: asked.append(url) or answer(
                            {"choices": [{"message": {"content": "ok"}}],
                             "usage": {"completion_tokens": ACCEPTANCE_TOKENS}}))
    return asked


def test_a_young_or_serving_replica_is_not_stuck(monkeypatch) -> None:
    asked = completions_answered(monkeypatch)
    monkeypatch.setattr(serving, "server_info", lambda url, headers: answer(
        {"tp_size": 1, "served_model_name": "qwen", "speculative_algorithm": None}))
    young = FakeHost({services.ServiceProcess: replica_process(seconds=60)})
    with on(young):
        assert serving.stuck(RANK0, replica_service(RANK0), Proofs()) == []
    assert asked == []  # a server still inside its start bound is not asked
    old = FakeHost({services.ServiceProcess: replica_process(seconds=3600)})
    with on(old):
        assert serving.stuck(RANK0, replica_service(RANK0), Proofs()) == []
    assert asked == ["http://10.66.0.11:30000"]


def test_a_replica_found_serving_is_not_asked_again_by_its_acceptance(monkeypatch) -> None:
    asked = completions_answered(monkeypatch)
    info = {"tp_size": 1, "served_model_name": "qwen", "speculative_algorithm": None}
    monkeypatch.setattr(serving, "server_info", lambda url, headers: answer(info))
    service = replica_service(RANK0)
    proofs = Proofs()
    with on(FakeHost({services.ServiceProcess: replica_process(seconds=3600)})):
        assert serving.stuck(RANK0, service, proofs) == []
        assert serving.server_check(RANK0, service, 1, None, ACCEPTANCE_TOKENS,
                                    proofs)() == ([], False)
    assert len(asked) == 1
    # Proven by the replica, on this host, for this very process.
    assert proofs.pids == {Proven("wsa", service.name): 7}


def test_a_replica_whose_server_info_disagrees_is_asked_again_by_its_acceptance(
        monkeypatch) -> None:
    asked = completions_answered(monkeypatch)
    monkeypatch.setattr(serving, "server_info", lambda url, headers: answer(
        {"tp_size": 2, "served_model_name": "qwen", "speculative_algorithm": None}))
    service = replica_service(RANK0)
    proofs = Proofs()
    with on(FakeHost({services.ServiceProcess: replica_process(seconds=3600)})):
        assert serving.stuck(RANK0, service, proofs) == []
        found, _ = serving.server_check(RANK0, service, 1, None, ACCEPTANCE_TOKENS, proofs)()
    assert len(asked) == 2 and "tp_size" in " ".join(found)


def test_a_server_is_asked_once_per_run_while_the_same_process_serves(monkeypatch) -> None:
    asked = completions_answered(monkeypatch)
    monkeypatch.setattr(serving, "server_info", lambda url, headers: answer(
        {"tp_size": 1, "served_model_name": "qwen", "speculative_algorithm": None}))
    service = replica_service(RANK0)
    proofs = Proofs()
    for pid, expected in ((7, 1), (7, 1), (8, 2)):
        with on(FakeHost({services.ServiceProcess: {**replica_process(60), "pid": pid}})):
            check = serving.server_check(RANK0, service, 1, None, ACCEPTANCE_TOKENS, proofs)
            assert check() == ([], False)
        assert len(asked) == expected  # asked again only of another process
    # Another run proves the same process again.
    with on(FakeHost({services.ServiceProcess: {**replica_process(60), "pid": 8}})):
        serving.server_check(RANK0, service, 1, None, ACCEPTANCE_TOKENS, Proofs())()
    assert len(asked) == 3


def test_an_old_replica_that_serves_nothing_is_stuck(monkeypatch) -> None:
    monkeypatch.setattr(probes, "chat_completion", lambda *args, **kwargs: probes.Answer(
        "http://10.66.0.11:30000/v1/chat/completions", error="no answer within 30s"))
    with on(FakeHost({services.ServiceProcess: replica_process(seconds=3600)})):
        assert "no answer within 30s" in serving.stuck(RANK0, replica_service(RANK0),
                                                       Proofs())[0]


def test_the_tp_ranks_are_start_only_and_the_replicas_start_at_boot() -> None:
    """A rank alone after a reboot, or restarted without its peer, would only loop."""
    assert tp_rank_service(RANK0, NEXTN_3_1_4).at_boot is False
    assert replica_service(RANK0).at_boot is True


def serving_facts(running: list[str], pid: int = 7):
    """A workstation running ``running``; the replica's process is the rendered one."""
    def facts(cls: type, kwargs: dict) -> object:
        if cls is services.RunningServices:
            return running
        if cls is services.ServiceProcess:
            return {**replica_process(60), "pid": pid}
        if cls is services.ServiceLog:
            return ["[2026-12-01] Uvicorn running on http://0.0.0.0:30000"]
        raise AssertionError(cls)
    return facts


def test_verify_names_a_service_the_state_does_not_run_and_proves_the_replica_once(
        monkeypatch) -> None:
    asked = completions_answered(monkeypatch)
    monkeypatch.setattr(serving, "server_info", lambda url, headers: answer(
        {"tp_size": 1, "served_model_name": "qwen", "speculative_algorithm": None}))
    replicas = {"sglang": RANK0, "serving": "replicas", "speculative": None}
    run = a_run()
    [failure] = run_operation(serving.verified,
                              serving_facts(["sglang-replica", "sglang-tp2-rank0"]), run=run,
                              **replicas)
    assert failure.startswith("fail: serving layer: sglang-tp2-rank0 runs, but the state runs "
                              "sglang-replica here")
    assert "Uvicorn running" in failure  # the replica's log is the evidence's tail
    assert len(asked) == 1
    # The same process served a real completion earlier in this run: not asked again.
    assert run_operation(serving.verified, serving_facts(["sglang-replica"]), run=run,
                         **replicas) == []
    assert len(asked) == 1
    # Another process (restarted since) is asked.
    assert run_operation(serving.verified, serving_facts(["sglang-replica"], pid=8), run=run,
                         **replicas) == []
    assert len(asked) == 2


def test_verify_expects_rank_0_to_report_the_groups_size_not_two(monkeypatch) -> None:
    completions_answered(monkeypatch)
    monkeypatch.setattr(serving, "server_info", lambda url, headers: answer(
        {"tp_size": 2, "served_model_name": "qwen", "speculative_algorithm": None}))
    monkeypatch.setattr(serving, "tp_log_tails", lambda: "the ranks' logs")
    wider = replace(RANK0, tp_size=3)
    rank = tp_rank_service(wider, None)

    def facts(cls: type, kwargs: dict) -> object:
        if cls is services.RunningServices:
            return [rank.name]
        if cls is services.ServiceProcess:
            return {"running": True, "status": "run", "pid": 7, "seconds": 60,
                    "argv": list(rank.command), "environment": dict(rank.environment)}
        if cls is services.ServiceLog:
            return []
        raise AssertionError(cls)

    [failure] = run_operation(serving.verified, facts, sglang=wider,
                              serving=ServingMode.TENSOR_PARALLEL, speculative=None)
    assert "/server_info reports tp_size=2, expected 3" in failure


def test_the_sglang_version_is_read_as_the_serving_user_not_root(tmp_path: Path) -> None:
    # Importing the module runs the venv's and the working directory's code.
    fact = SglangVersion()
    as_root = fact.command(sys.executable, "httpx", str(REPO), user="root").get_raw_value()
    assert not as_root.startswith("runuser")
    run = subprocess.run(["sh", "-c", as_root], capture_output=True, text=True)
    assert "version" in fact.process(run.stdout.splitlines())
    as_sglang = fact.command("/opt/sglang/bin/python", "sglang.launch_server", "/srv/my dir",
                             user="sglang").get_raw_value()
    assert as_sglang.startswith("runuser -u sglang -- sh -c ")
    if os.geteuid() != 0 or not Path("/usr/bin/python3").exists():
        pytest.skip("runuser needs root: only the command's shape was checked")
    # A package in the working directory whose "version" is the uid importing it.
    directory = Path(tempfile.mkdtemp(prefix="twinbolt-version-"))
    try:
        directory.chmod(0o755)
        (directory / "whoami_package").mkdir(mode=0o755)
        (directory / "whoami_package" / "__init__.py").write_text(
            "import os\n__version__ = str(os.geteuid())\n")
        (directory / "whoami_package" / "__init__.py").chmod(0o644)
        shell = fact.command("/usr/bin/python3", "whoami_package", str(directory),
                             user="nobody").get_raw_value()
        run = subprocess.run(["sh", "-c", shell], capture_output=True, text=True)
    finally:
        shutil.rmtree(directory)
    assert fact.process(run.stdout.splitlines()) == {"version": str(pwd.getpwnam("nobody").pw_uid)}


@pytest.mark.parametrize("body", [
    {"usage": {"completion_tokens": 32}},                      # no choices: KeyError
    {"choices": [], "usage": {"completion_tokens": 32}},       # no first choice: IndexError
    {"choices": None, "usage": {"completion_tokens": 32}},     # not a list: TypeError
])
def test_an_answer_that_is_no_chat_completion_says_so(body) -> None:
    shown = answer(body)
    assert probes.completion_problems(shown, 32) == [
        f"not a chat completion: {shown.describe()}"]


def test_a_completion_names_each_of_its_problems() -> None:
    for content in (None, ""):
        empty = {"choices": [{"message": {"content": content}}],
                 "usage": {"completion_tokens": 2}}
        assert probes.completion_problems(answer(empty), 32) == [
            "the completion is empty", "the completion has 2 tokens, 32 were asked for"]


# The serving judges, branch by branch (issue 29 part 5)


def test_a_quantization_refused_from_its_last_release_on_names_the_older_ones() -> None:
    # marlin is accepted before 0.5.20: 0.5.20 itself is already too new.
    [refused] = serving.quantization_problems({"version": "0.5.20"}, "marlin", "/opt/sglang/py")
    assert refused.endswith("or install an SGLang before 0.5.20 for /opt/sglang/py")


def test_a_process_without_a_status_says_so() -> None:
    service = tp_rank_service(RANK0, None)
    assert process_problems({"running": False}, service) == [
        "sglang-tp2-rank0 is not running (no status)"]


@pytest.mark.parametrize("key", ["speculative_num_steps", "speculative_eagle_topk",
                                 "speculative_num_draft_tokens"])
def test_server_info_is_judged_by_each_speculative_setting(key: str) -> None:
    info = {"tp_size": 2, "served_model_name": "qwen", "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4}
    assert server_info_problems({**info, key: 9}, 2, NEXTN_3_1_4, "qwen") == [
        f"/server_info reports {key}=9, expected {info[key]}"]


def test_a_stale_process_is_named_by_pid_and_both_command_lines() -> None:
    service = tp_rank_service(RANK0, None)
    stale = {"running": True, "pid": 7, "argv": ["python", "-m", "old"],
             "environment": dict(service.environment)}
    assert process_problems(stale, service) == [
        f"sglang-tp2-rank0 (pid 7) runs 'python -m old', not the rendered "
        f"{' '.join(service.command)!r}"]


def test_iperf3_is_installed_where_it_is_missing_and_left_where_it_is() -> None:
    """The linktest's tool comes from Debian's package, as the serving layer installs it."""
    def facts(found: str | None):
        values = {Which: found, DebPackages: {}, AptSources: []}
        return lambda cls, kwargs: values.get(cls)

    installing = run_operation(serving.linktest_tool, facts(None), sglang=RANK0)
    assert any("apt-get" in command and "install" in command and "iperf3" in command
               for command in installing), installing
    assert run_operation(serving.linktest_tool, facts("/usr/bin/iperf3"), sglang=RANK0) == []
    assert run_operation(serving.linktest_tool, facts(None), sglang=None) == []
