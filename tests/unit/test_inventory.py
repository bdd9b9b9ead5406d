"""inventory.py and group_data/, as pyinfra itself loads them (debug-inventory --json)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import _get_group_data

from lab import listing
from lab.topology import init_system, lab_pairs
from operations.site.hosts import InventoryEntry, inventory_entries
from operations.site.model import (
    GATEWAY_DEFAULTS,
    WORKSTATION_DEFAULTS,
    Ssh,
    Workstation,
    command_timeout_data,
    site_default,
)

REPO = Path(__file__).resolve().parents[2]
MINIMAL_SITE = (Path(__file__).parent / "minimal_site.toml").read_text()
TWO_PAIRS_SITE = (Path(__file__).parent / "two_pairs_site.toml").read_text()


@pytest.fixture
def inventory(run_pyinfra):
    """The hosts pyinfra sees, by name: {"groups": [...], "data": {...}}."""

    def load(**env: str) -> dict[str, dict]:
        result = run_pyinfra("inventory.py", "debug-inventory", "--json", **env)
        assert result.returncode == 0, result.stderr
        return {host["name"]: host for host in json.loads(result.stdout)}

    return load


def groups(hosts: dict[str, dict]) -> dict[str, list[str]]:
    members: dict[str, list[str]] = {}
    for name, host in hosts.items():
        for group in host["groups"]:
            members.setdefault(group, []).append(name)
    return members


def test_lab_groups(inventory):
    members = groups(inventory())
    assert members["workstations"] == ["wsa", "wsb"]
    assert members["gateway"] == ["gw"]
    assert members["pair_a"] == ["wsa", "wsb", "gw"]
    assert members["lab"] == ["wsa", "wsb", "gw"]


def test_lab_ssh_data(inventory, lab_state):
    """wsa and gw are reached as an unprivileged account with sudo, wsb as root."""
    hosts = inventory()
    for name, address, user in (("wsa", "10.66.0.11", "twinbolt"), ("wsb", "10.66.0.12", "root"),
                                ("gw", "10.66.0.13", "twinbolt")):
        data = hosts[name]["data"]
        assert data["ssh_hostname"] == address
        assert data["ssh_user"] == user
        assert (data.get("_sudo"), data.get("sudo")) == ((True, True) if user != "root"
                                                         else (None, None))
        assert data["ssh_port"] == 22
        assert data["ssh_key"] == str(lab_state / "ssh" / "id_ed25519")
        assert data["ssh_known_hosts_file"] == str(lab_state / "ssh" / "known_hosts")
        assert data["ssh_strict_host_key_checking"] == "yes"


def test_lab_workstations_know_their_rank_and_the_link(inventory):
    hosts = inventory()
    wsa, wsb = hosts["wsa"]["data"], hosts["wsb"]["data"]
    assert (wsa["rank"], wsb["rank"]) == (0, 1)
    assert (wsa["thunderbolt_address"], wsa["peer_thunderbolt_address"]) == (
        "169.254.77.1",
        "169.254.77.2",
    )
    assert (wsb["thunderbolt_address"], wsb["peer_thunderbolt_address"]) == (
        "169.254.77.2",
        "169.254.77.1",
    )
    for data in (wsa, wsb):
        assert (data["tp_size"], data["rank0_thunderbolt_address"]) == (2, "169.254.77.1")
        assert data["link_interface"] == "thunderbolt0"
        assert data["link_expected_rate_gbps"] == 20.0
        assert data["link_expected_lanes"] == 1
        assert data["candidate_module_name"] == "thunderbolt_net"
        assert data["run_dir"] == "/run/twinbolt"


def test_a_lab_of_two_pairs_has_a_group_and_a_tp_group_for_each(inventory, tmp_path):
    """`python -m lab up --pairs 2` lists its pairs; the inventory reads them."""
    listing.write(lab_pairs(2), tmp_path)
    hosts = inventory(TWINBOLT_LAB_STATE=str(tmp_path))
    members = groups(hosts)
    assert members["workstations"] == ["wsa", "wsb", "wsc", "wsd"]
    assert (members["pair_a"], members["pair_b"]) == (["wsa", "wsb", "gw"], ["wsc", "wsd", "gw"])
    assert members["gateway"] == ["gw"]
    assert members["lab"] == ["wsa", "wsb", "wsc", "wsd", "gw"]
    tp = [(hosts[name]["data"]["pair"], hosts[name]["data"]["rank"],
           hosts[name]["data"]["thunderbolt_address"],
           hosts[name]["data"]["peer_thunderbolt_address"]) for name in members["workstations"]]
    assert tp == [("a", 0, "169.254.77.1", "169.254.77.2"),
                  ("a", 1, "169.254.77.2", "169.254.77.1"),
                  ("b", 0, "169.254.78.1", "169.254.78.2"),
                  ("b", 1, "169.254.78.2", "169.254.78.1")]
    assert [hosts[name]["data"]["ssh_user"] for name in ("wsc", "wsd")] == ["twinbolt", "root"]
    assert hosts["wsc"]["data"]["serving_sglang_module"] == "lab.sglang_sim"


def test_lab_overrides_serving(inventory):
    data = inventory()["wsa"]["data"]
    # The init system the lab's hosts boot (systemd unless `lab up --init runit`).
    assert data["serving_init_system"] == init_system()
    assert data["serving_python"] == str(REPO / ".venv" / "bin" / "python")
    assert data["serving_sglang_module"] == "lab.sglang_sim"
    assert data["serving_model_path"] == "/var/lib/models/qwen"
    assert data["serving_quantization"] == "modelopt_fp4"
    assert data["serving_port"] == 30000


def test_lab_candidate_checksum_is_read_when_the_lab_has_built_it(inventory, tmp_path):
    candidate = tmp_path / "modules" / "candidate" / "thunderbolt_net.ko"
    candidate.parent.mkdir(parents=True)
    candidate.with_name("thunderbolt_net.ko.sha256").write_text(
        "ab" * 32 + "  thunderbolt_net.ko\n"
    )
    listing.write(lab_pairs(1), tmp_path)
    data = inventory(TWINBOLT_LAB_STATE=str(tmp_path))["wsb"]["data"]
    assert data["candidate_path"] == str(candidate)
    assert data["candidate_sha256"] == "ab" * 32


def test_lab_without_a_candidate_still_loads(inventory, tmp_path):
    listing.write(lab_pairs(1), tmp_path)
    data = inventory(TWINBOLT_LAB_STATE=str(tmp_path))["wsa"]["data"]
    assert data["candidate_sha256"] is None


def test_site_groups_and_data(inventory, write_site, tmp_path):
    hosts = inventory(TWINBOLT_SITE=str(write_site()))
    members = groups(hosts)
    assert members["workstations"] == ["ws0", "ws1"]
    assert members["gateway"] == ["gw0"]
    assert members["pair_a"] == ["ws0", "ws1", "gw0"]
    assert "lab" not in members

    ws1 = hosts["ws1"]["data"]
    assert ws1["rank"] == 1
    assert ws1["ssh_hostname"] == "127.0.0.1"
    assert ws1["ssh_port"] == 1
    assert ws1["ssh_strict_host_key_checking"] == "yes"
    # Unset connector keys are absent, not None: pyinfra refuses None for them.
    assert "ssh_key" not in ws1
    assert "ssh_known_hosts_file" not in ws1
    assert ws1["thunderbolt_address"] == "169.254.77.2"
    assert ws1["peer_thunderbolt_address"] == "169.254.77.1"
    assert ws1["candidate_path"] == str(tmp_path / "modules" / "thunderbolt_net.ko")
    assert ws1["serving_init_system"] == "systemd"
    assert ws1["serving_sglang_module"] == "sglang.launch_server"
    assert ws1["run_dir"] == "/run/twinbolt"

    gw0 = hosts["gw0"]["data"]
    assert gw0["gateway_roles_large_api_base"] == "http://127.0.0.1:1/v1"
    assert gw0["gateway_roles_litellm_port"] == 4000


def test_site_values_win_over_group_data(inventory, write_site):
    site = write_site(MINIMAL_SITE + "\n[link]\nexpected_rate_gbps = 40.0\nexpected_lanes = 2\n")
    data = inventory(TWINBOLT_SITE=str(site))["ws0"]["data"]
    assert (data["link_expected_rate_gbps"], data["link_expected_lanes"]) == (40.0, 2)


def test_a_sudo_host_is_one_for_pyinfra_and_for_twinbolts_own_readers(write_site, monkeypatch):
    site = write_site(MINIMAL_SITE.replace('name = "ws0"\n',
                                           'name = "ws0"\nssh_user = "ops"\nsudo = true\n', 1))
    monkeypatch.delenv("TWINBOLT_LAB_STATE", raising=False)
    monkeypatch.setenv("TWINBOLT_SITE", str(site))
    entries = {entry.name: entry for entry in inventory_entries()}
    assert (entries["ws0"].sudo, entries["ws0"].data["_sudo"]) == (True, True)
    assert not entries["ws1"].sudo and "_sudo" not in entries["ws1"].data


def test_testinfra_checks_a_sudo_host_under_sudo(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("verify_conftest",
                                                  REPO / "tests" / "verify" / "conftest.py")
    verify = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, verify)
    # As pytest puts a conftest's directory on the path: its helpers import from there.
    monkeypatch.syspath_prepend(str(REPO / "tests" / "verify"))
    spec.loader.exec_module(verify)
    for name, data, command in (("ws0", {"sudo": True}, "sudo /bin/sh -c 'id -u'"),
                                ("ws1", {}, "id -u")):
        entry = InventoryEntry(name, ("workstations",), data)
        handle = verify.inventory_host(entry, tmp_path / "ssh_config").host
        assert handle.backend.get_command("id -u") == command


def test_lab_hosts_have_every_key_a_site_gives(inventory, write_site):
    # group_data/ publishes the site model's defaults under the names a site's
    # host data uses; a name out of step would leave a lab host without a key.
    lab = inventory()
    site = inventory(TWINBOLT_SITE=str(write_site()))
    for lab_host, site_host in (("wsa", "ws0"), ("gw", "gw0")):
        assert set(site[site_host]["data"]) <= set(lab[lab_host]["data"])


def test_group_data_publishes_the_site_models_defaults_each_by_its_name():
    # Each default is a line of its own in group_data/, for grep; this keeps the
    # lines and the model's table of sections from drifting apart.
    with ctx_state.use(State()):
        published = _get_group_data(str(REPO / "group_data"))
    assert published["workstations"] == {
        **WORKSTATION_DEFAULTS,
        "serving_listen_address": str(site_default(Workstation, "listen_address")),
    }
    assert published["gateway"] == GATEWAY_DEFAULTS
    assert published["all"] == {
        "run_dir": "/run/twinbolt",
        **command_timeout_data(site_default(Ssh, "command_timeout_seconds")),
    }


def test_a_bad_site_stops_the_inventory_with_the_key_path(run_pyinfra, write_site):
    site = write_site(MINIMAL_SITE.replace('"169.254.77.2"', '"169.254.77"'))
    result = run_pyinfra("inventory.py", "debug-inventory", TWINBOLT_SITE=str(site))
    assert result.returncode != 0
    assert f"{site}: workstations.1.thunderbolt_address: value is not a valid IPv4 address" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_missing_site_file_names_it_and_the_variable(run_pyinfra, tmp_path):
    result = run_pyinfra(
        "inventory.py", "debug-inventory", TWINBOLT_SITE=str(tmp_path / "nope.toml")
    )
    assert result.returncode != 0
    assert f"site file {tmp_path / 'nope.toml'} does not exist" in result.stderr
    assert "TWINBOLT_SITE" in result.stderr


def test_a_first_dry_run_with_a_missing_key_is_one_line_per_host(run_pyinfra, write_site, tmp_path):
    """pyinfra itself would print a gevent traceback per host ('No such private key file')."""
    site = write_site(MINIMAL_SITE.replace('ssh_port = 1\n', 'ssh_port = 1\nssh_key = "id_nope"\n'))
    result = run_pyinfra("-y", "--dry", "inventory.py", "deploy.py", "--data", "state=production",
                         TWINBOLT_SITE=str(site))
    assert result.returncode != 0
    for where, name in (("workstations.0", "ws0"), ("workstations.1", "ws1"), ("gateway", "gw0")):
        assert (f"{site}: {where}.ssh_key (host {name}): no such file: {tmp_path / 'id_nope'}"
                in result.stderr)
    assert "Traceback" not in result.stderr + result.stdout


def test_a_rollback_gets_its_carried_data_on_every_host_over_group_data(inventory, write_site):
    carried = json.dumps(["serving_port=31000", "lock_inherited=machine=m user=u pid=1"])
    hosts = inventory(TWINBOLT_SITE=str(write_site()), TWINBOLT_CARRIED_DATA=carried)
    for name in ("ws0", "ws1", "gw0"):
        assert hosts[name]["data"]["serving_port"] == 31000
        assert hosts[name]["data"]["lock_inherited"] == "machine=m user=u pid=1"


def test_a_site_of_pairs_has_a_group_for_each_pair(inventory, write_site):
    hosts = inventory(TWINBOLT_SITE=str(write_site(TWO_PAIRS_SITE)))
    members = groups(hosts)
    assert members["workstations"] == ["wsa", "wsb", "wsc", "wsd"]
    assert (members["pair_a"], members["pair_b"]) == (["wsa", "wsb", "gw0"],
                                                      ["wsc", "wsd", "gw0"])
    assert members["gateway"] == ["gw0"]
    assert [(hosts[name]["data"]["pair"], hosts[name]["data"]["rank"])
            for name in members["workstations"]] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_a_run_started_outside_the_checkout_is_refused_clearly(tmp_path) -> None:
    """pyinfra reads config.py from the current directory only: its checks would be missing."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), str(REPO / "inventory.py"),
         str(REPO / "deploy.py"), "--data", "state=production", "--dry"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert (f"run pyinfra from twinbolt's checkout: it reads config.py (the state and --data "
            f"checks, the handling of Ctrl-C) from the current directory only, and this is "
            f"{tmp_path}; cd {REPO} and run the command again. Nothing was changed") in output
    assert "Traceback" not in output


def test_a_lab_that_was_never_brought_up_is_no_site(run_pyinfra, tmp_path):
    result = run_pyinfra("inventory.py", "debug-inventory", "--json",
                         TWINBOLT_LAB_STATE=str(tmp_path))
    assert result.returncode != 0
    assert f"the embedded lab's {tmp_path / 'inventory.json'}" in result.stderr + result.stdout
    assert "python -m lab up" in result.stderr + result.stdout


def _mislisted(document: dict, how: str) -> str:
    """``document`` made wrong in one way, and what the inventory must say of it."""
    if how == "a pair out of order":
        document["pairs"]["pair_b"] = ["wsd", "wsc", "gw"]
        return "the pairs' groups hold wsa, wsb, wsd, wsc"
    if how == "a port that is a command":
        document["gateway"][0][1]["ssh_port"] = "22; reboot"
        return "gw: its data must give ssh_hostname (a host name or address) and ssh_port"
    if how == "a key that is no host data's":
        document["workstations"][0][1]["Not A Key"] = 1
        return "workstations.0.1.Not A Key.[key]: String should match pattern"
    document["extra"] = ["lab", ["wsa", "gw"]]
    return "the extra group 'lab' must be a new group of every host"


@pytest.mark.parametrize("how", ["a pair out of order", "a port that is a command",
                                 "a key that is no host data's", "a lab group short of hosts"])
def test_the_labs_listing_is_validated_as_a_site_file_is(run_pyinfra, tmp_path, how):
    """The listing is a file on disk like a site's: hostile until validated."""
    path = listing.write(lab_pairs(2), tmp_path)
    document = json.loads(path.read_text())
    said = _mislisted(document, how)
    path.write_text(json.dumps(document))
    result = run_pyinfra("inventory.py", "debug-inventory", "--json",
                         TWINBOLT_LAB_STATE=str(tmp_path))
    assert result.returncode != 0
    assert said in result.stderr + result.stdout
