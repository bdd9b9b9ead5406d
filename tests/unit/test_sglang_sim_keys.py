"""
The SGLang simulator's keys as SGLang 0.5.9 and 0.5.23 take them: ``--config``'s
YAML merged before the command line (``ConfigArgumentMerger``), and the API key
middleware's decision (``decide_request_auth``) on every route it serves.
"""

import re
import subprocess
import sys
from email.message import Message
from pathlib import Path

import httpx
import pytest
from simulator import simulator

from lab.sglang_sim.api import ADMIN_OPTIONAL
from lab.sglang_sim.args import build_parser, config_flag, merge_config, parse_server_args
from lab.sglang_sim.httpd import App, AuthLevel, Keys, Request, Response, decide_request_auth

REPO = Path(__file__).resolve().parents[2]
API, ADMIN = "sk-api", "sk-admin"


def write(directory: Path, text: str, name: str = "keys.yaml") -> str:
    path = directory / name
    path.write_text(text)
    return str(path)


def parse(*argv: str):
    return parse_server_args(["--model-path", "/srv/models/qwen", *argv])


# --config: the YAML's keys become flags, before the command line's own


def test_the_yaml_flags_go_first_so_the_command_line_wins(tmp_path):
    config = write(tmp_path, "api-key: sk-yaml\nport: 31000\nenable-metrics: true\n")
    argv = ["--model-path", "m", "--config", config, "--port", "32000"]
    assert merge_config(build_parser(), argv) == [
        "--api-key", "sk-yaml", "--port", "31000", "--enable-metrics",
        "--model-path", "m", "--port", "32000"]
    args = parse("--config", config, "--port", "32000", "--api-key", "sk-cli")
    assert (args.port, args.api_key, args.enable_metrics) == (32000, "sk-cli", True)
    assert parse("--config", config).port == 31000


def test_both_keys_come_from_the_file_twinbolt_renders(tmp_path):
    config = write(tmp_path, f"api-key: {API}\nadmin-api-key: {ADMIN}\n")
    args = parse("--config", config)
    assert (args.api_key, args.admin_api_key) == (API, ADMIN)
    # ServerArgs has no field for the file: neither the log line nor /server_info names it.
    assert "config" not in vars(args)


def test_store_true_flags_take_yaml_booleans_other_values_are_spelled_out():
    assert config_flag("--enable-metrics", True, store_true=True) == ["--enable-metrics"]
    assert config_flag("--enable-metrics", False, store_true=True) == []
    assert config_flag("--flag", False, store_true=False) == ["--flag", "false"]
    assert config_flag("--port", 31000, store_true=False) == ["--port", "31000"]
    assert config_flag("--items", ["a", 1], store_true=False) == ["--items", "a", "1"]
    assert config_flag("--items", [], store_true=False) == []
    # An empty YAML value is the word None, which SGLang then takes as the key.
    assert config_flag("--api-key", None, store_true=False) == ["--api-key", "None"]


def test_a_false_store_true_flag_in_the_file_leaves_it_off(tmp_path):
    assert parse("--config", write(tmp_path, "enable-metrics: false\n")).enable_metrics is False


@pytest.mark.parametrize("text", ["api_key: sk-x\n", "enable_metrics: true\n"])
def test_underscored_keys_are_refused_as_sglangs_argparse_refuses_them(tmp_path, capsys, text):
    # SGLang writes the key as is after "--": argparse knows --api-key, not --api_key.
    with pytest.raises(SystemExit) as exit_:
        parse("--config", write(tmp_path, text))
    assert exit_.value.code == 2
    assert "unrecognized arguments: --" + text.split(":")[0] in capsys.readouterr().err


def test_an_empty_file_adds_nothing(tmp_path):
    assert parse("--config", write(tmp_path, "")).api_key is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--config", "/etc/twinbolt/absent.yaml"], "Config file not found: /etc/twinbolt/absent.yaml"),
    (["--config", "/etc/twinbolt/keys.toml"], "Config file must be YAML format, got: .toml"),
    (["--config", "a.yaml", "--config", "b.yaml"], "Multiple config files specified!"),
    (["--config"], "No config file specified after --config flag!"),
])
def test_a_config_sglang_cannot_take_raises_its_value_error(argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(*argv)


@pytest.mark.parametrize("text", ["- api-key\n", "sk-api\n"])
def test_a_file_that_is_no_mapping_is_refused(tmp_path, text):
    with pytest.raises(ValueError, match="must contain a dictionary at root level"):
        parse("--config", write(tmp_path, text))


def test_bad_yaml_is_logged_and_raised(tmp_path, caplog):
    config = write(tmp_path, "api-key: [unclosed\n")
    with pytest.raises(Exception, match="flow sequence"):
        parse("--config", config)
    assert f"Failed to read config file {config}" in caplog.text


def test_config_joined_by_equals_is_parsed_and_not_read(tmp_path):
    # SGLang looks for the word "--config" alone; argparse still takes the other spelling.
    args = parse(f"--config={tmp_path / 'absent.yaml'}")
    assert args.api_key is None


def test_the_simulator_exits_1_on_a_missing_config_as_sglang_does(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lab.sglang_sim", "--config", str(tmp_path / "keys.yaml"),
         "--model-path", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=20,
        env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert f"ValueError: Config file not found: {tmp_path / 'keys.yaml'}" in result.stderr


# The API key middleware's decision

KEYS = {"none": Keys(), "api": Keys(API), "admin": Keys(admin_api_key=ADMIN),
        "both": Keys(API, ADMIN)}
BEARERS = {"no header": None, "api key": f"Bearer {API}", "admin key": f"Bearer {ADMIN}",
           "wrong key": "Bearer sk-wrong"}
ANY = set(BEARERS)
# Which bearers pass, by the server's keys and the route's level (SGLang's auth.py).
ALLOWED = {
    ("none", "normal"): ANY, ("none", "admin"): ANY, ("none", "open"): ANY,
    ("api", "normal"): {"api key"}, ("api", "admin"): {"api key"}, ("api", "open"): ANY,
    # Only an admin key: NORMAL routes stay open, the admin ones ask for it.
    ("admin", "normal"): ANY, ("admin", "admin"): {"admin key"}, ("admin", "open"): ANY,
    # Both: each route its own key; the api key does not open an admin route.
    ("both", "normal"): {"api key"}, ("both", "admin"): {"admin key"}, ("both", "open"): ANY,
}
PATHS = {
    "normal": ["/v1/chat/completions", "/generate", "/server_info", "/v1/models", "/v1/loads"],
    "admin": list(ADMIN_OPTIONAL),
    "open": ["/health", "/health_generate", "/metrics", "/ready"],
}


def request(path: str, authorization: str | None, method: str = "POST") -> Request:
    headers = Message()
    if authorization is not None:
        headers["Authorization"] = authorization
    return Request(method, path, headers, b"")


def app(keys: Keys) -> App:
    """Every path above served 200, the admin ones marked as api.Leader marks them."""
    ok = {"GET": lambda request: Response(200), "POST": lambda request: Response(200)}
    paths = [path for group in PATHS.values() for path in group]
    return App({path: ok for path in paths}, keys, ADMIN_OPTIONAL)


@pytest.mark.parametrize("bearer", BEARERS)
@pytest.mark.parametrize("level", ["normal", "admin", "open"])
@pytest.mark.parametrize("keys", KEYS)
def test_the_auth_decision_table(keys, level, bearer):
    allowed = bearer in ALLOWED[keys, level]
    server = app(KEYS[keys])
    for path in PATHS[level]:
        response = server.respond(request(path, BEARERS[bearer]))
        assert response.status == (200 if allowed else 401), path
        if not allowed:
            assert response.body == b'{"error":"Unauthorized"}'
            assert response.content_type == "application/json"


def test_a_refused_request_is_refused_before_its_route_is_looked_up():
    assert app(Keys(API)).respond(request("/no_such_route", None)).status == 401
    assert app(Keys(API)).respond(request("/no_such_route", f"Bearer {API}")).status == 404
    # A method the admin route does not take reaches no route: its level is NORMAL.
    assert app(Keys(API, ADMIN)).respond(
        request("/flush_cache", f"Bearer {API}", method="PUT")).status == 405


@pytest.mark.parametrize(("authorization", "allowed"), [
    (f"Bearer {API}", True), (f"bearer {API}", True), (f"BEARER {API}", True),
    (f"Bearer  {API}", False), (API, False), (f"Basic {API}", False), ("Bearer", False),
    ("Bearer ", False), (f"Bearer {API} ", False), ("", False), ("Bearer sk-apí", False),
])
def test_the_bearer_token_is_matched_exactly(authorization, allowed):
    assert decide_request_auth(Keys(API), AuthLevel.NORMAL, "POST", "/generate",
                               authorization) is allowed


def test_preflights_and_empty_keys_need_no_key():
    assert decide_request_auth(Keys(API, ADMIN), AuthLevel.ADMIN_OPTIONAL, "OPTIONS",
                               "/flush_cache", None)
    assert decide_request_auth(Keys("", ""), AuthLevel.ADMIN_OPTIONAL, "POST", "/flush_cache",
                               None)


# A whole simulator started as twinbolt starts SGLang


def test_a_server_started_with_the_keys_file_asks_each_route_its_key(tmp_path):
    config = write(tmp_path, f"api-key: {API}\nadmin-api-key: {ADMIN}\n")
    api, admin = ({"Authorization": f"Bearer {key}"} for key in (API, ADMIN))
    with simulator(tmp_path, "--config", config) as url:
        refused = httpx.post(f"{url}/generate", json={"text": "hi"}, timeout=10)
        assert (refused.status_code, refused.content) == (401, b'{"error":"Unauthorized"}')
        assert httpx.post(f"{url}/generate", headers=api, timeout=10,
                          json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}
                          ).status_code == 200
        assert httpx.post(f"{url}/flush_cache", headers=api, timeout=10).status_code == 401
        assert httpx.post(f"{url}/flush_cache", headers=admin, timeout=10).status_code == 200
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
        # As 0.5.9's dataclasses.asdict(server_args): both keys, to whoever has the api key.
        info = httpx.get(f"{url}/server_info", headers=api, timeout=10).json()
        assert (info["api_key"], info["admin_api_key"]) == (API, ADMIN)
        port = url.rsplit(":", 1)[1]
    log = (tmp_path / f"sim-{port}.log").read_text()
    line = next(line for line in log.splitlines() if "server_args=ServerArgs(" in line)
    # SGLang 0.5.9 logs the keys in clear: what twinbolt's log tails must redact.
    assert f"api_key='{API}', admin_api_key='{ADMIN}'" in line
    assert "config=" not in line
