"""
The gateway installs its own software: with its services stopped and its venvs
gone, as on a gateway twinbolt has never touched, a production converge makes
both venvs from the hash-pinned locks (the lab's pip reads the wheelhouse
`make setup` built, never a registry), starts the router and the proxy from them,
and proves the route; the next converge installs nothing.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from e2e_helpers import deploy, inventory, removed, service_process, ssh

from operations.gateway.proxy import LITELLM_LOCK
from operations.plumbing.venvs import DIST_INFO_SCRIPT, InstalledVersions, lock_pins
from operations.serving.router import ROUTER_LOCK

SERVICES = {"litellm": "litellm", "sglang-router": "router"}


def gateway_data() -> dict:
    (gateway,) = [entry for entry in inventory() if "gateway" in entry.groups]
    return gateway.data


def installed(venv: str) -> dict[str, str]:
    output = ssh("gw", f"sh -c {shlex.quote(DIST_INFO_SCRIPT)} - {venv}")
    return InstalledVersions().process(output.splitlines())


def runs_code_from(service: str, venv: str) -> bool:
    """The service's process has the venv's own compiled modules mapped (its argv may be
    retitled: sglang-router's reads ``sglang::router``)."""
    process = service_process("gw", service)
    return process["running"] and f" {venv}/lib/" in ssh("gw", f"cat /proc/{process['pid']}/maps")


def test_a_gateway_without_venvs_installs_them_from_the_locks() -> None:
    data = gateway_data()
    venvs = {service: data[f"gateway_roles_{key}_venv"] for service, key in SERVICES.items()}
    removed("gw", *SERVICES)
    ssh("gw", f"rm -rf {' '.join(venvs.values())}")
    assert all(installed(venv) == {} for venv in venvs.values())

    started = time.monotonic()
    run = deploy("production")
    print(f"production on a gateway without venvs: {time.monotonic() - started:.1f}s")
    assert run.returncode == 0, run.output[-3000:]
    for service, lock in (("litellm", LITELLM_LOCK), ("sglang-router", ROUTER_LOCK)):
        pins = lock_pins(Path(lock))
        have = installed(venvs[service])
        assert {name: have.get(name) for name in pins} == pins, service
        assert runs_code_from(service, venvs[service]), service
    assert "--find-links" in data["gateway_roles_pip_options"]

    again = deploy("production")
    assert again.returncode == 0, again.output[-3000:]
    assert again.changed_hosts() == set(), again.output[-3000:]
