"""``--data`` overrides of site keys: checked as the site file's values, before any change."""

import pytest

from operations import overrides
from operations.overrides import BadOverride
from operations.site import COMMAND_TIMEOUT, load_site
from operations.site import tp_group_data as tp_group

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
        # Not site keys: the runbook's and pyinfra's own.
        "state": "tp2_e2e", "on_failure": "stop", "force_candidate": "yes",
        "_sudo_password": "secret",
    })


def test_every_key_a_site_gives_its_hosts_is_checked(write_site) -> None:
    """A site key added to a model is checked as an override with no other edit."""
    site = load_site(write_site())
    published = {key for _, data in (*site.workstation_hosts(), *site.gateway_hosts())
                 for key in data}
    # Derived from the site's values, not keys of it: the TP group, sudo, the connection.
    derived = {*tp_group(["169.254.1.1", "169.254.1.2"], 0), "sudo", "_sudo",
               "ssh_paramiko_connect_kwargs"}
    assert published - derived <= set(overrides.site_fields())
