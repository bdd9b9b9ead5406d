"""The gateway layer: its config per state, its facts' parsing and its proofs' verdicts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from operation_harness import a_run, local_key_file, run_operation
from pyinfra.api import OperationError
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.runit import RunitManaged, RunitStatus
from pyinfra.facts.server import TmpDir

from operations import services
from operations.gateway import proxy as gateway
from operations.gateway import route as gateway_route
from operations.gateway.front import BINARY as FRONT_BINARY
from operations.gateway.front import front_service
from operations.gateway.front import render_config as render_front
from operations.gateway.proxy import (
    LITELLM_LOCK,
    Deployment,
    LiveRouting,
    Proxy,
    ProxyConfig,
    proxy_service,
    render_config,
    serving_deployments,
    wanted_routing,
)
from operations.gateway.route import RoleAnswers, parse_answer
from operations.plumbing import keys, probes
from operations.plumbing.facts import FileDigest
from operations.plumbing.venvs import InstalledVersions, lock_pins
from operations.states import STATES

REPO = Path(__file__).resolve().parents[2]
KEY_FILE = "/etc/twinbolt/litellm_master_key"

PROXY = Proxy(
    address="10.66.0.13", listen_address="0.0.0.0", port=4000, venv="/opt/twinbolt/litellm",
    user="litellm", service="litellm",
    init_system="runit", pip_options=(), config_file="/etc/twinbolt/litellm.yaml",
    master_key_file=KEY_FILE, small_key_file="/etc/twinbolt/litellm_small_key",
    small_key_source=local_key_file("sglang_api_key"),
    small=Deployment("small-router", "qwen", "http://10.66.0.13:30080/v1",
                     "os.environ/TWINBOLT_SMALL_API_KEY"),
    large=Deployment("large-backend", "large", "http://10.66.0.13:31000/v1",
                     "os.environ/TWINBOLT_LARGE_API_KEY"),
    secret_files=(("LITELLM_MASTER_KEY", KEY_FILE),
                  ("TWINBOLT_SMALL_API_KEY", "/etc/twinbolt/litellm_small_key"),
                  ("TWINBOLT_LARGE_API_KEY", "/etc/twinbolt/large_api_key")),
    backend_port=4100,
)


# The key the router asks of the proxy, as the proxy's file holds it.
SMALL_KEY = keys.local_key(PROXY.small_key_source) + "\n"


def config(state: str) -> dict:
    return yaml.safe_load(render_config(PROXY, STATES[state].gateway_fallback))


# The config, per state


@pytest.mark.parametrize("state", list(STATES))
def test_the_general_fallback_exists_exactly_in_the_states_that_declare_it(state: str) -> None:
    settings = config(state)["router_settings"]
    assert settings["context_window_fallbacks"] == [{"small": ["large"]}]
    if STATES[state].gateway_fallback:
        assert settings["fallbacks"] == [{"small": ["large"]}]
    else:
        assert "fallbacks" not in settings


@pytest.mark.parametrize("state", list(STATES))
def test_forced_fallback_requests_are_accepted_only_while_the_fallback_exists(state: str) -> None:
    general = config(state)["general_settings"]
    assert general["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    assert general.get("dangerously_allow_mock_testing_request_params", False) \
        is STATES[state].gateway_fallback


def test_each_role_has_its_backend_and_a_stable_deployment_id() -> None:
    models = {entry["model_name"]: entry for entry in config("production")["model_list"]}
    assert models["small"]["litellm_params"] == {
        "model": "openai/qwen", "api_base": "http://10.66.0.13:30080/v1",
        "api_key": "os.environ/TWINBOLT_SMALL_API_KEY"}
    assert models["small"]["model_info"] == {"id": "small-router"}
    assert models["large"]["litellm_params"]["api_key"] == "os.environ/TWINBOLT_LARGE_API_KEY"
    assert models["large"]["model_info"] == {"id": "large-backend"}


def test_site_values_are_quoted_not_pasted_into_the_yaml() -> None:
    odd = Proxy(**{**PROXY.__dict__, "large": Deployment(
        "large-backend", "large: {x: 1}", "http://h:1/v1#x", "unused")})
    entry = yaml.safe_load(render_config(odd, False))["model_list"][1]
    assert entry["litellm_params"]["model"] == "openai/large: {x: 1}"
    assert entry["litellm_params"]["api_base"] == "http://h:1/v1#x"


def test_the_routing_of_a_config_is_what_the_running_proxy_is_compared_with() -> None:
    assert wanted_routing(PROXY, True) == {
        "deployments": {
            "small": {"id": "small-router", "model": "openai/qwen",
                      "api_base": "http://10.66.0.13:30080/v1"},
            "large": {"id": "large-backend", "model": "openai/large",
                      "api_base": "http://10.66.0.13:31000/v1"},
        },
        "fallbacks": {"small": ["large"]},
        "context_window_fallbacks": {"small": ["large"]},
    }
    assert wanted_routing(PROXY, False)["fallbacks"] == {}


@pytest.mark.parametrize("state", list(STATES))
def test_small_is_served_by_the_replicas_or_through_the_fallback(state: str) -> None:
    small = "small-router" if STATES[state].serving == "replicas" else "large-backend"
    assert serving_deployments(STATES[state].gateway_fallback) == {"small": small,
                                                                   "large": "large-backend"}


# The service: secrets read at start, no network


def test_the_service_carries_no_secret_and_reads_its_keys_from_files() -> None:
    service = proxy_service(PROXY)
    rendered = services.render(service, "runit") + services.render(service, "systemd")
    assert "sk-" not in rendered
    assert f"LITELLM_MASTER_KEY={KEY_FILE}" in service.command
    assert service.command[service.command.index("--") + 1:] == [
        "/opt/twinbolt/litellm/bin/litellm", "--config", "/etc/twinbolt/litellm.yaml",
        "--host", "127.0.0.1", "--port", "4100", "--run_gunicorn", "--num_workers", "2"]
    assert service.environment["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert service.user == "litellm"


def test_the_secrets_loader_exports_each_file_and_runs_the_rest(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("sk-from-file\n")
    (tmp_path / "large").write_text("large-key")
    argv = [*proxy_service(PROXY).command[:4], f"LITELLM_MASTER_KEY={tmp_path / 'key'}",
            f"TWINBOLT_LARGE_API_KEY={tmp_path / 'large'}", "--", "sh", "-c",
            'echo "$LITELLM_MASTER_KEY|$TWINBOLT_LARGE_API_KEY|$0"', "argv0"]
    result = subprocess.run(argv, capture_output=True, text=True, env={"PATH": os.defpath})
    assert result.stdout == "sk-from-file|large-key|argv0\n"
    missing = subprocess.run([*argv[:4], f"LITELLM_MASTER_KEY={tmp_path / 'none'}", "--",
                              "true"], capture_output=True, text=True)
    assert missing.returncode != 0


def test_the_master_key_is_generated_on_the_host_into_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "twinbolt" / "litellm_master_key"
    command = keys.generated_key_command(str(path)).get_raw_value()
    subprocess.run(["sh", "-c", command], check=True)
    key = path.read_text().strip()
    assert key.startswith("sk-") and len(key) == 51
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o755
    assert key not in command


def test_the_gateway_installs_the_litellm_the_lab_tests_with() -> None:
    """The proxy's lock pins the version the lab's venv has, at the same dependency versions."""
    pins = lock_pins(LITELLM_LOCK)
    assert pins["litellm"] == version("litellm") == "1.108.5"
    lab = lock_pins(REPO / "requirements-lab.lock")
    assert {name: pin for name, pin in pins.items() if name in lab} == {
        name: lab[name] for name in pins if name in lab}


# Facts


def test_a_request_reads_the_key_on_the_host_and_passes_it_on_stdin_only() -> None:
    command = RoleAnswers().command("http://gw:4000", KEY_FILE, ("small",), 8,
                                   forced_fallback=True).get_raw_value()
    assert 'cat "$1"' in command and "-H @-" in command
    assert '"mock_testing_fallbacks": true' in command
    assert LiveRouting().command("http://gw:4000", KEY_FILE).get_raw_value().count("-H @-") == 1


def test_an_answer_is_parsed_from_curls_headers_body_and_result_line() -> None:
    answer = parse_answer([
        "HTTP/1.1 200 OK\r", "x-litellm-model-id: large-backend\r",
        "X-LiteLLM-Attempted-Fallbacks: 1\r", "\r",
        '{"choices": [{"message": {"content": "a b"}}], "usage": {"completion_tokens": 2}}',
        "curl-result 200 5.046571 http://gw:4000/v1/chat/completions",
    ])
    assert answer.ok and answer.seconds == pytest.approx(5.046571)
    assert answer.url == "http://gw:4000/v1/chat/completions"
    assert answer.headers == {"x-litellm-model-id": "large-backend",
                              "x-litellm-attempted-fallbacks": "1"}
    assert answer.body["usage"]["completion_tokens"] == 2


def test_a_refused_connection_and_an_unreadable_key_are_errors_not_answers() -> None:
    refused = parse_answer([
        "curl: (7) Failed to connect to gw port 4000 after 0 ms: Couldn't connect to server",
        "curl-result 000 0.000213 http://gw:4000/v1/chat/completions",
    ])
    assert not refused.ok and refused.status is None and "Failed to connect" in refused.error
    unreadable = parse_answer([f"keyfile-unreadable {KEY_FILE}"])
    assert unreadable.error == f"the master key file {KEY_FILE} cannot be read"


def test_the_live_routing_is_read_from_the_proxys_own_api() -> None:
    models = ('{"data": [{"model_name": "small", "litellm_params": {"model": "openai/qwen", '
              '"api_base": "http://10.66.0.13:30080/v1", "use_in_pass_through": false}, '
              '"model_info": {"id": "small-router", "db_model": false}}, {"model_name": "large", '
              '"litellm_params": {"model": "openai/large", "api_base": '
              '"http://10.66.0.13:31000/v1"}, "model_info": {"id": "large-backend"}}]}')
    fallback = '{"model": "small", "fallback_models": ["large"], "fallback_type": "%s"}'
    missing = '{"detail": {"error": "No general fallbacks configured for model \'%s\'"}}'
    output = [
        f"models {models} 200",
        f"general small {fallback % 'general'} 200",
        f"context_window small {fallback % 'context_window'} 200",
        f"general large {missing % 'large'} 404",
        f"context_window large {missing % 'large'} 404",
    ]
    assert LiveRouting().process(output) == wanted_routing(PROXY, True)
    output[1] = f"general small {missing % 'small'} 404"
    assert LiveRouting().process(output) == wanted_routing(PROXY, False)
    assert LiveRouting().process(["models  000", *output[1:]]) is None


# Proofs, given what the proxy answers


def completion(model_id: str, fallbacks: str = "0", tokens: int = 8) -> probes.Answer:
    return probes.Answer(
        "http://10.66.0.13:4000/v1/chat/completions", 200,
        {"choices": [{"message": {"content": "one two"}}],
         "usage": {"completion_tokens": tokens}},
        {"x-litellm-model-id": model_id, "x-litellm-attempted-fallbacks": fallbacks},
        seconds=0.1,
    )


def answering(by_role: dict[str, probes.Answer], forced: probes.Answer | None = None,
              proxy_pid: int = 41, asked: list[str] | None = None):
    def facts(cls: type, kwargs: dict) -> object:
        if cls is services.ServiceProcess:
            assert kwargs["service"] == "litellm"
            return {"running": True, "pid": proxy_pid, "children": [proxy_pid + 1]}
        assert cls is RoleAnswers, cls
        if asked is not None:
            asked.extend(kwargs["roles"])
        assert kwargs["master_key_file"] == KEY_FILE and kwargs["url"] == "http://10.66.0.13:4000"
        return {role: forced if kwargs.get("forced_fallback") else by_role[role]
                for role in kwargs["roles"]}
    return facts


def test_the_forced_fallback_is_proven_only_by_the_large_deployment() -> None:
    served_by_large = completion("large-backend", fallbacks="1")
    assert run_operation(gateway_route.fallback_proven, answering({}, served_by_large),
                         proxy=PROXY) == []
    failed = run_operation(gateway_route.fallback_proven, answering({}, completion("small-router")),
                           proxy=PROXY)
    assert failed == ["fail: gateway layer: a forced fallback through small did not reach large; "
                      "role small: it was served by deployment 'small-router', not "
                      "'large-backend' (x-litellm-attempted-fallbacks: 0)"]


def test_proofs_judge_only_when_the_run_executes() -> None:
    def no_facts(cls: type, kwargs: dict) -> object:
        raise AssertionError("a prediction asks nothing of the proxy")
    for operation in (gateway_route.fallback_proven, gateway_route.roles_proven,
                      gateway_route.verified):
        arguments = {} if operation is gateway_route.fallback_proven else {"fallback": True}
        assert run_operation(operation, no_facts, executing=False, proxy=PROXY,
                             **arguments) == []


def test_during_the_outage_small_must_be_answered_by_large() -> None:
    outage = {"small": completion("large-backend", "1"), "large": completion("large-backend")}
    assert run_operation(gateway_route.roles_proven, answering(outage), proxy=PROXY,
                         fallback=True) == []
    # The same answers are wrong for production: small must be back on the Qwen deployment.
    failed = run_operation(gateway_route.roles_proven, answering(outage), proxy=PROXY,
                           fallback=False)
    assert failed == ["fail: gateway layer: role small: it was served by deployment "
                      "'large-backend', not 'small-router' (x-litellm-attempted-fallbacks: 1)"]


def test_an_answer_that_names_no_deployment_proves_no_route() -> None:
    # A completion without x-litellm-model-id could have come from anywhere.
    anonymous = completion("large-backend")
    del anonymous.headers["x-litellm-model-id"]
    failed = run_operation(gateway_route.roles_proven,
                           answering({"small": completion("small-router"), "large": anonymous}),
                           proxy=PROXY, fallback=False)
    assert failed == ["fail: gateway layer: role large: it was served by deployment None, not "
                      "'large-backend' (x-litellm-attempted-fallbacks: 0)"]


def test_the_route_is_asked_once_per_run_while_the_same_proxy_serves() -> None:
    outage = {"small": completion("large-backend", "1"), "large": completion("large-backend")}
    asked: list[str] = []
    run = a_run()
    for _ in range(2):
        assert run_operation(gateway_route.roles_proven, answering(outage, asked=asked), run=run,
                             proxy=PROXY, fallback=True) == []
    assert asked == ["small", "large"]
    # Another proxy process (restarted with a new config) is asked again.
    assert run_operation(gateway_route.roles_proven, answering(outage, proxy_pid=42, asked=asked),
                         run=run, proxy=PROXY, fallback=True) == []
    assert asked == ["small", "large"] * 2
    # So is the same process by another run.
    assert run_operation(gateway_route.roles_proven, answering(outage, proxy_pid=42, asked=asked),
                         proxy=PROXY, fallback=True) == []
    assert asked == ["small", "large"] * 3
    # So is another route: production's small is the Qwen deployment again.
    failed = run_operation(gateway_route.roles_proven, answering(outage, proxy_pid=42, asked=asked),
                           run=run, proxy=PROXY, fallback=False)
    assert failed and asked == ["small", "large"] * 4


def test_a_route_that_does_not_answer_fails_with_the_proxys_own_words() -> None:
    error = probes.Answer("http://10.66.0.13:4000/v1/chat/completions", 500, {
        "error": {"message": "model group 'small' failed. No fallback was attempted."}})
    failed = run_operation(gateway_route.roles_proven,
                           answering({"small": error, "large": completion("large-backend")}),
                           proxy=PROXY, fallback=True)
    assert len(failed) == 1 and "HTTP 500" in failed[0] and "No fallback was attempted" in failed[0]


def test_leaving_production_is_refused_while_large_does_not_answer() -> None:
    # The proxy runs; the backend behind large does not answer it.
    down = probes.Answer("http://10.66.0.13:4000/v1/chat/completions", 500,
                         {"error": {"message": "large: Connection refused"}})
    with pytest.raises(OperationError) as refused:
        run_operation(gateway_route.admissible, answering({"large": down}), proxy=PROXY,
                      fallback=True)
    assert str(refused.value).startswith("wsa: gateway layer: role large: no completion")
    assert "small would have nowhere to fall back to" in str(refused.value)
    # Returning to production needs no fallback, so it asks nothing.
    assert run_operation(gateway_route.admissible, answering({}), proxy=PROXY,
                         fallback=False) == []


def test_hosts_other_than_the_gateway_do_nothing() -> None:
    arguments = {
        gateway_route.admissible: {"fallback": True},
        gateway.proxy: {"fallback": True},
        gateway_route.fallback_proven: {},
        gateway_route.roles_proven: {"fallback": True},
        gateway_route.verified: {"fallback": True},
    }
    for operation, extra in arguments.items():
        assert run_operation(operation, answering({}), proxy=None, **extra) == []


# The proxy operation: restarted unless it already routes as its config says


def converged_gateway(fallback: bool, live: dict | None):
    """
    Facts of a gateway where everything is in place, its front included, and
    the proxy routes as ``live``.
    """
    config = render_config(PROXY, fallback)
    front = PROXY.front
    front_config = render_front(front)
    run_scripts = {name: services.render(service, "runit") for name, service in (
        ("litellm", proxy_service(PROXY)), (front.service, front_service(front)))}
    files = {
        f"{PROXY.venv}/bin/activate": {"size": 1},
        KEY_FILE: {"size": 52, "mode": 600, "user": "litellm", "group": "root"},
        PROXY.small_key_file: {"size": len(SMALL_KEY), "mode": 600, "user": "litellm",
                               "group": "root"},
        PROXY.config_file: {"size": len(config), "mode": 644},
        front.config_file: {"size": len(front_config), "mode": 644},
        FRONT_BINARY: {"size": 1, "mode": 755},
        **{services.run_script_path(name): {"size": len(script), "mode": 755}
           for name, script in run_scripts.items()},
    }
    sha1 = {PROXY.config_file: hashlib.sha1(config.encode()).hexdigest(),
            front.config_file: hashlib.sha1(front_config.encode()).hexdigest(),
            PROXY.small_key_file: hashlib.sha1(SMALL_KEY.encode()).hexdigest(),
            **{services.run_script_path(name): hashlib.sha1(script.encode()).hexdigest()
               for name, script in run_scripts.items()}}
    values = {
        InstalledVersions: lock_pins(LITELLM_LOCK),
        services.AccountExists: True,
        keys.HoldsKey: True,
        Directory: {"mode": 755},
        RunitManaged: set(run_scripts),
        RunitStatus: dict.fromkeys(run_scripts, True),
        services.ServiceProcess: {"running": True, "pid": 41, "children": [51, 52]},
        LiveRouting: live,
        TmpDir: "/tmp",
    }

    def facts(cls: type, kwargs: dict) -> object:
        path = kwargs.get("path")
        if cls is File:
            return files.get(path)
        if cls is Sha1File:
            return sha1.get(path)
        if cls is FileDigest:
            return f"{files[path]['mode']} {sha1[path]}" if path in sha1 else None
        if cls is Link:
            return {"link_target": f"/etc/sv/{Path(path).name}"}
        if cls is services.ServiceSettled:
            name = kwargs["service"]
            return {"file": f"755 {sha1[services.run_script_path(name)]}",
                    "link": f"/etc/sv/{name}", "status": f"run: /etc/service/{name}: (pid 42) 9s"}
        return values[cls]
    return facts


def test_a_proxy_that_routes_as_its_config_says_is_left_alone() -> None:
    assert run_operation(gateway.proxy, converged_gateway(True, wanted_routing(PROXY, True)),
                         proxy=PROXY, fallback=True) == []


def test_adding_the_fallback_uploads_the_config_reloads_and_waits() -> None:
    commands = run_operation(gateway.proxy, converged_gateway(False, wanted_routing(PROXY, False)),
                             proxy=PROXY, fallback=True)
    assert commands[-2:] == ["SVDIR=/etc/service sv reload litellm", "call wait_until"]
    assert any(command.startswith("upload") and command.endswith(PROXY.config_file)
               for command in commands)


def test_a_proxy_left_on_an_older_config_is_reloaded_though_its_file_is_current() -> None:
    commands = run_operation(gateway.proxy, converged_gateway(True, wanted_routing(PROXY, False)),
                             proxy=PROXY, fallback=True)
    assert commands == ["SVDIR=/etc/service sv reload litellm", "call wait_until"]


def test_a_changed_service_is_restarted_not_reloaded() -> None:
    """A reload forks workers of the same command: a new command needs a new process."""
    facts = converged_gateway(True, wanted_routing(PROXY, False))

    def older_run_script(cls: type, kwargs: dict) -> object:
        if cls is services.ServiceSettled:
            return {**facts(cls, kwargs), "file": "755 " + "0" * 40}
        if cls is Sha1File and kwargs["path"] == services.run_script_path("litellm"):
            return "0" * 40
        return facts(cls, kwargs)
    commands = run_operation(gateway.proxy, older_run_script, proxy=PROXY, fallback=True)
    assert commands[-2:] == ["SVDIR=/etc/service sv restart litellm", "call wait_until"]


def test_a_new_key_for_the_router_restarts_the_proxy_not_reloads_it() -> None:
    """Its gunicorn master reads the key into its environment once: a reload keeps the old."""
    facts = converged_gateway(True, wanted_routing(PROXY, True))

    def another_key(cls: type, kwargs: dict) -> object:
        if cls is Sha1File and kwargs["path"] == PROXY.small_key_file:
            return "0" * 40
        return facts(cls, kwargs)
    commands = run_operation(gateway.proxy, another_key, proxy=PROXY, fallback=True)
    assert commands[0].startswith("upload ") and commands[0].endswith(f" {PROXY.small_key_file}")
    assert commands[-2:] == ["SVDIR=/etc/service sv restart litellm", "call wait_until"]


def test_the_reload_is_waited_out_until_its_new_workers_are_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Until then a request may reach a worker that still routes as before. A retired
    worker that stays (finishing an answer, or hung in its start as a worker forked
    from LiteLLM's master can be) takes no connection: it is not waited for.
    """
    monkeypatch.setattr(probes, "get", lambda url, timeout=5.0: probes.Answer(url, 200))
    wanted = wanted_routing(PROXY, True)
    workers: list[int] = []

    def facts(cls: type, kwargs: dict) -> object:
        if cls is services.ServiceProcess:
            return {"running": True, "pid": 41, "children": workers}
        assert cls is LiveRouting, cls
        return wanted

    def judged(proofs: probes.Proofs) -> Iterator[str]:
        for workers[:] in ([51, 52], [51, 52, 61], [52, 61, 62]):
            yield "; ".join(gateway.live_problems(PROXY, True, proofs, frozenset({51, 52})))
    judged._inner = judged  # type: ignore[attr-defined]
    not_yet = "the proxy has {} of its 2 workers forked since its reload: the reload has not " \
              "taken yet"
    assert run_operation(judged, facts) == [
        repr(not_yet.format(0)), repr(not_yet.format(1)), repr("")]


def with_older_file(facts, path: str):
    """``facts``, but the file at ``path`` holds something else than what it renders."""
    def older(cls: type, kwargs: dict) -> object:
        if cls in (Sha1File, FileDigest) and kwargs["path"] == path:
            return "0" * 40 if cls is Sha1File else "644 " + "0" * 40
        return facts(cls, kwargs)
    return older


def test_a_config_change_the_api_does_not_show_reloads_the_proxy() -> None:
    """The retry policy is in the file only: a new file alone must reload the proxy."""
    older_file = with_older_file(converged_gateway(True, wanted_routing(PROXY, True)),
                                 PROXY.config_file)
    commands = run_operation(gateway.proxy, older_file, proxy=PROXY, fallback=True)
    assert commands[-2:] == ["SVDIR=/etc/service sv reload litellm", "call wait_until"]


def test_during_an_experiment_small_falls_back_without_retrying_its_stopped_backend() -> None:
    experiment, production = config("tp2_e2e"), config("production")
    policy = {"small": {"DefaultRetries": 0}}
    assert experiment["router_settings"]["model_group_retry_policy"] == policy
    assert "model_group_retry_policy" not in production["router_settings"]


def test_a_proxy_ready_only_on_the_gateways_loopback_fails_verify_from_the_clients_side(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound to the gateway's own name (127.0.1.1 on Debian), curl there would say ready."""
    asked: list[str] = []

    def refused(url: str, timeout: float = 5.0) -> probes.Answer:
        asked.append(url)
        return probes.Answer(url, error="[Errno 111] Connection refused")
    monkeypatch.setattr(probes, "get", refused)
    routing = wanted_routing(PROXY, True)

    def facts(cls: type, kwargs: dict) -> object:
        return {ProxyConfig: routing, LiveRouting: routing,
                services.ServiceProcess: {"running": True, "pid": 41, "children": [51, 52]}}[cls]
    [failure] = run_operation(gateway_route.verified, facts, proxy=PROXY, fallback=True)
    assert asked == ["http://10.66.0.13:4000/health/readiness"]
    assert failure.startswith("fail: gateway layer: the proxy at http://10.66.0.13:4000 does "
                              "not answer /health/readiness from this machine (the clients' "
                              "side): http://10.66.0.13:4000/health/readiness: [Errno 111]")


@pytest.mark.parametrize(("pid_at_verify", "routing_reads"), [(41, 1), (42, 2)])
def test_verify_reads_the_live_routing_again_only_of_another_proxy_process(
        monkeypatch: pytest.MonkeyPatch, pid_at_verify: int, routing_reads: int) -> None:
    monkeypatch.setattr(probes, "get", lambda url, timeout=5.0: probes.Answer(url, 200))
    monkeypatch.setattr(gateway_route, "roles_problems", lambda proxy, fallback, tokens,
                        proofs: [])
    routing = wanted_routing(PROXY, True)
    converged = converged_gateway(True, routing)
    reads: list[type] = []
    pid = [41]

    def facts(cls: type, kwargs: dict) -> object:
        reads.append(cls)
        if cls is services.ServiceProcess:
            return {"running": True, "pid": pid[0], "children": []}
        return routing if cls is ProxyConfig else converged(cls, kwargs)
    run = a_run()
    assert run_operation(gateway.proxy, facts, run=run, proxy=PROXY, fallback=True) == []
    pid[0] = pid_at_verify
    assert run_operation(gateway_route.verified, facts, run=run, proxy=PROXY,
                         fallback=True) == []
    assert reads.count(LiveRouting) == routing_reads


def test_verify_asks_each_role_for_real_and_again_of_a_restarted_proxy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With only the readiness check stubbed: the role requests are verify's own."""
    monkeypatch.setattr(probes, "get", lambda url, timeout=5.0: probes.Answer(url, 200))
    routing = wanted_routing(PROXY, False)
    asked: list[str] = []
    right = {"small": completion("small-router"), "large": completion("large-backend")}

    def proxy_answering(by_role: dict[str, probes.Answer], pid: int):
        roles = answering(by_role, proxy_pid=pid, asked=asked)
        return lambda cls, kwargs: (routing if cls in (ProxyConfig, LiveRouting)
                                    else roles(cls, kwargs))
    run = a_run()
    assert run_operation(gateway_route.verified, proxy_answering(right, 51), run=run,
                         proxy=PROXY, fallback=False) == []
    assert asked == ["small", "large"]
    # The same process is not asked again; a restarted one is, and its answer judged.
    wrong = {**right, "large": completion("small-router")}
    assert run_operation(gateway_route.verified, proxy_answering(wrong, 51), run=run,
                         proxy=PROXY, fallback=False) == []
    [failure] = run_operation(gateway_route.verified, proxy_answering(wrong, 52), run=run,
                              proxy=PROXY, fallback=False)
    assert asked == ["small", "large"] * 2
    assert failure == ("fail: gateway layer: role large: it was served by deployment "
                       "'small-router', not 'large-backend' (x-litellm-attempted-fallbacks: 0)")


def test_the_live_routing_script_asks_everything_at_once_and_prints_in_order(
        tmp_path: Path) -> None:
    """The fact's own script, run with a curl that answers each URL after a pause."""
    (tmp_path / "key").write_text("sk-test\n")
    curl = tmp_path / "bin" / "curl"
    curl.parent.mkdir()
    # The last argument is the URL; the header arrives on stdin.
    curl.write_text('#!/bin/sh\nfor a; do url=$a; done\nread -r header\n'
                    'case "$url" in */v1/model/info) sleep 0.2 ;; esac\n'
                    'printf "{\\"url\\": \\"%s\\", \\"auth\\": \\"%s\\"}\\n 200" "$url" "$header"\n'
                    'echo "$url" >> "$0.log"\n')
    curl.chmod(0o755)
    command = LiveRouting().command("http://gw:4000", str(tmp_path / "key")).get_raw_value()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30,
                            env={"PATH": f"{curl.parent}:{os.defpath}", "TMPDIR": str(scratch)})
    lines = result.stdout.splitlines()
    assert [line.split(" {")[0] for line in lines] == [
        "models", "general small", "context_window small", "general large",
        "context_window large"]
    assert lines[0].endswith('"url": "http://gw:4000/v1/model/info", '
                             '"auth": "Authorization: Bearer sk-test"} 200')
    # The slow model-info request was sent first yet logged last: the five ran at once.
    assert (tmp_path / "bin" / "curl.log").read_text().splitlines()[-1] == \
        "http://gw:4000/v1/model/info"
    assert list(scratch.iterdir()) == []  # its answers' directory is gone


def role_answers_run(tmp_path: Path, key: str | None) -> tuple[dict[str, probes.Answer], Path]:
    """RoleAnswers' own script for small and large, with a curl that answers small slowly."""
    if key is not None:
        (tmp_path / "key").write_text(key)
    curl = tmp_path / "bin" / "curl"
    curl.parent.mkdir()
    # The role is in the --data-binary body; the header arrives on stdin.
    curl.write_text(
        '#!/bin/sh\nread -r header\nwhile [ $# -gt 0 ]; do '
        '[ "$1" = --data-binary ] && body=$2; shift; done\n'
        'case "$body" in *\\"small\\"*) role=small; sleep 0.3 ;; *) role=large ;; esac\n'
        'echo "$role" >> "$0.log"\n'
        'printf "HTTP/1.1 200 OK\\r\\nx-litellm-model-id: %s-backend\\r\\n\\r\\n" "$role"\n'
        'printf \'{"auth": "%s"}\\ncurl-result 200 0.3 http://gw:4000\\n\' "$header"\n')
    curl.chmod(0o755)
    command = RoleAnswers().command("http://gw:4000", str(tmp_path / "key"), ("small", "large"),
                                    8).get_raw_value()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30,
                            env={"PATH": f"{curl.parent}:{os.defpath}", "TMPDIR": str(scratch)})
    assert list(scratch.iterdir()) == []  # its answers' directory is gone
    return RoleAnswers().process(result.stdout.splitlines()), curl.parent / "curl.log"


def test_the_roles_are_asked_at_once_and_each_answer_is_its_own(tmp_path: Path) -> None:
    answers, log = role_answers_run(tmp_path, "sk-test\n")
    assert {role: answer.headers["x-litellm-model-id"] for role, answer in answers.items()} == {
        "small": "small-backend", "large": "large-backend"}
    assert all(answer.ok and answer.body == {"auth": "Authorization: Bearer sk-test"}
               for answer in answers.values())
    # small was asked first yet answered last: the two ran at once.
    assert log.read_text().splitlines() == ["large", "small"]


def test_an_unreadable_master_key_is_each_roles_error(tmp_path: Path) -> None:
    answers, _ = role_answers_run(tmp_path, None)
    assert set(answers) == {"small", "large"}
    assert all(not answer.ok and "master key file" in answer.describe()
               for answer in answers.values())


def test_preflight_waits_for_a_proxy_that_runs_but_does_not_listen_yet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run cut just after restarting the proxy: the next run's preflight waits it out."""
    monkeypatch.setattr(probes, "poll_interval", lambda elapsed: 0.0)
    starting = probes.Answer("http://10.66.0.13:4000/v1/chat/completions",
                             error="curl: (7) Failed to connect to 10.66.0.13 port 4000")
    answers = [starting, starting, completion("large-backend")]

    def facts(cls: type, kwargs: dict) -> object:
        if cls is services.ServiceProcess:
            return {"running": True, "pid": 41, "children": []}
        return {"large": answers.pop(0)}
    assert run_operation(gateway_route.admissible, facts, proxy=PROXY, fallback=True) == []
    assert answers == []


def test_preflight_refuses_at_once_when_no_proxy_runs() -> None:
    down = probes.Answer("http://10.66.0.13:4000/v1/chat/completions",
                         error="curl: (7) Failed to connect to 10.66.0.13 port 4000")

    def facts(cls: type, kwargs: dict) -> object:
        if cls is services.ServiceProcess:
            return {"running": False, "pid": None, "children": []}
        return {"large": down}
    with pytest.raises(OperationError, match="role large: no completion"):
        run_operation(gateway_route.admissible, facts, proxy=PROXY, fallback=True)


@pytest.mark.parametrize("content, holds", [("\n", False), (" \t\n\n", False), ("", False),
                                            (None, False), ("sk-0123\n", True)])
def test_the_key_fact_tells_a_blank_key_file_from_a_key_and_never_prints_it(
        content: str | None, holds: bool, tmp_path) -> None:
    path = tmp_path / "litellm_master_key"
    if content is not None:
        path.write_text(content)
    command = keys.HoldsKey().command(str(path)).get_raw_value()
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert "sk-" not in result.stdout + result.stderr
    assert keys.HoldsKey().process(result.stdout.splitlines()) is holds


def test_a_blank_master_key_file_is_replaced_like_a_missing_one() -> None:
    facts = converged_gateway(True, wanted_routing(PROXY, True))

    def blank(cls: type, kwargs: dict) -> object:
        return False if cls is keys.HoldsKey else facts(cls, kwargs)
    commands = run_operation(gateway.proxy, blank, proxy=PROXY, fallback=True)
    assert commands[0] == keys.generated_key_command(KEY_FILE).get_raw_value()


# The routing and answer judges, branch by branch (issue 29 part 5)


def test_routing_is_judged_part_by_part_in_the_values_seen_and_wanted() -> None:
    wanted = wanted_routing(PROXY, True)
    assert gateway.routing_problems("the running proxy", wanted, wanted, "its config has") == []
    assert gateway.routing_problems("the config f", None, wanted, "the state declares") == [
        "the config f does not exist"]
    without = {**wanted, "fallbacks": {}, "context_window_fallbacks": {}}
    assert gateway.routing_problems("the running proxy", without, wanted, "its config has") == [
        "the running proxy has fallbacks none, but its config has small -> large",
        "the running proxy has context_window_fallbacks none, but its config has small -> large"]


def test_verify_names_a_config_that_routes_otherwise_than_the_state_declares(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "get", lambda url, timeout=5.0: probes.Answer(url, 200))
    monkeypatch.setattr(gateway_route, "roles_problems", lambda proxy, fallback, tokens,
                        proofs: [])
    live, on_disk = wanted_routing(PROXY, True), wanted_routing(PROXY, False)

    def facts(cls: type, kwargs: dict) -> object:
        if cls is services.ServiceProcess:
            return {"running": True, "pid": 41, "children": []}
        return {ProxyConfig: on_disk, LiveRouting: live}[cls]
    assert run_operation(gateway_route.verified, facts, proxy=PROXY, fallback=True) == [
        f"fail: gateway layer: the config {PROXY.config_file} has fallbacks none, but the "
        "state declares small -> large"]


def test_an_answer_that_is_no_completion_is_not_judged_by_its_deployment() -> None:
    error = probes.Answer("http://10.66.0.13:4000/v1/chat/completions", 500, {
        "error": {"message": "model group 'small' failed."}})
    assert gateway_route.answer_problems("small", error, "small-router", 8) == [
        f"role small: no completion: {error.describe()}"]
    assert gateway_route.answer_problems("small", completion("small-router"), "small-router",
                                         8) == []


def test_routing_parts_other_than_fallbacks_are_shown_as_json() -> None:
    wanted = wanted_routing(PROXY, False)
    moved = {**wanted, "deployments": {"small": {"id": "small-router"}}}
    assert gateway.routing_problems("the running proxy", moved, wanted, "its config has") == [
        'the running proxy has deployments {"small": {"id": "small-router"}}, but its config '
        f"has {json.dumps(wanted['deployments'], sort_keys=True)}"]


def test_an_answer_without_the_fallbacks_header_says_it_is_absent() -> None:
    answer = completion("small-router")
    del answer.headers["x-litellm-attempted-fallbacks"]
    assert gateway_route.answer_problems("large", answer, "large-backend", 8) == [
        "role large: it was served by deployment 'small-router', not 'large-backend' "
        "(x-litellm-attempted-fallbacks: absent)"]
