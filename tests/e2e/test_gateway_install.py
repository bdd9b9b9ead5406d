"""
The gateway installs its own software: with its services stopped and its venvs
gone, as on a gateway twinbolt has never touched, a production converge makes
both venvs from the hash-pinned locks (the lab's pip reads the wheelhouse
`make setup` built, never a registry), starts the router and the proxy from them,
and proves the route; the next converge installs nothing.

A gateway that runs the site's own LiteLLM under the proxy's name is refused
before any change, and twinbolt's proxy then runs beside it, under a name and
port of its own, leaving the site's untouched.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from e2e_helpers import deploy, init_system, inventory, removed, service_process, snapshot, ssh

from operations import services
from operations.gateway.front import front_name
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


# The site's own LiteLLM, as far as twinbolt can tell: a service of the proxy's
# name that twinbolt did not render, serving on the proxy's port.
SITE_COMMAND = "/usr/bin/python3 -m http.server 4000"
SITE_UNIT = f"""[Unit]
Description=The site's own LiteLLM
[Service]
ExecStart={SITE_COMMAND}
[Install]
WantedBy=multi-user.target
"""
SITE_RUN = f"#!/bin/sh\nexec {SITE_COMMAND}\n"
BESIDE = ("--data", "gateway_roles_litellm_service=twinbolt-litellm",
          "--data", "gateway_roles_litellm_port=4001",
          "--data", "gateway_roles_litellm_backend_port=4101",
          "--data", "gateway_roles_litellm_config_file=/var/lib/twinbolt/twinbolt-litellm.yaml")


def site_litellm_installed() -> str:
    """Replace twinbolt's proxy and its front by the site's own LiteLLM; its file's path."""
    removed("gw", "litellm", front_name("litellm"))
    path = services.rendered_path("litellm", init_system())
    text = SITE_UNIT if init_system() == "systemd" else SITE_RUN
    start = ("systemctl daemon-reload && systemctl enable --now litellm.service"
             if init_system() == "systemd"
             else f"chmod 755 {path} && ln -sfn {Path(path).parent} {services.RUNIT_SVDIR}/litellm")
    ssh("gw", f"printf %s {shlex.quote(text)} > {path} && {start}")
    for _ in range(50):
        if service_process("gw", "litellm")["running"]:
            return path
        time.sleep(0.2)
    raise AssertionError("the site's own LiteLLM did not start")


def test_the_sites_own_litellm_is_refused_then_kept_beside() -> None:
    path = site_litellm_installed()
    site = service_process("gw", "litellm")
    before = snapshot()
    refused = deploy("production")
    assert refused.returncode != 0
    assert f"gw: gateway layer: {path} is not twinbolt's" in refused.output, refused.output[-3000:]
    assert snapshot() == before, "a refused run must change nothing"

    beside = deploy("production", *BESIDE)
    assert beside.returncode == 0, beside.output[-3000:]
    ours = service_process("gw", "twinbolt-litellm")
    assert ours["running"] and "--port 4101" in " ".join(ours["argv"])
    assert service_process("gw", front_name("twinbolt-litellm"))["running"]
    # The site's own: the same process, the same file, never restarted.
    assert service_process("gw", "litellm")["pid"] == site["pid"]
    assert SITE_COMMAND in ssh("gw", f"cat {path}")

    # Back to the lab as it was: twinbolt's proxy under its usual name.
    beside_services = ("twinbolt-litellm", front_name("twinbolt-litellm"))
    removed("gw", "litellm", *beside_services)
    ssh("gw", "rm -f " + " ".join([path, *(services.rendered_path(name, init_system())
                                           for name in beside_services)]))
    restored = deploy("production")
    assert restored.returncode == 0, restored.output[-3000:]
