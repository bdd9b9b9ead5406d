"""A host's settings: one typed object, built from its final host data, --data included."""

import json

import pytest

from harness.counters import from_reading
from harness.remote import Reading
from operations.site.hosts import InventoryEntry
from operations.site.model import GatewayRoles, Serving, load_site, section_defaults
from operations.site.settings import GatewaySettings, HostSettings, WorkstationSettings
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
    assert settings.serving == site.serving
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
    assert settings.candidate_module == CandidateModule(str(tmp_path / "missing.ko"), "ab" * 32,
                                                        "tbnet_candidate")
    assert settings.candidate_build_id is None


def test_the_measured_link_rate_is_the_link_layers_slower_direction():
    xdomain = {"device": "0-3", "peer": "wsb", "rx_speed_gbps": 20.0, "tx_speed_gbps": 10.0,
               "rx_lanes": 2, "tx_lanes": 2, "others": []}
    reading = Reading("wsa", {"xdomain": xdomain, "module": None, "counters": {},
                              "sockets": {}}, 0.0)
    assert from_reading(reading).rx_rate_gbps == 20.0
