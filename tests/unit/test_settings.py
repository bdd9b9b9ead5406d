"""A host's settings: one typed object, built from its final host data, --data included."""

import json
import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from harness.hosts.counters import from_reading
from harness.hosts.remote import Reading
from operations import part
from operations.gateway import proxy
from operations.safety import guard
from operations.serving import router, sglang
from operations.site.hosts import InventoryEntry
from operations.site.model import GatewayRoles, Link, Serving, load_site, section_defaults
from operations.site.settings import (
    GatewaySettings,
    HostSettings,
    WorkstationSettings,
    derived,
)
from operations.states import Driver
from operations.thunderbolt import link
from operations.thunderbolt.driver import CandidateModule


@pytest.fixture
def entries(run_pyinfra):
    """The inventory's hosts by name, as pyinfra merges them (extra CLI arguments passed on)."""

    def load(*arguments: str, **env: str) -> dict[str, InventoryEntry]:
        result = run_pyinfra("inventory.py", "debug-inventory", "--json", *arguments, **env)
        assert result.returncode == 0, result.stderr
        return {host["name"]: InventoryEntry(host["name"], tuple(host["groups"]), host["data"])
                for host in json.loads(result.stdout)}

    return load


def test_a_sites_inventory_data_builds_the_sites_settings(write_site):
    site = load_site(write_site())
    (name, data), _ = site.workstation_hosts()
    settings = WorkstationSettings.of(InventoryEntry(name, ("workstations",), data))
    # Host data holds the local paths as strings, the site file's model as paths.
    assert settings.serving.model_dump(mode="json") == site.serving.model_dump(mode="json")
    assert settings.link == site.link
    assert (settings.rank, settings.tp_size, settings.address) == (0, 2, "127.0.0.1")
    assert settings.peer_link_address == str(site.workstations[1].thunderbolt_address)
    assert settings.rank0_link_address == settings.link_address
    ((gateway, gateway_data),) = site.gateway_hosts()
    roles = GatewaySettings.of(InventoryEntry(gateway, ("gateway",), gateway_data)).roles
    # The data holds each value as JSON: the large backend's URL as the string the site wrote.
    expected = site.gateway_roles.model_dump(mode="json")
    assert {**vars(roles), "large": vars(roles.large)} == expected


def test_the_labs_group_data_reaches_the_settings(entries):
    hosts = entries()
    wsb = WorkstationSettings.of(hosts["wsb"])
    assert (wsb.rank, wsb.serving.sglang_module, wsb.serving.user) == (1, "lab.sglang_sim", "root")
    assert wsb.run_dir == "/run/twinbolt"
    gateway = GatewaySettings.of(hosts["gw"])
    assert gateway.roles.large.served_model_name == "large"
    assert gateway.roles.router_port == GatewayRoles.model_fields["router_port"].default


def test_data_given_on_the_command_line_wins_over_site_and_group_data(entries, write_site):
    hosts = entries("--data", "link_wait_seconds=5", "--data", "serving_port=31000",
                    TWINBOLT_SITE=str(write_site()))
    settings = WorkstationSettings.of(hosts["ws1"])
    assert (settings.link.wait_seconds, settings.serving.port) == (5, 31000)
    assert settings.server_url == "http://127.0.0.1:31000"


def test_an_override_in_the_data_reaches_the_object():
    data = {"gateway_roles_router_port": 30081, "gateway_roles_large_api_key_env": "KEY"}
    roles = GatewaySettings.of(InventoryEntry("gw", ("gateway",), data)).roles
    assert (roles.router_port, roles.large.api_key_env) == (30081, "KEY")
    # What no data holds is the site model's default.
    assert roles.litellm_port == 4000


def test_a_setting_of_the_model_is_published_and_read_back_by_its_own_name():
    published = section_defaults(Serving, "serving")
    assert published["serving_start_timeout_seconds"] == 900
    assert set(published) == {f"serving_{name}" for name, field in Serving.model_fields.items()
                              if not field.is_required()}
    served = {**published, "serving_model_path": "/models/q", "serving_served_model_name": "q"}
    settings = WorkstationSettings.of(InventoryEntry("ws", ("workstations",), served))
    assert {f"serving_{name}": value
            for name, value in settings.serving.model_dump(mode="json").items()} == served


def test_the_address_is_the_ssh_hostname_else_the_name():
    assert HostSettings.of(InventoryEntry("gw", (), {"ssh_hostname": "10.0.0.9"})).address == (
        "10.0.0.9")
    assert HostSettings.of(InventoryEntry("gw", (), {})).address == "gw"


def test_the_base_urls():
    workstation = WorkstationSettings.of(InventoryEntry("ws", (), {
        "ssh_hostname": "10.0.0.10", "serving_port": 30001}))
    assert workstation.server_url == "http://10.0.0.10:30001"
    gateway = GatewaySettings.of(InventoryEntry("gw", (), {
        "ssh_hostname": "10.0.0.9", "gateway_roles_router_port": 30081,
        "gateway_roles_litellm_port": 4001}))
    assert (gateway.router_url, gateway.proxy_url) == ("http://10.0.0.9:30081",
                                                       "http://10.0.0.9:4001")


def test_the_peer_is_the_other_end_of_the_cable(write_site):
    site = load_site(write_site())
    ends = [str(workstation.thunderbolt_address) for workstation in site.workstations]
    peers = [WorkstationSettings.of(InventoryEntry(name, (), data)).peer_link_address
             for name, data in site.workstation_hosts()]
    assert peers == ends[::-1]


def test_the_candidate_module_and_its_build_id_when_it_cannot_be_read(tmp_path):
    settings = WorkstationSettings.of(InventoryEntry("ws", (), {
        "candidate_path": str(tmp_path / "missing.ko"), "candidate_sha256": "ab" * 32,
        "candidate_module_name": "tbnet_candidate"}))
    assert CandidateModule.of(settings) == CandidateModule(str(tmp_path / "missing.ko"), "ab" * 32,
                                                           "tbnet_candidate")
    assert CandidateModule.of(settings).readable_build_id is None


def test_the_measured_link_rate_is_the_link_layers_slower_direction():
    xdomain = {"device": "0-3", "peer": "wsb", "rx_speed_gbps": 20.0, "tx_speed_gbps": 10.0,
               "rx_lanes": 2, "tx_lanes": 2, "others": []}
    reading = Reading("wsa", {"xdomain": xdomain, "module": None, "counters": {},
                              "sockets": {}}, 0.0)
    assert from_reading(reading).rx_rate_gbps == 20.0


# Settings reach a layer one way: by their names (derived).


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pip_options: tuple[str, ...]
    workers: tuple[str, ...]


def test_a_layer_takes_each_setting_by_its_name_or_by_its_roles_prefix():
    gateway = GatewaySettings.of(InventoryEntry("gw", (), {
        "ssh_hostname": "10.0.0.9", "gateway_roles_router_port": 30081,
        "gateway_roles_pip_options": ["--no-index"]}))
    listener = derived(Listener, gateway, gateway.roles, prefix="router_", workers=("w",))
    assert listener == Listener("10.0.0.9", 30081, ("--no-index",), ("w",))


GATEWAY = GatewaySettings.of(InventoryEntry("gw", (), {}))


@pytest.mark.parametrize(("sources", "prefix", "computed", "problem"), [
    ((GATEWAY, GATEWAY.roles), "", {"workers": ()},
     "Listener.port: no setting is named so; a field no setting holds is computed"),
    ((GATEWAY, GATEWAY.roles), "router_", {}, "Listener.workers: no setting is named so"),
    ((GATEWAY, Listener("10.0.0.8", 1, (), ())), "", {"workers": ()},
     "Listener.address: more than one setting holds it "
     "(GatewaySettings.address, Listener.address)"),
])
def test_a_layer_field_that_no_setting_names_or_two_do_is_refused(sources, prefix, computed,
                                                                  problem):
    with pytest.raises(TypeError, match=re.escape(problem)):
        derived(Listener, *sources, prefix=prefix, **computed)


# What each layer computes; every other field of it is a setting of its name.
COMPUTED = {
    "Sglang": set(),
    "ExpectedLink": set(),
    "Router": {"workers", "served_model_name", "start_timeout_seconds", "api_key_file"},
    "Proxy": {"small", "large", "secret_files", "small_key_source"},
    "Guard": {"link", "rank_service", "staged_candidate",
              "events_path", "sysfs", "uptime_path", "module_seconds"},
}


def test_every_field_of_a_layer_is_a_setting_of_its_name_or_listed_as_computed(
        write_site, monkeypatch):
    # derived refuses a field that no setting names and is not given as computed,
    # and this test holds what each layer computes to COMPUTED: a field added to
    # a layer is a setting's name, or a computed value listed here.
    computed: dict[str, set[str]] = {}

    def recording(layer, *sources, prefix="", **values):
        computed[layer.__name__] = set(values)
        return derived(layer, *sources, prefix=prefix, **values)

    for module in (sglang, router, proxy, link, guard):
        monkeypatch.setattr(module, "derived", recording)
    site = load_site(write_site())
    workstations = [InventoryEntry(name, ("workstations",), data)
                    for name, data in site.workstation_hosts()]
    ((name, data),) = site.gateway_hosts()
    gateway = InventoryEntry(name, ("gateway",), data)
    inventory = SimpleNamespace(get_group={"workstations": workstations, "pair_a": workstations,
                                           "gateway": [gateway]}.get)
    the_sglang = sglang.Sglang.from_host(workstations[0])
    the_part = part.WorkstationPart.of(WorkstationSettings.of(workstations[0]), inventory,
                                       the_sglang, Driver.CANDIDATE)
    the_router = router.Router.from_hosts(gateway, workstations)
    the_proxy = proxy.Proxy.from_host(gateway, the_router.served_model_name, the_router.url,
                                      the_router.api_key_file)
    assert computed == COMPUTED
    # Each setting under its own name, a role's without its prefix.
    assert (the_sglang.sglang_module, the_sglang.interface) == (
        site.serving.sglang_module, site.link.interface)
    assert the_part.link.peer_link_address == str(site.workstations[1].thunderbolt_address)
    assert the_part.link.wait_seconds == Link().wait_seconds
    assert (the_part.guard.guard_stall_seconds, the_part.guard.module_name,
            the_part.guard.init_system) == (site.candidate.guard_stall_seconds,
                                            site.candidate.module_name, site.serving.init_system)
    roles = site.gateway_roles
    assert (the_router.port, the_router.venv, the_router.user) == (
        roles.router_port, roles.router_venv, roles.router_user)
    assert (the_proxy.port, the_proxy.venv, the_proxy.user, the_proxy.config_file) == (
        roles.litellm_port, roles.litellm_venv, roles.litellm_user, roles.litellm_config_file)
