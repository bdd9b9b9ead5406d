"""
The end-to-end helpers' own logic, without a lab: reading pyinfra's printed
tables, and the refused-run snapshot (what it watches, and that it sees a
rewritten file, a replaced secret and a restarted service).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from e2e_helpers import (  # noqa: E402
    Asked,
    Watched,
    parse_snapshot,
    part,
    pyinfra_table,
    refusals,
    reported_changes,
    snapshot_command,
    watched,
)

from lab.topology import init_system  # noqa: E402
from operations.services import rendered_path  # noqa: E402
from operations.site.hosts import InventoryEntry, inventory_entries  # noqa: E402

SAMPLES = Path(__file__).resolve().parent / "pyinfra_output"

# The end of what a real `pyinfra -y inventory.py deploy.py --data state=production`
# printed on the lab (/tmp/prod1.log, pyinfra 3.10), a run that started the
# replicas and the router and removed the fallback: four operations changed hosts.
RESULTS = (SAMPLES / "results_production.txt").read_text()

# What `pyinfra ... --dry` (no -y) prints: pyinfra_cli.prints.print_meta's table,
# laid out by pyinfra 3.10's own print_rows (its output for these rows, verbatim).
PLAN_WITH_CHANGES = (SAMPLES / "dry_plan_with_changes.txt").read_text()

PLAN_CONVERGED = (SAMPLES / "dry_plan_converged.txt").read_text()


def test_the_results_table_of_a_real_run_names_the_operations_that_changed_hosts() -> None:
    rows = pyinfra_table(RESULTS, "Results:")
    assert len(rows) == 24
    assert rows[0] == {"Operation": "Lock: no other run holds these hosts", "Hosts": "3",
                       "Success": "-", "Error": "-", "No Change": "3"}
    assert rows[-1]["Operation"] == "Grand total" and rows[-1]["Success"] == "6"
    assert reported_changes(rows) == {
        "Serving: the replicas run": {"Success": "2"},
        "Serving: each replica serves a real completion": {"Success": "2"},
        "Serving: the router fronts the replicas": {"Success": "1"},
        "Gateway: the temporary fallback is removed": {"Success": "1"},
    }


def test_a_plan_table_names_each_host_that_would_change() -> None:
    rows = pyinfra_table(PLAN_WITH_CHANGES, "Detected changes:")
    assert [row["Operation"] for row in rows] == [
        "Lock: no other run holds these hosts", "Serving: the replicas run",
        "Gateway: the temporary fallback is removed", "Conclusion: the attempt succeeded"]
    assert reported_changes(rows) == {
        "Serving: the replicas run": {"Change": "2 (wsa, wsb)"},
        "Gateway: the temporary fallback is removed": {"Conditional Change": "1 (gw)"},
    }


def test_a_converged_plan_has_rows_and_no_change() -> None:
    rows = pyinfra_table(PLAN_CONVERGED, "Detected changes:")
    assert len(rows) == 3
    assert reported_changes(rows) == {}


def test_the_last_table_is_read_and_colour_is_ignored() -> None:
    coloured = PLAN_CONVERGED.replace("Serving: the replicas run ",
                                      "\x1b[1mServing: the replicas run\x1b[0m ")
    rows = pyinfra_table(PLAN_WITH_CHANGES + coloured, "Detected changes:")
    assert len(rows) == 3 and reported_changes(rows) == {}


@pytest.mark.parametrize("output", [
    "--> Skipping change detection\n--> Beginning operation run...\n",
    '{"plan": [], "results": null}\n',
    "",
])
def test_no_table_is_an_error_never_an_empty_plan(output: str) -> None:
    with pytest.raises(AssertionError, match="pyinfra printed no '--> Detected changes:'"):
        pyinfra_table(output, "Detected changes:")


# What the snapshot watches


@pytest.fixture(scope="module")
def lab_hosts(lab_state: Path) -> dict[str, InventoryEntry]:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("TWINBOLT_SITE", "TWINBOLT_LAB_STATE")}
    environment["TWINBOLT_LAB_STATE"] = str(lab_state)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment)
    try:
        return {entry.name: entry for entry in inventory_entries()}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_lab_gateway_snapshot_watches_the_files_the_inventory_names(lab_hosts) -> None:
    gw = watched(lab_hosts["gw"])
    # group_data/lab.py keeps them in /var/lib/twinbolt, not /etc/twinbolt.
    assert "/var/lib/twinbolt/litellm.yaml" in gw.files
    secrets = ("/var/lib/twinbolt/litellm_small_key", "/var/lib/twinbolt/litellm_master_key",
               "/var/lib/twinbolt/router_control_key", "/var/lib/twinbolt/router_worker_key")
    assert gw.secrets == secrets
    assert not set(secrets) & set(gw.files)
    assert {"/run/twinbolt", "/var/lib/twinbolt"} <= set(gw.directories)
    init = init_system()  # the lab's hosts boot systemd unless `lab up --init runit`
    assert {rendered_path("sglang-router", init), rendered_path("litellm", init)} <= set(gw.files)
    assert gw.services == (("sglang-router", init), ("litellm", init), ("litellm-front", init))
    assert gw.module is None


def test_a_lab_workstation_snapshot_watches_its_servers_and_driver_only(lab_hosts) -> None:
    for name in ("wsa", "wsb"):
        ws = watched(lab_hosts[name])
        init = init_system()
        assert ws.services == (("sglang-replica", init), ("sglang-tp2-rank0", init),
                               ("sglang-tp2-rank1", init))
        assert ws.module == "thunderbolt_net"
        assert "/run/twinbolt" in ws.directories
        # Its keys' file is watched as a secret; the operator's key files are not its own.
        assert ws.secrets == ("/var/lib/twinbolt/sglang_keys.yaml",)
        # The lab's group data reaches every lab host; the gateway's files are not here.
        assert not any("litellm" in path for path in (*ws.files, *ws.secrets, *ws.directories))
        # ssh_key and ssh_known_hosts_file are paths on the operator's machine.
        assert not any(".lab/ssh" in path for path in (*ws.files, *ws.directories))


def test_a_site_gateway_watches_its_etc_twinbolt_files() -> None:
    entry = InventoryEntry("gw", ("gateway",), {
        "run_dir": "/run/twinbolt", "gateway_roles_init_system": "systemd",
        "gateway_roles_litellm_config_file": "/etc/twinbolt/litellm.yaml",
        "gateway_roles_master_key_file": "/etc/twinbolt/litellm_master_key",
        "gateway_roles_large_api_key_file": "/etc/twinbolt/large_key",
        "gateway_roles_litellm_venv": "/opt/twinbolt/litellm",
        "ssh_known_hosts_file": "/home/ana/.ssh/known_hosts",
    })
    gw = watched(entry)
    assert gw.secrets == ("/etc/twinbolt/large_key", "/etc/twinbolt/litellm_master_key")
    assert gw.files == ("/etc/twinbolt/litellm.yaml", "/etc/systemd/system/sglang-router.service",
                        "/etc/systemd/system/litellm.service",
                        "/etc/systemd/system/litellm-front.service")
    assert gw.directories == ("/etc/twinbolt", "/run/twinbolt")
    assert gw.venvs == ("/opt/twinbolt/litellm",)


# The snapshot's commands, run here on files of the test's own


def take(what: Watched, env: dict[str, str] | None = None) -> dict[str, str]:
    result = subprocess.run(["sh", "-c", snapshot_command(what)], capture_output=True,
                            text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    return parse_snapshot("here", result.stdout)


def test_a_rewritten_file_or_a_replaced_secret_changes_the_snapshot(tmp_path: Path) -> None:
    config, key = tmp_path / "litellm.yaml", tmp_path / "litellm_master_key"
    config.write_text("model_list: []\n")
    key.write_text("sk-secret\n")
    what = Watched(files=(str(config), str(tmp_path / "absent")), secrets=(str(key),),
                   directories=(str(tmp_path),), venvs=(), services=(),
                   module="twinbolt_no_such_module")
    before = take(what)
    assert take(what) == before
    assert before[f"here: file {tmp_path}/absent"] == "missing"
    # The secret is watched by its metadata: its content is nowhere in the snapshot.
    assert "sk-secret" not in str(before)
    assert subprocess.run(["sha256sum", str(key)], capture_output=True, text=True
                          ).stdout.split()[0] not in str(before)

    config.write_text("model_list: [changed]\n")
    after = take(what)
    assert after[f"here: file {config}"] != before[f"here: file {config}"]

    # The same key written anew (as master_key_command does: a new file, then mv).
    replaced = tmp_path / "litellm_master_key.new"
    replaced.write_text("sk-secret\n")
    replaced.rename(key)
    assert take(what)[f"here: secret {key}"] != after[f"here: secret {key}"]


def test_a_restarted_service_changes_the_snapshot(tmp_path: Path) -> None:
    """The service's main pid and start time, through stand-ins for ``sv`` and ``systemctl``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "pid"
    (bin_dir / "sv").write_text(
        f'#!/bin/sh\necho "run: $2: (pid $(cat {pid_file})) 12s"\n')
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        f'case "$*" in *MainPID*) cat {pid_file};; *ActiveState*) echo active;; '
        "*) echo enabled;; esac\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def started(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]

    for init in ("runit", "systemd"):
        what = Watched(files=(), secrets=(), directories=(), venvs=(),
                       services=(("sglang-replica", init),), module=None)
        first = subprocess.Popen(["sleep", "60"])
        try:
            pid_file.write_text(f"{first.pid}\n")
            before = take(what, env)["here: service sglang-replica"]
            assert f"pid {first.pid} started {started(first.pid)}," in before
            assert take(what, env)["here: service sglang-replica"] == before
        finally:
            first.kill()
            first.wait()
        time.sleep(0.02)  # a later start, even if the pid were reused
        second = subprocess.Popen(["sleep", "60"])
        try:
            pid_file.write_text(f"{second.pid}\n")
            assert take(what, env)["here: service sglang-replica"] != before
        finally:
            second.kill()
            second.wait()


def test_an_incomplete_snapshot_is_an_error() -> None:
    with pytest.raises(AssertionError, match="did not complete"):
        parse_snapshot("gw", "file /x\tmissing\n")
    assert part("echo $1", "a b") == "sh -c 'echo $1' - 'a b'"


OK = Asked(0.0, 200, "small-router", 0.2)
REFUSED = Asked(1.0, None, "ConnectError: [Errno 111] Connection refused", 0.01)
RESET = Asked(2.0, None, "ReadError: [Errno 104] Connection reset by peer", 0.07)
ERROR = Asked(3.0, 500, "", 0.3)
SLOW = Asked(4.0, 200, "small-router", 6.0)


@pytest.mark.parametrize(("answers", "failed"), [
    ([OK, OK], []),
    ([OK, REFUSED], [REFUSED]),
    ([OK, ERROR], [ERROR]),
    ([OK, SLOW], [SLOW]),
    # The front sends again what a retiring worker closed: a reset is a failure.
    ([OK, RESET], [RESET]),
    ([RESET, OK, REFUSED], [RESET, REFUSED]),
], ids=["answered", "refused", "error", "slow", "reset", "reset-and-refused"])
def test_a_users_failures_are_every_refusal_reset_error_and_slow_answer(
        answers: list[Asked], failed: list[Asked]) -> None:
    assert refusals(answers) == failed
