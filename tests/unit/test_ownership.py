"""The site's own LiteLLM on the gateway is refused, never overwritten (gateway/ownership.py)."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
from pyinfra.api.exceptions import OperationError
from pyinfra_fakes import FakeHost, on
from test_gateway import PROXY

from operations import services
from operations.gateway import ownership
from operations.gateway.ownership import ProxyNeighbours, foreign_problems

OURS = "/etc/sv/litellm/run"
RUNNING = {"running": True, "pid": 41, "children": [51, 52]}
STOPPED = {"running": False, "pid": None, "children": []}
SITE_LITELLM = {"pid": 812, "command": "/opt/litellm/bin/python /opt/litellm/bin/litellm "
                                       "--config /etc/litellm/config.yaml --port 4000"}


def neighbours(file: str | None = None, ours: bool | None = None,
               listeners: tuple[dict, ...] = ()) -> dict:
    return {"file": file, "ours": ours, "listeners": list(listeners)}


@pytest.mark.parametrize(("seen", "process", "problems"), [
    # Nothing yet: a fresh gateway.
    (neighbours(), STOPPED, []),
    # twinbolt's proxy, its master or a worker holding the port.
    (neighbours(OURS, True, ({"pid": 41, "command": "litellm"},
                             {"pid": 52, "command": "litellm"})), RUNNING, []),
    # twinbolt's unit, stopped.
    (neighbours(OURS, True), STOPPED, []),
    # The site's own unit under the proxy's name, and its process on the port.
    (neighbours("/etc/systemd/system/litellm.service", False, (SITE_LITELLM,)),
     {"running": True, "pid": 812, "children": []},
     ["/etc/systemd/system/litellm.service is not twinbolt's"]),
    # Something else on the port, under another name.
    (neighbours(OURS, True, (SITE_LITELLM,)), STOPPED,
     ["port 4000 is held by pid 812 (/opt/litellm/bin/python /opt/litellm/bin/litellm "
      "--config /etc/litellm/config.yaml --port 4000), which is not twinbolt's litellm"]),
    # Both: the site's own file, and its server on the port while twinbolt's is stopped.
    (neighbours("/lib/systemd/system/litellm.service", False, (SITE_LITELLM,)), STOPPED,
     ["/lib/systemd/system/litellm.service is not twinbolt's", "port 4000 is held by pid 812"]),
], ids=["fresh", "ours-running", "ours-stopped", "site-unit", "site-port", "site-both"])
def test_the_sites_own_litellm_is_told_apart_from_twinbolts_proxy(
        seen: dict, process: dict, problems: list[str]) -> None:
    found = foreign_problems("litellm", 4000, seen, ownership.pids(process))
    assert len(found) == len(problems)
    for problem, expected in zip(found, problems, strict=True):
        assert problem.startswith(expected)


def site_litellm_on_the_users_port(service: str, rendered: str, port: int) -> dict:
    """The site's own litellm.service on port 4000; nothing of the front, nothing on 4100."""
    if service == "litellm":
        return neighbours("/etc/systemd/system/litellm.service", False)
    return neighbours(listeners=(SITE_LITELLM,) if port == 4000 else ())


def site_process(service: str, init_system: str) -> dict:
    return {"running": True, "pid": 812, "children": []} if service == "litellm" else STOPPED


def test_a_refusal_names_what_runs_and_how_to_keep_it_beside() -> None:
    host = FakeHost({ProxyNeighbours: site_litellm_on_the_users_port,
                     services.ServiceProcess: site_process}, name="gw")
    with on(host), pytest.raises(OperationError) as refused:
        list(ownership.own._inner(proxy=PROXY))
    message = str(refused.value)
    assert message.startswith("gw: gateway layer:")
    assert "/etc/systemd/system/litellm.service is not twinbolt's" in message
    # The site's process runs under that very name: the file says it all.
    assert "port 4000 is held" not in message
    assert "gateway_roles.litellm_service" in message and "litellm_port" in message
    assert "litellm_backend_port" in message


def test_a_foreign_listener_on_the_port_behind_the_front_is_refused() -> None:
    def on_the_backend_port(service: str, rendered: str, port: int) -> dict:
        return neighbours(listeners=(SITE_LITELLM,) if port == 4100 else ())
    host = FakeHost({ProxyNeighbours: on_the_backend_port,
                     services.ServiceProcess: STOPPED}, name="gw")
    with on(host), pytest.raises(OperationError) as refused:
        list(ownership.own._inner(proxy=PROXY))
    assert "port 4100 is held by pid 812" in str(refused.value)


def test_twinbolts_own_front_and_proxy_hold_their_ports() -> None:
    def ours(service: str, rendered: str, port: int) -> dict:
        pid = {4000: 61, 4100: 52}[port]
        return neighbours(rendered, True, ({"pid": pid, "command": service},))
    def processes(service: str, init_system: str) -> dict:
        return RUNNING if service == "litellm" else {"running": True, "pid": 61, "children": []}
    host = FakeHost({ProxyNeighbours: ours, services.ServiceProcess: processes}, name="gw")
    with on(host):
        assert list(ownership.own._inner(proxy=PROXY)) == []


def test_twinbolts_proxy_beside_the_sites_is_left_to_run() -> None:
    beside = dataclasses.replace(PROXY, service="twinbolt-litellm", port=4001, backend_port=4101)
    host = FakeHost({ProxyNeighbours: neighbours(), services.ServiceProcess: STOPPED}, name="gw")
    with on(host):
        assert list(ownership.own._inner(proxy=beside)) == []
    assert host.noops == ["twinbolt-litellm, twinbolt-litellm-front and ports 4001 and 4101 "
                          "are twinbolt's proxy's, or free"]


def test_the_reading_parses_the_unit_and_each_listener() -> None:
    output = ["foreign /etc/systemd/system/litellm.service",
              "listener 812 /opt/litellm/bin/python litellm --port 4000",
              "listener 813 "]
    assert ProxyNeighbours().process(output) == {
        "file": "/etc/systemd/system/litellm.service", "ours": False,
        "listeners": [{"pid": 812, "command": "/opt/litellm/bin/python litellm --port 4000"},
                      {"pid": 813, "command": ""}]}
    assert ProxyNeighbours().process([]) == neighbours()


def test_a_foreign_listeners_keys_never_leave_the_host() -> None:
    """The site's own LiteLLM may take its keys on its command line; a refusal shows none."""
    line = "/opt/litellm/bin/litellm --master_key sk-9999 --port 4000 --api-key=sk-abc123"
    shown = subprocess.run(["sed", "-E", ownership.REDACT_FLAGS], input=line,
                           capture_output=True, text=True, check=True).stdout
    assert shown == ("/opt/litellm/bin/litellm --master_key <redacted> --port 4000 "
                     "--api-key=<redacted>")
