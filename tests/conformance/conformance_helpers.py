"""
What the conformance tests give upstream's own code to judge: the services and
LiteLLM configs twinbolt renders for a site, reached by the runbook's own path
(pyinfra's inventory of the site file, then the settings deploy.py builds from
each host's data), and systemd's verdict on a rendered unit.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import listing, modules
from lab.topology import init_system, lab_pairs
from operations import services
from operations.gateway import proxy as gateway
from operations.services import Service
from operations.serving import router as serving_router
from operations.serving import sglang as serving
from operations.serving.sglang import Sglang
from operations.states import STATES, State

REPO = Path(__file__).resolve().parents[2]
SITE = Path(__file__).with_name("site.toml")
# Where systemd's own units are, for the targets a rendered unit names.
SYSTEM_UNITS = Path("/usr/lib/systemd/system")


class HostData(dict):
    """A host's data as pyinfra's ``host.data`` reads: ``data.key`` and ``data.get(key)``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


@dataclass(frozen=True)
class InventoryHost:
    name: str
    groups: tuple[str, ...]
    data: HostData


def inventory(site: Path | None = None, lab_state: Path | None = None
              ) -> dict[str, InventoryHost]:
    """
    The hosts pyinfra's CLI makes of ``inventory.py`` (group data included), by
    name, rank 0 first: a site file's, or the embedded lab's whose state is ``lab_state``.
    """
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("TWINBOLT_SITE", "TWINBOLT_LAB_STATE")}
    if site:
        environment["TWINBOLT_SITE"] = str(site)
    if lab_state:
        environment["TWINBOLT_LAB_STATE"] = str(lab_state)
    listed = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "inventory.py", "debug-inventory",
         "--json"],
        cwd=REPO, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=True,
    )
    return {host["name"]: InventoryHost(host["name"], tuple(host["groups"]),
                                        HostData(host["data"]))
            for host in json.loads(listed.stdout)}


def lab_inventory(state: Path) -> dict[str, InventoryHost]:
    """
    The embedded lab's hosts, its state in ``state`` as `python -m lab up` leaves it
    for the inventory: the listing of one pair, the init system this checkout's lab boots.
    """
    (state / "init").write_text(f"{init_system()}\n")
    listing.write(lab_pairs(1), state)
    return inventory(lab_state=state)


def site_inventory(directory: Path) -> dict[str, InventoryHost]:
    """The hosts of :data:`SITE`, written into ``directory`` beside its candidate module."""
    # Never loaded here, but a real module: the site checks it when it loads.
    modules.build("candidate", directory / "modules" / "thunderbolt_net.ko")
    return inventory(Path(shutil.copy(SITE, directory / SITE.name)))


@dataclass(frozen=True)
class Rendered:
    """What twinbolt renders for one site's hosts, built as ``deploy.py`` builds it."""

    workstations: tuple[Sglang, ...]
    router: serving_router.Router
    proxy: gateway.Proxy

    @classmethod
    def of(cls, hosts: dict[str, InventoryHost]) -> Rendered:
        workstations = [host for host in hosts.values() if "workstations" in host.groups]
        gateway_host = next(host for host in hosts.values() if "gateway" in host.groups)
        router = serving_router.Router.from_hosts(gateway_host, workstations)
        return cls(
            workstations=tuple(Sglang.from_host(host) for host in workstations),
            router=router,
            proxy=gateway.Proxy.from_host(gateway_host, router.served_model_name, router.url,
                                          router.api_key_file),
        )

    def services(self) -> list[Service]:
        """Every service some state renders, once each (a TP rank once per speculative setting)."""
        rendered = [gpu_service(sglang, state) for state in STATES.values()
                    for sglang in self.workstations]
        rendered += [serving_router.router_service(self.router),
                     gateway.proxy_service(self.proxy)]
        distinct = {services.render(service, "systemd"): service for service in rendered}
        return list(distinct.values())


def gpu_service(sglang: Sglang, state: State) -> Service:
    """The SGLang service ``state`` runs on this workstation."""
    if state.serving == "replicas":
        return serving.replica_service(sglang)
    return serving.tp_rank_service(sglang, state.speculative)


def systemd_complaints(service: Service, root: Path) -> list[str]:
    """
    What ``systemd-analyze verify`` says of the unit twinbolt renders for
    ``service``, installed at its path under ``root``: nothing when systemd
    reads it as written.

    ``root`` stands for the host the unit goes to. systemd's own units are copied
    there (a unit names ``multi-user.target``); the program the unit starts is
    an empty executable at its path, for it is on the workstation or gateway, not
    here. systemd reports a mistyped key or value as a warning and exits 0, so
    every line naming the unit counts, not only the exit code.
    """
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: `make setup` installs Debian's systemd"
    if not (root / SYSTEM_UNITS.relative_to("/")).exists():
        shutil.copytree(SYSTEM_UNITS, root / SYSTEM_UNITS.relative_to("/"), symlinks=True)
    rendered = services.render(service, "systemd")
    # Every program an Exec*= line starts (the service's own, and /bin/kill for
    # a reloadable one's ExecReload=), at its path under the root.
    for line in rendered.splitlines():
        if line.startswith("Exec") and "=" in line:
            program = root / shlex.split(line.partition("=")[2])[0].lstrip("-@:+!").lstrip("/")
            program.parent.mkdir(parents=True, exist_ok=True)
            program.touch(mode=0o755)
    path = services.unit_path(service.name)
    unit = root / path.lstrip("/")
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(rendered)
    result = subprocess.run([analyze, f"--root={root}", "verify", path],
                            capture_output=True, text=True, timeout=60)
    complaints = [line for line in result.stderr.splitlines() if unit.name in line]
    if result.returncode != 0 and not complaints:
        complaints = result.stderr.splitlines() or [f"exit {result.returncode}"]
    return complaints
