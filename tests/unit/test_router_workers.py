"""
The router's workers change through its API, never by a restart: what is added,
removed and drained, as a table over what the router fronts, what the run wants
and what its unit says; and the facts and commands that ask it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from operation_harness import local_key_file, run_operation
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.runit import RunitManaged, RunitStatus
from pyinfra.facts.server import TmpDir
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from operations import services
from operations.plumbing import keys, probes
from operations.plumbing.facts import FileDigest
from operations.plumbing.venvs import InstalledVersions, lock_pins
from operations.serving import router as serving_router
from operations.serving.router import ROUTER_LOCK, Router, RouterWorkers, router_service

A, B, C = "http://10.66.0.11:30000", "http://10.66.0.12:30000", "http://10.66.0.21:30000"
IDS = {A: "id-a", B: "id-b", C: "id-c"}
KEY_FILE = "/var/lib/twinbolt/router_control_key"
ROUTER = Router(address="10.66.0.13", listen_address="0.0.0.0", port=30080,
                venv="/var/lib/twinbolt/venvs/router", user="sglang-router", init_system="runit",
                pip_options=(), key_file=KEY_FILE,
                worker_key_file="/var/lib/twinbolt/router_worker_key",
                api_key_file=local_key_file("sglang_api_key"), workers=(A, B),
                served_model_name="qwen", start_timeout_seconds=60)
URL = "http://10.66.0.13:30080"
# The SGLang servers' key, as the router's file on the gateway holds it.
WORKER_KEY = keys.local_key(ROUTER.api_key_file) + "\n"


def listed(*urls: str) -> list[dict]:
    return [{"id": IDS[url], "url": url, "is_healthy": True, "load": 0} for url in urls]


def gateway(router: Router, live: list[dict] | None, unit_workers: tuple[str, ...] | None,
            extra_argument: str = ""):
    """
    A gateway whose router runs fronting ``live`` (``None``: stopped) from a unit
    rendered for ``unit_workers`` (and ``extra_argument``, an older unit's); the
    router's venv and account in place.
    """
    service = router_service(replace(router, workers=unit_workers or ()))
    if extra_argument:
        service = service.model_copy(update={"command": [*service.command, extra_argument]})
    path = services.rendered_path("sglang-router", router.init_system)
    mode = services.SUPERVISORS[router.init_system].mode
    text = services.render(service, router.init_system)
    sha1 = hashlib.sha1(text.encode()).hexdigest()
    values = {
        services.ServiceProcess: {"running": live is not None, "pid": 42 if live is not None
                                  else None, "children": []},
        RouterWorkers: live,
        InstalledVersions: lock_pins(ROUTER_LOCK),
        services.AccountExists: True,
        keys.HoldsKey: True,
        services.ServiceSettled: {"file": f"{mode} {sha1}", "link": "/etc/sv/sglang-router",
                                  "status": "run: /etc/service/sglang-router: (pid 42) 9s"
                                  if live is not None else "down: /etc/service/sglang-router",
                                  "active": "active", "enabled": "enabled"},
        Directory: {"mode": 755},
        Link: {"link_target": "/etc/sv/sglang-router"},
        RunitManaged: {"sglang-router"},
        RunitStatus: {"sglang-router": live is not None},
        SystemdStatus: {"sglang-router.service": True},
        SystemdEnabled: {"sglang-router.service": True},
        TmpDir: "/tmp",
    }

    def facts(cls: type, kwargs: dict) -> object:
        if cls is FileDigest:
            return f"{mode} {sha1}" if kwargs["path"] == path else None
        if cls is File and kwargs["path"] == KEY_FILE:
            return {"size": 52, "mode": 600, "user": "sglang-router", "group": "root"}
        if cls is File and kwargs["path"] == router.worker_key_file:
            return {"size": len(WORKER_KEY), "mode": 600, "user": "sglang-router",
                    "group": "root"}
        if cls is Sha1File and kwargs["path"] == router.worker_key_file:
            return hashlib.sha1(WORKER_KEY.encode()).hexdigest()
        if cls is File:
            return {"size": len(text), "mode": int(mode), "user": "root", "group": "root"} \
                if kwargs["path"] == path else None
        if cls is Sha1File:
            return sha1 if kwargs["path"] == path else None
        if cls is RouterWorkers:
            assert kwargs == {"url": URL, "key_file": KEY_FILE}
        return values[cls]
    return facts


def added(url: str) -> str:
    return serving_router.worker_added(ROUTER, url).get_raw_value()


def removed(url: str) -> str:
    return serving_router.worker_removed(ROUTER, IDS[url]).get_raw_value()


UNIT = ["upload /etc/sv/sglang-router/run", "chmod 755 /etc/sv/sglang-router/run"]


def router_commands(router: Router, facts) -> list[str]:
    """The commands of :func:`router`, an upload named by its destination alone."""
    return [re.sub(r"^upload .* (/\S+)$", r"upload \1", command) for command in
            run_operation(serving_router.router, facts, host_name="gw", router=router)]


@pytest.mark.parametrize(("wanted", "live", "unit", "expected"), [
    # Fronting what it should, from the unit that says so: nothing.
    ((A, B), (A, B), (A, B), []),
    # A pair leaves: the unit names what is to be, then the replica is removed,
    # waited for, drained.
    ((A,), (A, B), (A, B), [*UNIT, removed(B), "call wait_until", "call drained"]),
    # A pair comes back: the unit first, then its replica registered and waited for.
    ((A, B, C), (A, B), (A, B), [*UNIT, added(C), "call wait_until"]),
    # The unit changed, the API not yet (a run cut after the upload).
    ((A, B), (A,), (A, B), [added(B), "call wait_until"]),
    # A unit that names neither what runs nor what is wanted (changed by hand) is not
    # recognised as the router's: it restarts from the new one.
    ((A,), (A,), (A, B), [*UNIT, "SVDIR=/etc/service sv restart sglang-router"]),
], ids=["settled", "a-pair-leaves", "a-pair-returns", "api-behind", "unit-elsewhere"])
def test_the_workers_change_through_the_api_and_the_unit_follows_without_a_restart(
        wanted: tuple[str, ...], live: tuple[str, ...], unit: tuple[str, ...],
        expected: list[str]) -> None:
    router = replace(ROUTER, workers=wanted)
    assert router_commands(router, gateway(router, listed(*live), unit)) == expected


def test_systemd_reads_the_rewritten_unit_again_and_restarts_nothing() -> None:
    router = replace(ROUTER, init_system="systemd", workers=(A,))
    assert router_commands(router, gateway(router, listed(A, B), (A, B))) == [
        "upload /etc/systemd/system/sglang-router.service",
        "chmod 644 /etc/systemd/system/sglang-router.service", "systemctl daemon-reload",
        removed(B), "call wait_until", "call drained"]


def test_a_router_not_run_as_declared_goes_through_present_not_the_api() -> None:
    """Running but disabled at boot: a reboot would lose it, so present enables it."""
    router = replace(ROUTER, init_system="systemd", workers=(A,))
    facts = gateway(router, listed(A, B), (A, B))

    def disabled(cls: type, kwargs: dict) -> object:
        if cls is services.ServiceSettled:
            return {**facts(cls, kwargs), "enabled": "disabled"}
        if cls is SystemdEnabled:
            return {"sglang-router.service": False}
        return facts(cls, kwargs)
    commands = router_commands(router, disabled)
    assert not any("/workers" in command for command in commands)
    assert "systemctl enable sglang-router.service" in commands


def test_a_unit_that_changed_otherwise_restarts_the_router() -> None:
    commands = router_commands(ROUTER, gateway(ROUTER, listed(A, B), (A, B),
                                               extra_argument="--old"))
    assert commands[-3:] == [*UNIT, "SVDIR=/etc/service sv restart sglang-router"]


def test_a_stopped_router_is_started_with_its_workers() -> None:
    commands = run_operation(serving_router.router, gateway(ROUTER, None, (A, B)),
                             host_name="gw", router=ROUTER)
    assert not any("/workers" in command for command in commands)
    assert commands[-1] == "SVDIR=/etc/service sv start sglang-router"


def test_the_router_is_drained_of_every_worker_before_it_stops() -> None:
    commands = run_operation(serving_router.router, gateway(ROUTER, listed(A, B), (A, B)),
                             host_name="gw", router=ROUTER, present=False)
    assert commands[:4] == [removed(A), removed(B), "call wait_until", "call drained"]
    assert "SVDIR=/etc/service sv stop sglang-router" in commands[4:]


def test_the_routers_own_list_is_read_from_its_answer_or_is_none() -> None:
    body = {"workers": [{"id": "id-a", "url": A, "model_id": "qwen", "is_healthy": True,
                         "load": 2, "priority": 50}], "total": 1}
    assert RouterWorkers().process([json.dumps(body), "200"]) == [
        {"id": "id-a", "url": A, "is_healthy": True, "load": 2}]
    assert RouterWorkers().process(["Missing or invalid Authorization header", "401"]) is None
    assert RouterWorkers().process(["000"]) is None


@pytest.mark.parametrize(("wanted", "live", "found"), [
    ((A,), [], [f"the router does not list {A} yet"]),
    ((A,), listed(A, B), [f"the router still lists {B}"]),
    ((A,), [{**listed(A)[0], "is_healthy": False}], [f"the router lists {A} as unhealthy"]),
    ((A, B), listed(B, A), []),
    ((), None, [f"the router at {URL} does not answer /workers with the key in {KEY_FILE}"]),
])
def test_the_wait_ends_when_the_router_lists_exactly_the_wanted_workers_healthy(
        wanted: tuple[str, ...], live: list[dict] | None, found: list[str]) -> None:
    router = replace(ROUTER, workers=wanted)

    def judged() -> list[str]:
        yield from serving_router.workers_problems(router)
    judged._inner = judged  # type: ignore[attr-defined]
    assert run_operation(judged, lambda cls, kwargs: live, host_name="gw") == [
        repr(problem) for problem in found]


def test_a_drain_waits_on_the_removed_replicas_own_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {A: 2, B: 0}

    def loads(url: str, timeout: float = 5.0, headers: dict | None = None) -> probes.Answer:
        # SGLang's /v1/loads asks for the servers' key.
        assert headers == {"Authorization": f"Bearer {WORKER_KEY.strip()}"}
        replica = url.removesuffix("/v1/loads?include=core")
        if replica not in counts:
            return probes.Answer(url, error="[Errno 111] Connection refused")
        return probes.Answer(url, 200, {"aggregate": {"total_reqs": counts[replica]}})
    monkeypatch.setattr(probes, "get", loads)
    headers = ROUTER.headers
    assert serving_router.drain_problems([A, B, C], headers) == [
        f"{A} still answers 2 request(s)"]
    counts[A] = 0
    assert serving_router.drain_problems([A, B, C], headers) == []


@pytest.fixture
def fake_curl(tmp_path, monkeypatch) -> Path:
    """A curl on PATH that writes its arguments and its stdin where the test reads them."""
    curl = tmp_path / "bin" / "curl"
    curl.parent.mkdir()
    curl.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$CURL_ARGS"; cat > "$CURL_STDIN"\n'
                    'printf \'{"workers": []}\\n200\'\n')
    curl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{curl.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CURL_ARGS", str(tmp_path / "args"))
    monkeypatch.setenv("CURL_STDIN", str(tmp_path / "stdin"))
    return tmp_path


@pytest.mark.parametrize("command", [
    lambda router: serving_router.worker_added(router, C),
    lambda router: serving_router.worker_removed(router, "id-b"),
    lambda router: RouterWorkers().command(url=router.url, key_file=router.key_file),
], ids=["add", "remove", "list"])
def test_the_worker_api_is_asked_with_the_key_on_stdin_never_in_a_command_line(
        fake_curl: Path, command) -> None:
    key_file = fake_curl / "router_control_key"
    key_file.write_text("sk-0123456789abcdef\n")
    worker_key_file = fake_curl / "router_worker_key"
    worker_key_file.write_text("sk-worker0123456789\n")
    router = replace(ROUTER, key_file=str(key_file), worker_key_file=str(worker_key_file))
    result = subprocess.run(command(router).get_raw_value(), shell=True, capture_output=True,
                            text=True, check=True)
    arguments = (fake_curl / "args").read_text()
    stdin = (fake_curl / "stdin").read_text()
    assert "sk-" not in arguments + result.stdout + result.stderr
    assert f"{URL}/workers" in arguments
    if "POST" not in arguments:
        assert stdin == "Authorization: Bearer sk-0123456789abcdef\n"
        return
    # Both keys in curl's config on its stdin: the header, and the worker's in the body.
    assert "-K" in arguments.splitlines()
    assert stdin.splitlines() == [
        'header = "Authorization: Bearer sk-0123456789abcdef"',
        'data = "{\\"url\\": \\"' + C + '\\", \\"api_key\\": \\"sk-worker0123456789\\"}"']


def test_the_router_reads_its_key_from_its_file_as_it_starts(tmp_path: Path) -> None:
    """The unit holds the key file's path, never the key; the loader hands it on."""
    key_file = tmp_path / "router_control_key"
    key_file.write_text("sk-0123456789abcdef\n")
    worker_key_file = tmp_path / "router_worker_key"
    worker_key_file.write_text("sk-worker0123456789\n")
    service = router_service(replace(ROUTER, key_file=str(key_file),
                                     worker_key_file=str(worker_key_file)))
    assert "sk-" not in services.render(service, "systemd") + services.render(service, "runit")
    loader = service.command[:service.command.index(str(worker_key_file)) + 1]
    started = subprocess.run([*loader, "printf", "%s\\n"], capture_output=True, text=True,
                             check=True)
    assert started.stdout.splitlines() == ["--control-plane-api-keys",
                                           "twinbolt:twinbolt:admin:sk-0123456789abcdef",
                                           "--api-key", "sk-worker0123456789"]
