"""Site files: validated once, with errors that name the key and what it may be."""

import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.server import Command
from pyinfra.operations import server

from operations.site import overrides
from operations.site.model import SiteError, load_site
from operations.site.overrides import BadOverride

REPO = Path(__file__).resolve().parents[2]
MINIMAL_SITE = (Path(__file__).parent / "minimal_site.toml").read_text()


def edited(old: str, new: str) -> str:
    assert old in MINIMAL_SITE
    return MINIMAL_SITE.replace(old, new, 1)


def problems(site_file: Path) -> list[str]:
    """The site file's error lines, with the file name they all start with taken off."""
    with pytest.raises(SiteError) as raised:
        load_site(site_file)
    lines = str(raised.value).splitlines()
    assert all(line.startswith(f"{site_file}: ") for line in lines)
    return [line.removeprefix(f"{site_file}: ") for line in lines]


def test_minimal_site_loads_with_the_defaults(write_site):
    site = load_site(write_site())
    assert [host.name for host in site.workstations] == ["ws0", "ws1"]
    assert site.workstations[0].ssh_user == "root"
    assert site.ssh.strict_host_key_checking == "yes"
    assert site.link.interface == "thunderbolt0"
    assert site.link.expected_rate_gbps == 20.0
    assert site.link.expected_lanes == 1
    assert dict(site.workstation_hosts())["ws0"]["link_wait_seconds"] == 30
    assert site.candidate.module_name == "thunderbolt_net"
    assert site.serving.quantization == "modelopt_fp4"
    assert site.serving.port == 30000
    assert site.serving.init_system == "systemd"
    assert site.gateway_roles.litellm_port == 4000
    assert str(site.gateway_roles.listen_address) == "0.0.0.0"
    assert dict(site.gateway_hosts())["gw0"]["gateway_roles_listen_address"] == "0.0.0.0"
    assert dict(site.workstation_hosts())["ws0"]["ledger_path"] == (
        "~/.local/state/twinbolt/ledger.jsonl")


def test_a_ledger_path_is_relative_to_the_site_file(write_site, tmp_path):
    site = load_site(write_site(MINIMAL_SITE + '\n[ledger]\npath = "records/ledger.jsonl"\n'))
    assert dict(site.workstation_hosts())["ws1"]["ledger_path"] == str(
        tmp_path / "records" / "ledger.jsonl")


def test_example_site_loads_once_the_files_it_names_exist(tmp_path, monkeypatch, candidate_module):
    """
    The example copied as the README says: until the key and the candidate it
    names exist, it is refused, a line per file with its host; then it loads.
    """
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    site = tmp_path / "twinbolt-site.toml"
    site.write_text((REPO / "examples" / "site.toml").read_text())
    key = tmp_path / "home" / ".ssh" / "id_ed25519"
    module = tmp_path / "modules" / "thunderbolt_net.ko"
    assert problems(site) == [
        *(f"{where} (host {name}): no such file: {key} (got '~/.ssh/id_ed25519')"
          for where, name in (("workstations.0.ssh_key", "ws0"), ("workstations.1.ssh_key", "ws1"),
                              ("gateway.ssh_key", "gw"))),
        f"candidate.path: no such file: {module} (got 'modules/thunderbolt_net.ko')",
    ]
    key.parent.mkdir(parents=True)
    key.write_text("a key\n")
    module.parent.mkdir()
    module.write_bytes(candidate_module)
    loaded = load_site(site)
    assert [host.name for host in loaded.workstations] == ["ws0", "ws1"]
    assert loaded.gateway.name == "gw"


def test_relative_local_paths_are_relative_to_the_site_file(write_site, tmp_path):
    assert load_site(write_site()).candidate.path == tmp_path / "modules" / "thunderbolt_net.ko"


def test_missing_file_names_the_path_and_the_variable(tmp_path):
    with pytest.raises(SiteError, match=f"{tmp_path / 'nope.toml'} does not exist.*TWINBOLT_SITE"):
        load_site(tmp_path / "nope.toml")


def test_malformed_toml(write_site):
    (line,) = problems(write_site(MINIMAL_SITE + "port =\n"))
    assert line.startswith("not valid TOML: ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            edited('served_model_name = "qwen"\n', ""),
            "serving.served_model_name: required, but missing",
            id="missing key",
        ),
        pytest.param(
            edited(
                'ssh_port = 1\nthunderbolt_address = "169.254.77.2"',
                'ssh_prot = 1\nthunderbolt_address = "169.254.77.2"',
            ),
            "workstations.1.ssh_prot: unknown key; allowed here: name, ssh_hostname, ssh_user,"
            " ssh_port, ssh_key, sudo, thunderbolt_address",
            id="mistyped key",
        ),
        pytest.param(
            edited("[serving]", "[serving]\nprot = 1"),
            "serving.prot: unknown key; allowed here: model_path, served_model_name,",
            id="mistyped section key",
        ),
        pytest.param(
            edited('sha256 = "9f86', 'sha256 = "zz86'),
            "candidate.sha256: must be 64 hexadecimal digits, as printed by sha256sum (got 'zz86",
            id="bad sha256",
        ),
        pytest.param(
            edited('sha256 = "9f86', 'sha256 = "9f8'),
            "candidate.sha256: must be 64 hexadecimal digits",
            id="short sha256",
        ),
        pytest.param(
            edited("[serving]", '[link]\naddress_owner = "netplan"\n\n[serving]'),
            "link.address_owner: value should be 'twinbolt' or 'system'",
            id="bad address owner",
        ),
        pytest.param(
            edited('user = "sglang"', 'user = "sglang"\nquantization = "nvfp4"'),
            "serving.quantization: value should be 'awq', ",
            id="bad quantization",
        ),
        pytest.param(
            edited('"169.254.77.2"', '"169.254.77"'),
            "workstations.1.thunderbolt_address: value is not a valid IPv4 address"
            " (got '169.254.77')",
            id="bad address",
        ),
        pytest.param(
            edited('"169.254.77.2"', '"192.168.1.2"'),
            "workstations.1.thunderbolt_address: must be an IPv4 link-local address",
            id="not link-local",
        ),
        pytest.param(
            edited("[candidate]", '[ssh]\nstrict_host_key_checking = "no"\n\n[candidate]'),
            "ssh.strict_host_key_checking: value should be 'yes' or 'accept-new' (got 'no')",
            id="strict checking off",
        ),
        pytest.param(
            edited("[candidate]", "[ssh]\ncommand_timeout_seconds = 0\n\n[candidate]"),
            "ssh.command_timeout_seconds: value should be greater than 0 (got 0)",
            id="unbounded commands",
        ),
        pytest.param(
            edited("[candidate]", "[ssh]\ncommand_timeout_seconds = -30\n\n[candidate]"),
            "ssh.command_timeout_seconds: value should be greater than 0 (got -30)",
            id="negative bound",
        ),
        pytest.param(
            edited("[candidate]", "[link]\nexpected_lanes = 4\n\n[candidate]"),
            "link.expected_lanes: value should be 1 or 2 (got 4)",
            id="bad lanes",
        ),
        pytest.param(
            edited('user = "sglang"', 'user = "sglang"\ndist_init_port = 30000'),
            "serving: port and dist_init_port must differ",
            id="port clash",
        ),
        pytest.param(
            edited("[gateway_roles.large]",
                   '[gateway_roles]\nlisten_address = "gw0.lab"\n\n[gateway_roles.large]'),
            "gateway_roles.listen_address: value is not a valid IPv4 or IPv6 address",
            id="a name to listen on",
        ),
        pytest.param(
            edited('name = "gw0"', 'name = "ws0"'),
            "(top level): host names must be distinct, got ws0, ws1, ws0",
            id="duplicate host",
        ),
        pytest.param(
            edited("[gateway_roles.large]\n", '[gateway_roles.large]\napi_key_env = "LARGE_KEY"'
                   '\napi_key_file = "/etc/twinbolt/large_key"\n'),
            "gateway_roles.large: set api_key_env or api_key_file, not both",
            id="two key sources",
        ),
        pytest.param(
            edited("[gateway_roles.large]", "[gateway_roles]\nrouter_port = 4000\n\n"
                   "[gateway_roles.large]"),
            "gateway_roles: router_port, litellm_port, litellm_backend_port must all differ",
            id="gateway port clash",
        ),
        pytest.param(
            edited('ssh_port = 1\nthunderbolt_address = "169.254.77.2"',
                   'ssh_port = 70000\nthunderbolt_address = "169.254.77.2"'),
            "workstations.1.ssh_port: value should be less than or equal to 65535 (got 70000)",
            id="port out of range",
        ),
        pytest.param(
            edited('user = "sglang"', 'user = "sglang"\nmin_sglang_version = "0.5.x"'),
            "serving.min_sglang_version: String should match pattern",
            id="bad version",
        ),
        pytest.param(
            MINIMAL_SITE + '\n[ledger]\npath = "records/a\\nb.jsonl"\n',
            "ledger.path: holds the control character(s) '\\n'",
            id="path on two lines",
        ),
        pytest.param(
            edited("[candidate]", "[link]\nprefix_length = 31\n\n[candidate]"),
            "link.prefix_length: value should be less than or equal to 30 (got 31)",
            id="prefix too long",
        ),
        pytest.param(
            edited('user = "sglang"', 'user = "sglang"\nmem_fraction_static = 1.0'),
            "serving.mem_fraction_static: value should be less than 1 (got 1.0)",
            id="whole memory",
        ),
    ],
)
def test_a_bad_value_names_its_key_and_what_is_allowed(write_site, text, expected):
    (line,) = problems(write_site(text))
    assert line.startswith(expected)


def test_nvfp4_is_refused_and_modelopt_fp4_offered(write_site):
    (line,) = problems(
        write_site(edited('user = "sglang"', 'user = "sglang"\nquantization = "nvfp4"'))
    )
    assert "'modelopt_fp4'" in line
    assert line.endswith("(got 'nvfp4')")


@pytest.mark.parametrize("quantization", ["marlin", "humming"])
def test_a_quantization_some_supported_release_accepts_is_a_valid_site(write_site, quantization):
    # marlin only before SGLang 0.5.20, humming only from 0.5.16: the preflight
    # judges it against the release installed (operations/site/releases.py).
    site = load_site(write_site(edited('user = "sglang"',
                                       f'user = "sglang"\nquantization = "{quantization}"')))
    assert site.serving.quantization == quantization


def test_every_problem_is_reported_at_once(write_site):
    text = edited('served_model_name = "qwen"', "served_model_name = 7")
    lines = problems(write_site(text.replace("[gateway]\n", "[gateway]\nport = 2\n")))
    assert [line.split(":")[0] for line in lines] == ["gateway.port", "serving.served_model_name"]


def test_exactly_two_workstations(write_site):
    third = (
        '[[workstations]]\nname = "ws2"\nssh_hostname = "x"\nthunderbolt_address = "169.254.77.3"\n'
    )
    (line,) = problems(write_site(edited("[gateway]", third + "\n[gateway]")))
    assert line == ("workstations: must be exactly 2, not 3: the Thunderbolt link is one cable, "
                    "and a cable has two ends")


def test_one_workstation_is_refused_for_the_same_reason(write_site):
    ws1 = ('[[workstations]]\nname = "ws1"\nssh_hostname = "127.0.0.1"\nssh_port = 1\n'
           'thunderbolt_address = "169.254.77.2"\n')
    (line,) = problems(write_site(edited(ws1, "")))
    assert line == ("workstations: must be exactly 2, not 1: the Thunderbolt link is one cable, "
                    "and a cable has two ends")


def test_each_workstation_knows_its_group_from_the_site(write_site):
    # The group's size is the site's count of workstations; rank 0 (listed first)
    # holds the rendezvous; a host's peer is every other workstation, one cable's.
    hosts = load_site(write_site()).workstation_hosts()
    group = {name: (data["rank"], data["tp_size"], data["thunderbolt_address"],
                    data["rank0_thunderbolt_address"], data["peer_thunderbolt_address"])
             for name, data in hosts}
    assert group == {
        "ws0": (0, 2, "169.254.77.1", "169.254.77.1", "169.254.77.2"),
        "ws1": (1, 2, "169.254.77.2", "169.254.77.1", "169.254.77.1"),
    }


def test_two_workstations_with_one_link_address_are_refused(write_site):
    # Otherwise the peer proof would be answered by the host itself.
    text = edited('thunderbolt_address = "169.254.77.2"', 'thunderbolt_address = "169.254.77.1"')
    (line,) = problems(write_site(text))
    assert "the workstations' thunderbolt_address values must differ" in line


def test_a_non_root_user_without_sudo_is_refused_naming_the_fix(write_site):
    text = edited('name = "gw0"\n', 'name = "gw0"\nssh_user = "ops"\n')
    (line,) = problems(write_site(text))
    assert line.startswith("gateway: ssh_user 'ops' is not root, and twinbolt needs root")
    assert "set sudo = true and give ops passwordless sudo on the host" in line


def test_a_non_root_user_with_sudo_runs_pyinfra_and_twinbolt_under_sudo(write_site):
    text = edited('name = "ws0"\n', 'name = "ws0"\nssh_user = "ops"\nsudo = true\n')
    site = load_site(write_site(text))
    hosts = dict(site.workstation_hosts())
    assert (hosts["ws0"]["ssh_user"], hosts["ws0"]["sudo"], hosts["ws0"]["_sudo"]) == (
        "ops", True, True)
    # Without sudo neither key is written: a false _sudo would override `pyinfra --sudo`.
    assert "sudo" not in hosts["ws1"] and "_sudo" not in hosts["ws1"]


def test_sudo_as_root_is_pointless_but_accepted(write_site):
    site = load_site(write_site(edited('name = "gw0"\n', 'name = "gw0"\nsudo = true\n')))
    assert dict(site.gateway_hosts())["gw0"]["_sudo"] is True


@pytest.fixture
def sudo_calls(tmp_path, monkeypatch) -> Path:
    """A ``sudo`` first on ``PATH``: it logs its arguments to the returned file, runs the rest."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sudo-calls"
    sudo = bin_dir / "sudo"
    sudo.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n'
                    'while [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
    sudo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_pyinfra_runs_a_sudo_hosts_operations_and_facts_under_sudo(write_site, sudo_calls):
    # The site's host data, on pyinfra's local connector: pyinfra itself turns
    # _sudo into `sudo -H -n` for each operation's commands and each fact.
    text = edited('name = "ws0"\n', 'name = "ws0"\nssh_user = "ops"\nsudo = true\n')
    data = dict(load_site(write_site(text)).workstation_hosts())["ws0"]
    state = State(Inventory(([("@local", data)], {})), Config())
    connect_all(state)
    host = state.inventory.get_host("@local")
    add_op(state, server.shell, commands=["echo operation"])
    run_ops(state)
    with ctx_state.use(state), ctx_host.use(host):
        assert host.get_fact(Command, command="echo fact") == "fact"
    assert sudo_calls.read_text().splitlines() == ["-H -n sh -c echo operation",
                                                    "-H -n sh -c echo fact"]


def test_a_missing_local_file_is_refused_at_load_with_its_key_host_and_path(write_site, tmp_path,
                                                                          candidate_module):
    site = write_site(edited('name = "ws1"\n', 'name = "ws1"\nssh_key = "keys/ws1"\n')
                      + '\n[ssh]\nknown_hosts_file = "known_hosts"\n')
    (tmp_path / "modules" / "thunderbolt_net.ko").unlink()
    assert problems(site) == [
        f"workstations.1.ssh_key (host ws1): no such file: {tmp_path / 'keys' / 'ws1'} "
        "(got 'keys/ws1')",
        f"ssh.known_hosts_file: no such file: {tmp_path / 'known_hosts'} (got 'known_hosts')",
        f"candidate.path: no such file: {tmp_path / 'modules' / 'thunderbolt_net.ko'} "
        "(got 'modules/thunderbolt_net.ko')",
    ]
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "ws1").write_text("a key\n")
    (tmp_path / "known_hosts").mkdir()
    (tmp_path / "modules" / "thunderbolt_net.ko").write_bytes(candidate_module)
    assert problems(site) == [
        f"ssh.known_hosts_file: no such file: {tmp_path / 'known_hosts'} (it is not a regular "
        "file) (got 'known_hosts')"]


def test_a_gateway_key_names_the_gateway(write_site):
    site = write_site(edited('name = "gw0"\n', 'name = "gw0"\nssh_key = "/nonexistent/key"\n'))
    assert problems(site) == [
        "gateway.ssh_key (host gw0): no such file: /nonexistent/key (got '/nonexistent/key')"]


# Values no unit, run script, ssh_config or command line can carry: refused at load


@pytest.mark.parametrize(("old", "new", "expected"), [
    pytest.param('user = "sglang"', 'user = "sglang\\nAmbientCapabilities=CAP_SYS_ADMIN"',
                 "serving.user: is not an account name", id="user newline"),
    pytest.param('user = "sglang"', 'user = "sglang"\nworking_directory = '
                 '"/srv\\nExecStartPre=+/usr/bin/id"',
                 "serving.working_directory: holds the control character(s) '\\n'",
                 id="working directory newline"),
    pytest.param('user = "sglang"', 'user = "sglang"\nworking_directory = "srv"',
                 "serving.working_directory: must be an absolute path", id="relative directory"),
    pytest.param('model_path = "/srv/models/qwen"', 'model_path = "/srv/models\\nqwen"',
                 "serving.model_path: holds the control character(s) '\\n'",
                 id="model path newline"),
    pytest.param('model_path = "/srv/models/qwen"', 'model_path = "--trust-remote-code"',
                 "serving.model_path: starts with '-'", id="model path option"),
    pytest.param('served_model_name = "qwen"', 'served_model_name = "qwen\\nExecStartPre=/bin/id"',
                 "serving.served_model_name: holds the control character(s) '\\n'",
                 id="served model name newline"),
    pytest.param('served_model_name = "qwen"', 'served_model_name = "-h"',
                 "serving.served_model_name: starts with '-'", id="served model name option"),
    pytest.param('python = "/opt/sglang/bin/python"', 'python = "python3"',
                 "serving.python: must be an absolute path", id="python on PATH"),
    pytest.param('name = "gw0"', 'name = "-oProxyCommand=id"',
                 "gateway.name: is not a host name", id="host name option"),
    pytest.param('name = "gw0"\nssh_hostname = "127.0.0.1"',
                 'name = "gw0"\nssh_hostname = "-oProxyCommand=touch /tmp/x"',
                 "gateway.ssh_hostname: is not a host name", id="hostname option"),
    pytest.param('name = "gw0"\nssh_hostname = "127.0.0.1"',
                 'name = "gw0"\nssh_hostname = "fe80::1%eth0"',
                 "gateway.ssh_hostname: is not a host name", id="hostname token"),
    pytest.param('name = "gw0"\nssh_hostname = "127.0.0.1"',
                 'name = "gw0"\nssh_hostname = "gw\\n  ProxyCommand id"',
                 "gateway.ssh_hostname: is not a host name", id="hostname newline"),
    pytest.param('name = "gw0"', 'name = "gw0"\nssh_user = "%r"\nsudo = true',
                 "gateway.ssh_user: is not an account name", id="ssh user token"),
    pytest.param("[gateway_roles.large]",
                 '[gateway_roles]\nlitellm_user = "lite llm"\n\n[gateway_roles.large]',
                 "gateway_roles.litellm_user: is not an account name",
                 id="gateway user blank"),
    pytest.param("[gateway_roles.large]",
                 '[gateway_roles]\nmaster_key_file = "key"\n\n[gateway_roles.large]',
                 "gateway_roles.master_key_file: must be an absolute path", id="relative key"),
    pytest.param('served_model_name = "large"',
                 'served_model_name = "large"\napi_key_env = "LITELLM_MASTER_KEY"',
                 "gateway_roles.large: api_key_env must not be LITELLM_MASTER_KEY",
                 id="master key to the backend"),
    pytest.param('served_model_name = "large"',
                 'served_model_name = "large"\napi_key_env = "KEY; id"',
                 "gateway_roles.large.api_key_env: is not an environment variable",
                 id="key variable not a name"),
    pytest.param("[candidate]", '[link]\ninterface = "-v"\n\n[candidate]',
                 "link.interface: is not a network interface", id="interface"),
    pytest.param('served_model_name = "large"', 'served_model_name = "large\\tx"',
                 "gateway_roles.large.served_model_name: holds the control character(s) '\\t'",
                 id="tab in free text"),
])
def test_a_value_that_would_be_read_as_syntax_is_refused_at_load(write_site, old, new, expected):
    (line,) = problems(write_site(edited(old, new)))
    assert line.startswith(expected), line


def test_a_local_path_with_a_newline_is_refused_at_load(write_site):
    (line,) = problems(write_site(edited('path = "modules/thunderbolt_net.ko"',
                                         'path = "modules/x\\nProxyCommand id"')))
    assert line.startswith("candidate.path: ") and "control character" in line, line


def test_every_accepted_hostile_value_renders_into_the_real_units_and_scripts(write_site):
    # Blanks, %, $, quotes and backslashes are not refused: each format quotes them.
    # Every service a run builds is built here from the site's own host data, so a
    # value the site accepts cannot fail a later step's pattern with the replicas down.
    from operations.gateway import proxy as gateway
    from operations.services import render
    from operations.serving import router as serving_router
    from operations.serving import sglang as serving
    from operations.states import STATES

    site = load_site(write_site(MINIMAL_SITE.replace(
        'model_path = "/srv/models/qwen"', 'model_path = "/srv/my models/100% $HOME \\"q\\""'
    ).replace('served_model_name = "qwen"', 'served_model_name = "qwen 100% $x \\\\ y"'
    ).replace('user = "sglang"', 'user = "sglang"\nworking_directory = "/srv/a b/%h"'
    ).replace("[gateway_roles.large]", '[gateway_roles]\nlitellm_venv = "/opt/lite llm/%i"\n'
              'master_key_file = "/etc/key $1"\n\n[gateway_roles.large]')))

    class Data(dict):
        def __getattr__(self, key):
            return self.get(key)

    def host(name, data):
        return type("Host", (), {"name": name, "data": Data(data)})()

    workstations = [host(name, data) for name, data in site.workstation_hosts()]
    the_gateway = host(*site.gateway_hosts()[0])
    sglang = serving.Sglang.from_host(workstations[0])
    router = serving_router.Router.from_hosts(the_gateway, workstations)
    proxy = gateway.Proxy.from_host(the_gateway, router.served_model_name, router.url,
                                    router.api_key_file)
    built = [serving.replica_service(sglang), serving_router.router_service(router),
             gateway.proxy_service(proxy),
             *(serving.tp_rank_service(sglang, state.speculative) for state in STATES.values())]
    for service in built:
        for init_system in ("systemd", "runit"):
            rendered = render(service, init_system)
            assert rendered.count("\n") == render(service.model_copy(update={
                "description": "x", "command": ["/x"], "working_directory": "/"}),
                init_system).count("\n"), (service.name, init_system)
    unit = render(serving.replica_service(sglang), "systemd")
    assert "WorkingDirectory=/srv/a b/%%h\n" in unit
    assert '"/srv/my models/100%% $$HOME \\"q\\""' in unit
    assert "qwen 100%% $x \\ y" in unit
    assert '"LITELLM_MASTER_KEY=/etc/key $$1"' in render(gateway.proxy_service(proxy), "systemd")


def test_a_workstation_names_where_sglang_listens_every_address_by_default(write_site):
    hosts = dict(load_site(write_site(edited(
        'ssh_port = 1\nthunderbolt_address = "169.254.77.2"',
        'ssh_port = 1\nthunderbolt_address = "169.254.77.2"\nlisten_address = "10.0.0.12"',
    ))).workstation_hosts())
    assert hosts["ws0"]["serving_listen_address"] == "0.0.0.0"
    assert hosts["ws1"]["serving_listen_address"] == "10.0.0.12"
    (line,) = problems(write_site(edited('thunderbolt_address = "169.254.77.2"',
                                         'thunderbolt_address = "169.254.77.2"\n'
                                         'listen_address = "ws1.lan"')))
    assert line.startswith("workstations.1.listen_address: value is not a valid IPv4 or IPv6")


def test_a_sha256_is_compared_in_lowercase_as_sha256sum_prints_it(write_site):
    pinned = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    site = load_site(write_site(edited(pinned, pinned.upper())))
    assert site.candidate.sha256 == pinned


# Issue 44: bad input that was a traceback, or silently taken.


def test_a_site_file_that_is_not_utf8_is_one_line_naming_it(write_site):
    site = write_site()
    site.write_bytes(MINIMAL_SITE.replace('"qwen"', '"qw\xe9n"').encode("latin-1"))
    (line,) = problems(site)
    assert line.startswith("not UTF-8 text, as TOML must be: byte 0xe9 at offset ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            edited("[candidate]", "[ssh]\ncommand_timeout_seconds = true\n\n[candidate]"),
            "ssh.command_timeout_seconds: value should be a valid integer (got True)",
            id="true as a bound"),
        pytest.param(
            edited("[candidate]", "[link]\nexpected_lanes = true\n\n[candidate]"),
            "link.expected_lanes: must be a number, not true or false (got True)",
            id="true as lanes"),
        pytest.param(
            edited('user = "sglang"', 'user = "sglang"\nport = true'),
            "serving.port: value should be a valid integer (got True)", id="true as a port"),
        pytest.param(
            edited("[candidate]", "[link]\nexpected_rate_gbps = true\n\n[candidate]"),
            "link.expected_rate_gbps: value should be a valid number (got True)",
            id="true as a rate"),
        pytest.param(
            edited("[candidate]", "[link]\nexpected_rate_gbps = inf\n\n[candidate]"),
            "link.expected_rate_gbps: value should be a finite number (got inf)",
            id="an infinite rate"),
        pytest.param(
            edited("[candidate]", "[ssh]\ncommand_timeout_seconds = 86401\n\n[candidate]"),
            "ssh.command_timeout_seconds: value should be less than or equal to 86400 "
            "(got 86401)", id="a bound above a day"),
        pytest.param(
            edited("[candidate]", "[link]\nwait_seconds = 100000000\n\n[candidate]"),
            "link.wait_seconds: value should be less than or equal to 86400", id="a long wait"),
        pytest.param(
            edited('user = "sglang"', 'user = "sglang"\nstart_timeout_seconds = 1e20'),
            "serving.start_timeout_seconds: value should be a valid integer",
            id="a start that never times out"),
        pytest.param(
            edited('"169.254.77.2"', '"169.254.78.2"').replace(
                "[candidate]", "[link]\nprefix_length = 24\n\n[candidate]", 1),
            "(top level): the workstations' thunderbolt_address values must be in one network "
            "of link.prefix_length 24: 169.254.78.2 is not in 169.254.77.0/24",
            id="two networks"),
        pytest.param(
            edited('"169.254.77.2"', '"169.254.77.3"').replace(
                "[candidate]", "[link]\nprefix_length = 30\n\n[candidate]", 1),
            "(top level): thunderbolt_address 169.254.77.3 is the network or broadcast address "
            "of 169.254.77.0/30", id="a broadcast address"),
    ],
)
def test_a_number_that_is_no_number_or_no_bound_is_refused(write_site, text, expected):
    (line,) = problems(write_site(text))
    assert line.startswith(expected), line


def test_link_addresses_in_one_network_of_the_prefix_pass(write_site):
    site = load_site(write_site(edited("[candidate]", "[link]\nprefix_length = 24\n\n[candidate]")))
    assert site.link.prefix_length == 24


# The candidate is a thunderbolt_net module (issue 44): checked when the site loads


def compressed(tool: list[str], data: bytes) -> bytes:
    return subprocess.run(tool, input=data, capture_output=True, check=True).stdout


def with_candidate(write_site, name: str, data: bytes) -> Path:
    """The minimal site, naming ``modules/<name>`` holding ``data`` as its candidate."""
    site = write_site(edited('path = "modules/thunderbolt_net.ko"', f'path = "modules/{name}"'))
    (site.parent / "modules" / name).write_bytes(data)
    return site


@pytest.mark.parametrize(("name", "tool"), [
    ("thunderbolt_net.ko", None), ("thunderbolt_net.ko.zst", ["zstd", "-q", "-c"]),
    ("thunderbolt_net.ko.xz", ["xz", "-c"]), ("thunderbolt_net.ko.gz", ["gzip", "-c"])])
def test_a_candidate_module_plain_or_compressed_loads(write_site, candidate_module, name,
                                                      tool) -> None:
    data = compressed(tool, candidate_module) if tool else candidate_module
    site = load_site(with_candidate(write_site, name, data))
    assert site.candidate.path.name == name


def built(tmp_path: Path, source: str, *flags: str) -> bytes:
    """``source`` compiled by gcc (``-c``: an ELF relocatable object, as a module is)."""
    (tmp_path / "built.c").write_text(source)
    subprocess.run(["gcc", *flags, str(tmp_path / "built.c"), "-o", str(tmp_path / "built")],
                   check=True)
    return (tmp_path / "built").read_bytes()


MODINFO = ('static const char info[] __attribute__((section(".modinfo"), used)) = '
           '"license=GPL\\0name={name}\\0";\n')


def test_a_candidate_that_is_no_thunderbolt_net_module_is_one_line_naming_what_it_is(
        write_site, tmp_path, candidate_module) -> None:
    path = tmp_path / "modules"
    cases = {
        "notes.txt": (b"a text file\n", "not an ELF file: it begins b'a text file\\n'"),
        "other.ko": (built(tmp_path, MODINFO.format(name="e1000e"), "-c"),
                     "its .modinfo names the module 'e1000e'"),
        "nameless.ko": (built(tmp_path, 'static const char info[] __attribute__(('
                              'section(".modinfo"), used)) = "license=GPL";\n', "-c"),
                        "its .modinfo names no module (no name= entry)"),
        "plain.o": (built(tmp_path, "int plain;\n", "-c"),
                    "an ELF relocatable object with no .modinfo section: no kernel module"),
        "program": (built(tmp_path, "int main(void) { return 0; }\n", "-no-pie"),
                    "an ELF file of type ET_EXEC, not a relocatable object (ET_REL), as a "
                    "kernel module is"),
        "truncated.ko": (candidate_module[:64], "a malformed ELF file"),
        # A .ko.zst holding something else is what it holds, decompressed.
        "text.ko.zst": (compressed(["zstd", "-q", "-c"], b"text\n"),
                        "once decompressed, not an ELF file: it begins b'text\\n'"),
        "broken.ko.xz": (b"\xfd7zXZ\x00 cut short", "compressed data that does not decompress"),
    }
    for name, (data, found) in cases.items():
        (line,) = problems(with_candidate(write_site, name, data))
        assert line.startswith(f"candidate.path: {path / name} is not a thunderbolt_net kernel "
                               f"module: {found}"), line
        assert line.endswith(f"(got 'modules/{name}')"), line


def test_a_candidate_override_is_checked_as_the_site_files_would_be(tmp_path) -> None:
    text = tmp_path / "thunderbolt_net.ko.zst"
    text.write_text("not compressed, not a module\n")
    with pytest.raises(BadOverride, match=f"--data candidate_path: {text} is not a "
                       "thunderbolt_net kernel module: not an ELF file"):
        overrides.check({"candidate_path": str(text)})


# Issue 49: a site of pairs. The one-pair form above is the pair "a".

TWO_PAIRS_SITE = (Path(__file__).parent / "two_pairs_site.toml").read_text()
# The [[pairs]] tables alone, to edit.
PAIRS = TWO_PAIRS_SITE[:TWO_PAIRS_SITE.index("[gateway]")]
WSD_ADDRESS = ('name = "wsd"\nssh_hostname = "10.0.0.15"\nssh_port = 1\n'
               'thunderbolt_address = "169.254.77.2"')


def pairs_site(pairs: str = PAIRS) -> str:
    """The minimal site with its [[workstations]] replaced by ``pairs``."""
    return pairs + MINIMAL_SITE[MINIMAL_SITE.index("[gateway]"):]


def test_a_site_of_two_pairs_gives_each_workstation_its_own_pairs_group(write_site):
    # Each cable is a network of its own: both pairs may use the same addresses.
    site = load_site(write_site(pairs_site()))
    # A pair's group holds the gateway too: --limit pair_b reaches it, as every run must.
    assert site.pair_groups() == {"pair_a": ["wsa", "wsb", "gw0"], "pair_b": ["wsc", "wsd", "gw0"]}
    group = {name: (data["pair"], data["rank"], data["tp_size"], data["thunderbolt_address"],
                    data["rank0_thunderbolt_address"], data["peer_thunderbolt_address"])
             for name, data in site.workstation_hosts()}
    assert group == {
        "wsa": ("a", 0, 2, "169.254.77.1", "169.254.77.1", "169.254.77.2"),
        "wsb": ("a", 1, 2, "169.254.77.2", "169.254.77.1", "169.254.77.1"),
        "wsc": ("b", 0, 2, "169.254.77.1", "169.254.77.1", "169.254.77.2"),
        "wsd": ("b", 1, 2, "169.254.77.2", "169.254.77.1", "169.254.77.1"),
    }
    assert dict(site.workstation_hosts())["wsd"]["ssh_hostname"] == "10.0.0.15"
    assert pairs_site() == TWO_PAIRS_SITE


def test_the_one_pair_form_is_the_pair_a(write_site):
    site = load_site(write_site())
    assert site.pair_groups() == {"pair_a": ["ws0", "ws1", "gw0"]}
    assert {data["pair"] for _, data in site.workstation_hosts()} == {"a"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(pairs_site(PAIRS + MINIMAL_SITE[:MINIMAL_SITE.index("[gateway]")]),
                     "(top level): give the workstations as [[pairs]] or, for a site of one "
                     "pair, as [[workstations]]: not both", id="both forms"),
        pytest.param(pairs_site(""), "(top level): no workstations: give [[pairs]], each with its "
                     "two [[pairs.workstations]], or for a site of one pair its two "
                     "[[workstations]]", id="neither form"),
        pytest.param(pairs_site(PAIRS.replace('name = "b"', 'name = "a"')),
                     "pairs: pair names must be distinct, got a, a", id="one name twice"),
        pytest.param(pairs_site(PAIRS.replace('name = "b"', 'name = "B-2"')),
                     "pairs.1.name: String should match pattern '^[a-z][a-z0-9]{0,15}$' "
                     "(got 'B-2')", id="a name no group can carry"),
        pytest.param(pairs_site(PAIRS.replace('"wsd"', '"wsa"')),
                     "(top level): host names must be distinct, got wsa, wsb, wsc, wsa, gw0",
                     id="a host in two pairs"),
        pytest.param(pairs_site(PAIRS.replace(WSD_ADDRESS, WSD_ADDRESS.replace("77.2", "77.1"))),
                     "(top level): pair b: the workstations' thunderbolt_address values must "
                     "differ", id="one address twice in a pair"),
        pytest.param(pairs_site(PAIRS.replace(WSD_ADDRESS, WSD_ADDRESS.replace("77.2", "78.2"))
                                + "\n[link]\nprefix_length = 24\n"),
                     "(top level): pair b: the workstations' thunderbolt_address values must be "
                     "in one network of link.prefix_length 24: 169.254.78.2 is not in "
                     "169.254.77.0/24", id="a pair across two networks"),
        pytest.param(pairs_site(PAIRS.replace('[[pairs.workstations]]\nname = "wsd"\n'
                                              'ssh_hostname = "10.0.0.15"\nssh_port = 1\n'
                                              'thunderbolt_address = "169.254.77.2"\n', "")),
                     "pairs.1.workstations: must be exactly 2, not 1: the Thunderbolt link is "
                     "one cable, and a cable has two ends", id="a pair of one"),
        pytest.param(pairs_site(PAIRS.replace('name = "wsd"\n', 'name = "wsd"\nssh_prot = 1\n')),
                     "pairs.1.workstations.1.ssh_prot: unknown key; allowed here: name, "
                     "ssh_hostname, ssh_user, ssh_port, ssh_key, sudo, thunderbolt_address, "
                     "listen_address", id="a mistyped key in a pair"),
    ],
)
def test_a_bad_site_of_pairs_is_refused_naming_the_pair_and_key(write_site, text, expected):
    assert expected in problems(write_site(text))


def test_a_missing_key_file_of_a_pairs_workstation_names_its_host(write_site, tmp_path):
    text = pairs_site(PAIRS.replace('name = "wsc"\n', 'name = "wsc"\nssh_key = "id_nope"\n'))
    assert problems(write_site(text)) == [
        f"pairs.1.workstations.0.ssh_key (host wsc): no such file: {tmp_path / 'id_nope'} "
        "(got 'id_nope')"]
