"""The gateway layer: the public roles on the LiteLLM proxy, and the temporary fallback.

A fallback in a file is not a fallback the proxy has, and a proxy that has one
has not proven it: the config's fallbacks must match the state, the running
proxy must route as its config says (asked of its own API), and a real request
through each role must be answered by the deployment the state implies, read
from ``x-litellm-model-id``. Every keyed request runs on the gateway, where curl
reads the master key from its file: the key never reaches this process. The
proxy's readiness, which needs no key, is asked from here, the clients' side.
"""

from __future__ import annotations

import httpx
import pytest
from verify_helpers import fact

from operations.gateway.front import render_config as render_front
from operations.gateway.proxy import (
    DEPLOYMENTS,
    ROLES,
    LiveRouting,
    Proxy,
    ProxyConfig,
    describe,
    serving_deployments,
    wanted_routing,
)
from operations.gateway.route import RoleAnswers, answer_problems
from operations.plumbing.facts import FileDigest, digest
from operations.services import ServiceProcess
from operations.serving.router import Router
from operations.site.hosts import in_group
from operations.states import State

TOKENS = 16


@pytest.fixture(scope="module")
def proxy(gateway, inventory) -> Proxy:
    router = Router.from_hosts(gateway, in_group(inventory, "workstations"))
    return Proxy.from_host(gateway, router.served_model_name, router.url, router.api_key_file)


def test_the_config_has_the_fallbacks_the_state_declares(gateway, proxy: Proxy, state: State,
                                                         fallback: bool) -> None:
    config = fact(gateway, ProxyConfig, path=proxy.config_file)
    assert config is not None, f"{gateway.name}: no LiteLLM config at {proxy.config_file}"
    wanted = wanted_routing(proxy, fallback)
    assert config["context_window_fallbacks"] == {"small": ["large"]}
    assert config["fallbacks"] == wanted["fallbacks"], (
        f"{proxy.config_file} has the general fallbacks {describe(config['fallbacks'])}; "
        f"{state.name} declares {describe(wanted['fallbacks'])}")
    assert config == wanted


def test_clients_reach_litellm_only_through_its_front(gateway, proxy: Proxy) -> None:
    """The front sends again what a reload closed unread; LiteLLM itself is the gateway's alone."""
    front = proxy.front
    on_disk = fact(gateway, FileDigest, path=front.config_file)
    assert on_disk == digest(render_front(front), "644"), (
        f"{gateway.name}: {front.config_file} is not the front's config twinbolt renders")
    assert fact(gateway, ServiceProcess, service=front.service,
                init_system=front.init_system)["running"], (
        f"{gateway.name}: {front.service} (haproxy) does not run")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{proxy.address}:{proxy.backend_port}/health/readiness", timeout=5)


def test_the_running_proxy_routes_as_its_config_says(gateway, proxy: Proxy,
                                                     fallback: bool) -> None:
    # Asked from here, where clients are: a proxy bound to the gateway's loopback
    # (its own name is 127.0.1.1 on Debian) would look ready from the gateway.
    readiness = httpx.get(f"{proxy.url}/health/readiness", timeout=10)
    assert readiness.status_code == 200, \
        f"{proxy.url}/health/readiness answers {readiness.status_code} here: {readiness.text}"
    live = fact(gateway, LiveRouting, url=proxy.url, master_key_file=proxy.master_key_file)
    assert live is not None, f"{proxy.url} does not answer its API with the master key"
    assert live == wanted_routing(proxy, fallback), (
        f"the running proxy has the general fallbacks {describe(live['fallbacks'])} and the "
        f"context-window fallbacks {describe(live['context_window_fallbacks'])}")


def test_without_the_fallback_no_general_fallback_exists(gateway, proxy: Proxy, state: State,
                                                         fallback: bool) -> None:
    if fallback:
        pytest.skip(f"{state.name} declares the temporary fallback, and no other pair serves")
    config = fact(gateway, ProxyConfig, path=proxy.config_file)
    live = fact(gateway, LiveRouting, url=proxy.url, master_key_file=proxy.master_key_file)
    assert config["fallbacks"] == {} and live["fallbacks"] == {}, (
        f"general fallbacks remain: config {describe(config['fallbacks'])}, "
        f"running proxy {describe(live['fallbacks'])}")


@pytest.mark.parametrize("role", ROLES)
def test_a_real_request_through_each_role_is_served_as_the_state_implies(
        gateway, proxy: Proxy, fallback: bool, role: str) -> None:
    answer = fact(gateway, RoleAnswers, url=proxy.url, master_key_file=proxy.master_key_file,
                  roles=(role,), tokens=TOKENS)[role]
    expected = serving_deployments(fallback)[role]
    assert answer_problems(role, answer, expected, TOKENS) == []
    if role == "small" and expected == DEPLOYMENTS["large"]:
        assert int(answer.headers.get("x-litellm-attempted-fallbacks", "0")) >= 1
