"""The gateway layer, end to end: the user's route survives the outage, and a
broken fallback keeps the GPUs where they are.

Every test leaves the lab in a verified production with no fault switched on.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_helpers import deploy, init_system, lab, service_log, snapshot, ssh, verify

from lab.topology import host_named
from operations import services
from operations.gateway.proxy import DEPLOYMENTS
from operations.gateway.route import RoleAnswers
from operations.plumbing import probes

# The lab's gateway files live in its private /var/lib (see group_data/lab.py).
CONFIG = "/var/lib/twinbolt/litellm.yaml"
MASTER_KEY = "/var/lib/twinbolt/litellm_master_key"
PROXY_URL = f"http://{host_named('gw').management_address}:4000"


def converged(state: str) -> str:
    """Move the lab to ``state`` and verify it; what the deploy printed."""
    run = deploy(state)
    assert run.returncode == 0, run.output[-4000:]
    checks = verify(state)
    assert checks.returncode == 0, checks.stdout[-4000:]
    return run.output


def general_fallback_line() -> str:
    return ssh("gw", f"grep -n '^  fallbacks:' {CONFIG}").strip()


def ask(role: str, tokens: int = 8) -> probes.Answer:
    """A real completion through ``role``, asked on the gateway as the deploy asks it."""
    command = RoleAnswers().command(PROXY_URL, MASTER_KEY, (role,), tokens).get_raw_value()
    return RoleAnswers().process(ssh("gw", command).splitlines())[role]


def position(output: str, operation: str) -> int:
    index = output.find(f"Starting operation: {operation}")
    assert index >= 0, f"no operation {operation!r} ran"
    return index


@pytest.fixture
def production_restored() -> Iterator[None]:
    yield
    lab("fault", "fallback_down", "off")
    converged("production")


def test_the_route_is_proven_during_the_outage_and_the_fallback_goes_after_production(
        production_restored: None) -> None:
    leaving = converged("tp2_e2e")
    assert general_fallback_line(), f"{CONFIG} has no general fallback in tp2_e2e"
    # The fallback is in place and proven before anything stops, and the route
    # is proven once the replicas are down, before the driver changes.
    assert (position(leaving, "Gateway: the temporary fallback small -> large is present")
            < position(leaving, "Gateway: a forced fallback through small is served by large")
            < position(leaving, "Serving: the replicas are stopped")
            < position(leaving, "Gateway: small answers through the fallback while the "
                                "replicas are down")
            < position(leaving, "Driver: thunderbolt_net is the candidate build"))

    returning = converged("production")
    assert general_fallback_line() == "", f"{CONFIG} still has the general fallback"
    # Removed only after each replica and the router served a real completion.
    assert (position(returning, "Serving: the router serves a real completion")
            < position(returning, "Gateway: the temporary fallback is removed")
            < position(returning, "Gateway: small is served by the Qwen deployment, "
                                  "large by large"))


def test_a_broken_fallback_refuses_to_leave_production_before_any_change(
        production_restored: None) -> None:
    before = {**snapshot(), "gateway config": ssh("gw", f"sha256sum {CONFIG}")}
    lab("fault", "fallback_down", "on")
    run = deploy("tp2_e2e")
    assert run.returncode != 0
    assert "gw: gateway layer: role large: no completion" in run.output, run.output[-4000:]
    assert "small would have nowhere to fall back to" in run.output
    # What to do is said, once, without a Python traceback.
    assert "converge it first: pyinfra inventory.py deploy.py --data state=production" in run.output
    assert "Traceback" not in run.output, run.output[-3000:]
    assert {**snapshot(), "gateway config": ssh("gw", f"sha256sum {CONFIG}")} == before
    # Production still answers through small, served by the Qwen deployment.
    small = ask("small")
    assert small.ok, small.describe()
    assert small.headers["x-litellm-model-id"] == DEPLOYMENTS["small"]


def test_the_master_key_is_private_and_never_printed(production_restored: None) -> None:
    output = converged("production")
    mode = ssh("gw", f"stat -c '%a %U' {MASTER_KEY}").strip()
    assert mode == "600 root"
    key = ssh("gw", f"cat {MASTER_KEY}").strip()
    assert key.startswith("sk-")
    # -vvv prints every command and every fact's output.
    dry = deploy("tp2_e2e", "--dry", "-vvv")
    unit = services.rendered_path("litellm", init_system())
    for text in (output, dry.output, ssh("gw", f"cat {CONFIG} {unit}"),
                 service_log("gw", "litellm")):
        assert key not in text
