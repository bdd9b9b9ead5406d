"""
``--data`` items, checked before any change: a site key's as the site file's value,
a run option's, and no other key.
"""

from dataclasses import fields
from pathlib import Path

import pytest

from operations.site import options, overrides
from operations.site.model import COMMAND_TIMEOUT, load_site
from operations.site.model import tp_group_data as tp_group
from operations.site.overrides import BadOverride

# Hostile values, one per kind, and what the refusal says of each.
HOSTILE = {
    "serving_user": ("root", "--data serving_user: must not be root"),
    "serving_working_directory": (
        "/srv\nExecStartPre=+/usr/bin/id",
        "--data serving_working_directory: holds the control character(s) '\\n'"),
    "gateway_roles_litellm_user": ("litellm\nAmbientCapabilities=CAP_SYS_ADMIN",
                                   "--data gateway_roles_litellm_user: is not an account name"),
    "ssh_hostname": ("-oProxyCommand=id", "--data ssh_hostname: is not a host name or address"),
    "serving_model_path": ("--trust-remote-code", "--data serving_model_path:"),
    COMMAND_TIMEOUT: (0, "--data _timeout: value should be greater than 0 (got 0)"),
    "candidate_path": ("/nonexistent/thunderbolt_net.ko",
                       "--data candidate_path: no such file: /nonexistent/thunderbolt_net.ko"),
    "serving_port": (70000, "--data serving_port: value should be less than or equal to 65535"),
}


@pytest.mark.parametrize("key", sorted(HOSTILE))
def test_a_hostile_override_of_a_site_key_is_refused_naming_the_key_and_why(key: str) -> None:
    value, reason = HOSTILE[key]
    with pytest.raises(BadOverride) as refused:
        overrides.check({"state": "tp2_e2e", key: value})
    message = str(refused.value)
    assert message.startswith("refused: ") and reason in message, message
    assert message.endswith("Nothing was changed")


def test_every_bad_override_is_named_at_once() -> None:
    with pytest.raises(BadOverride) as refused:
        overrides.check({key: value for key, (value, _) in HOSTILE.items()})
    assert all(reason in str(refused.value) for _, reason in HOSTILE.values())


def test_the_overrides_the_docs_and_tests_use_pass(tmp_path, candidate_module) -> None:
    module = tmp_path / "thunderbolt_net.ko"
    module.write_bytes(candidate_module)
    overrides.check({
        # pyinfra reads 9.9 as a number: the text as typed is a version.
        "serving_min_sglang_version": 9.9, "candidate_sha256": "ab" * 32,
        "candidate_path": str(module), "ledger_path": str(tmp_path / "ledger.jsonl"),
        "link_address_owner": "system", "link_wait_seconds": 5, "serving_port": 30001,
        COMMAND_TIMEOUT: 60, "gateway_roles_pip_options": ["--no-index"],
        # Not site keys: the run's own options.
        "state": "tp2_e2e", "on_failure": "stop", "force_candidate": "yes",
    })


def test_every_key_a_site_gives_its_hosts_is_checked(write_site) -> None:
    """A site key added to a model is checked as an override with no other edit."""
    site = load_site(write_site())
    published = {key for _, data in (*site.workstation_hosts(), *site.gateway_hosts())
                 for key in data}
    # Derived from the site's values, not keys of it: the TP group, sudo, the connection.
    derived = {*tp_group("a", ["169.254.1.1", "169.254.1.2"], 0), "sudo", "_sudo",
               "ssh_paramiko_connect_kwargs"}
    assert published - derived <= set(overrides.site_fields())


# Issue 44: every --data key is known.

# Keys that are no site key and no run option, and keys of the rollback's own.
UNKNOWN = {
    # The runbook's own host data: / would be staged on and chmod 0700.
    "run_dir": "/", "rank": 7, "thunderbolt_address": "169.254.1.9", "pair": "b",
    # pyinfra's own global arguments, the default of every operation when in host data.
    "_if": "false", "_ignore_errors": True, "_success_exit_codes": [0, 1], "_sudo": True,
    "_sudo_password": "secret", "_chdir": "/tmp",
    # A typo of a site key.
    "serving_prot": 31000,
}


@pytest.mark.parametrize("key", sorted(UNKNOWN))
def test_a_key_that_is_no_site_key_and_no_run_option_is_refused_with_the_options(key) -> None:
    with pytest.raises(BadOverride) as refused:
        overrides.check({"state": "tp2_e2e", key: UNKNOWN[key]})
    message = str(refused.value)
    assert f"--data {key}: no site key, and no run option" in message
    assert "a run option: state, on_failure, force_candidate" in message
    assert "\n" not in message and message.endswith("Nothing was changed")


@pytest.mark.parametrize("key", ["lock_inherited", "lost_hosts"])
def test_the_rollbacks_own_keys_are_refused_from_a_command_line(key) -> None:
    value = {"lock_inherited": "machine=m user=u pid=1", "lost_hosts": ["wsb"]}[key]
    with pytest.raises(BadOverride) as refused:
        overrides.check({"state": "production", key: value})
    assert (f"--data {key}: a rollback's own key, which only the run that starts the rollback "
            "gives it, never a command line") in str(refused.value)


@pytest.mark.parametrize(("data", "reason"), [
    ({"on_failure": "shrug"}, "--data on_failure: value should be 'rollback' or 'stop' "
                              "(got 'shrug')"),
    ({"force_candidate": "no"}, "--data force_candidate: value should be 'yes' (got 'no')"),
    ({"force_candidate": True}, "--data force_candidate: value should be 'yes' (got True)"),
    ({"state": "tp2"}, "--data state: unknown state 'tp2'; the states are: production"),
    ({COMMAND_TIMEOUT: 1e20}, "--data _timeout: value should be a valid integer (got 1e+20)"),
    ({COMMAND_TIMEOUT: 10**18}, "--data _timeout: value should be less than or equal to 86400"),
    ({COMMAND_TIMEOUT: True}, "--data _timeout: value should be a valid integer (got True)"),
])
def test_a_run_options_value_and_a_bound_are_checked(data, reason) -> None:
    with pytest.raises(BadOverride) as refused:
        overrides.check(data)
    assert reason in str(refused.value)


def test_every_bad_item_is_named_in_one_line() -> None:
    with pytest.raises(BadOverride) as refused:
        overrides.check({"run_dir": "/", "on_failure": "shrug", "serving_user": "root",
                         "lock_inherited": "x"})
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert all(f"--data {key}:" in message
               for key in ("run_dir", "on_failure", "serving_user", "lock_inherited"))


def test_the_run_options_are_one_object_read_from_the_data() -> None:
    read = options.RunOptions.read({"state": "tp2_e2e", "force_candidate": "yes",
                                    "serving_port": 31000})
    assert (read.state, read.on_failure, read.forced) == ("tp2_e2e", "rollback", True)
    assert not options.RunOptions.read({"on_failure": "stop"}).forced
    # The ledger's refusal names the option that overrides it.
    assert options.FORCING.partition("=")[0] in options.RUN_OPTIONS


def test_the_rollbacks_own_keys_are_one_object_apart_from_the_run_options() -> None:
    given = {"state": "production", "lock_inherited": "machine=m user=u pid=1",
             "lost_hosts": ["wsb"]}
    carried = options.RollbackKeys.of(given)
    assert (carried.lock_inherited, carried.lost_hosts) == ("machine=m user=u pid=1", ["wsb"])
    assert options.RollbackKeys.of({"state": "production"}) == options.RollbackKeys(None, None)
    assert {field.name for field in fields(options.RollbackKeys)} == set(options.ROLLBACK_KEYS)


# config.py: the same check, and the password options, before pyinfra connects.


@pytest.fixture
def stub_deploy(tmp_path: Path) -> Path:
    """Stands in for deploy.py: it would say so, had it run."""
    deploy = tmp_path / "deploy.py"
    deploy.write_text("print('deploy.py ran')\n")
    return deploy


def before_connecting(result) -> str:
    """The refusal pyinfra printed, once it is sure no host was connected."""
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Connecting" not in output and "deploy.py ran" not in output
    assert "Traceback" not in output
    return output


@pytest.mark.parametrize("data", [("run_dir=/",), ("rank=7",), ("_timeout=1e20",),
                                  ("lock_inherited=machine=m user=u pid=1",)],
                         ids=["run_dir", "rank", "timeout", "lock"])
def test_the_cli_refuses_an_unknown_key_before_connecting(data, stub_deploy, write_site,
                                                          run_pyinfra) -> None:
    key = data[0].partition("=")[0]
    result = run_pyinfra("inventory.py", str(stub_deploy), "--data", "state=tp2_stock",
                         *(part for item in data for part in ("--data", item)), "-y",
                         TWINBOLT_SITE=str(write_site()))
    assert f"refused: --data {key}: " in before_connecting(result)


@pytest.mark.parametrize("option", [("--ssh-password", "hunter2"),
                                    ("--ssh-key-password", "hunter2"),
                                    ("--use-sudo-password",)],
                         ids=["ssh", "key", "sudo"])
def test_a_password_is_refused_where_the_rollback_could_not_log_in(option, stub_deploy,
                                                                   write_site,
                                                                   run_pyinfra) -> None:
    result = run_pyinfra("inventory.py", str(stub_deploy), "--data", "state=tp2_stock", *option,
                         "-y", TWINBOLT_SITE=str(write_site()))
    output = before_connecting(result)
    assert f"refused: {option[0]} with on_failure=rollback" in output
    assert "a key (ssh_key) or an ssh agent (ssh-add)" in output
    assert "--data on_failure=stop" in output
    assert "hunter2" not in output


def test_a_password_is_taken_by_a_run_that_stops_after_a_failure(stub_deploy, write_site,
                                                                  run_pyinfra) -> None:
    result = run_pyinfra("inventory.py", str(stub_deploy), "--data", "state=tp2_stock",
                         "--data", "on_failure=stop", "--ssh-password", "hunter2", "-y",
                         TWINBOLT_SITE=str(write_site()))
    # It goes on to connect (and fails, as nothing listens on the minimal site's port).
    assert "Connecting to hosts" in result.stderr, result.stderr
