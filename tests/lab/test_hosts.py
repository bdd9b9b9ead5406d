"""Each host is its own machine as far as SSH, files and processes are concerned."""

from __future__ import annotations

import os
import socket
import subprocess
from functools import partial
from pathlib import Path

import pytest
from lab_helpers import lab, listening, ssh, wait_until

from lab.ssh import CLIENT_CONFIG
from lab.topology import PYTHON, init_system


def test_every_host_answers_over_ssh_with_its_own_name() -> None:
    for host in ("wsa", "wsb", "gw"):
        assert ssh(host, "hostname").stdout.strip() == host


def test_strict_host_key_checking_rejects_an_unknown_key(tmp_path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    result = subprocess.run(
        ["ssh", "-F", str(CLIENT_CONFIG), "-o", f"UserKnownHostsFile={empty}", "wsa", "true"],
        capture_output=True, text=True, timeout=20)
    assert result.returncode != 0
    assert "Host key verification failed" in result.stderr


def test_hosts_do_not_see_each_others_files() -> None:
    ssh("wsa", "mkdir -p /etc/sv/only-on-wsa /run/twinbolt-test && echo a > /var/lib/only-on-wsa")
    try:
        for host in ("wsb", "gw"):
            assert ssh(host, "test -e /etc/sv/only-on-wsa", check=False).returncode == 1
            assert ssh(host, "test -e /var/lib/only-on-wsa", check=False).returncode == 1
            assert ssh(host, "test -e /run/twinbolt-test", check=False).returncode == 1
    finally:
        ssh("wsa", "rm -rf /etc/sv/only-on-wsa /run/twinbolt-test /var/lib/only-on-wsa")


def test_the_project_and_its_virtualenv_are_visible_on_every_host() -> None:
    for host in ("wsa", "wsb", "gw"):
        ssh(host, f"{PYTHON} -c 'import pyinfra'")


def test_management_traffic_never_uses_the_thunderbolt_link() -> None:
    route = ssh("wsa", "ip route get 10.66.0.12").stdout
    assert "dev eth0" in route and "thunderbolt0" not in route


def test_nvidia_smi_reports_one_rtx_5090_and_the_memory_live_processes_hold() -> None:
    query = "nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader,nounits"

    def used(host: str) -> int:
        name, total, in_use = ssh(host, query).stdout.strip().split(", ")
        assert (name, total) == ("NVIDIA GeForce RTX 5090", "32607")
        return int(in_use)

    before = {host: used(host) for host in ("wsa", "wsb")}
    held = ssh("wsa", "sleep 30 >/dev/null 2>&1 & echo $! ; ").stdout.strip()
    try:
        ssh("wsa", f"echo 2000 > /run/lab-gpu/{held}")
        assert used("wsa") == before["wsa"] + 2000
        assert used("wsb") == before["wsb"], "GPU use leaked to wsb"
    finally:
        ssh("wsa", f"kill {held}")
    assert used("wsa") == before["wsa"], "a dead process must hold no GPU memory"


def test_the_init_system_supervises_services_in_each_host() -> None:
    if init_system() == "systemd":
        ssh("wsb", "printf '[Service]\\nExecStart=/bin/sleep 600\\n' "
                   "> /etc/systemd/system/lab-test.service && systemctl daemon-reload && "
                   "systemctl start lab-test.service")
        stop = ("systemctl stop lab-test.service; rm -f /etc/systemd/system/lab-test.service; "
                "systemctl daemon-reload")
        running = "systemctl is-active lab-test.service"
    else:
        ssh("wsb", "mkdir -p /etc/sv/lab-test && printf '#!/bin/sh\\nexec sleep 600\\n' "
                   "> /etc/sv/lab-test/run && chmod +x /etc/sv/lab-test/run && "
                   "ln -sfn /etc/sv/lab-test /etc/service/lab-test")
        stop = "rm -f /etc/service/lab-test; sv exit /etc/sv/lab-test; rm -rf /etc/sv/lab-test"
        running = "sv status lab-test"
    try:
        wait_until(lambda: ssh("wsb", running, check=False).stdout.startswith(("run:", "active")),
                   timeout=15)
        assert ssh("gw", running, check=False).returncode != 0, "a service leaked to gw"
    finally:
        ssh("wsb", stop, check=False)


def test_a_systemd_host_runs_only_its_own_units_and_leaves_the_machine_alone() -> None:
    """None of the machine's units (systemd-tmpfiles would empty its /tmp) runs in a host."""
    if init_system() != "systemd":
        pytest.skip("the hosts boot runit")
    marker = Path("/tmp") / f"twinbolt-lab-marker-{os.getpid()}"
    marker.write_text("the machine's /tmp\n")
    try:
        assert lab("reboot", "wsb").returncode == 0
        for host in ("wsa", "wsb", "gw"):
            units = set(ssh(host, "systemctl list-units --type=service --state=running "
                                  "--plain --no-legend | cut -d' ' -f1").stdout.split())
            assert units <= {"ssh.service", "systemd-journald.service", "lab-large.service",
                             "sglang-replica.service", "sglang-router.service",
                             "litellm.service", "litellm-front.service"}, (host, units)
            # A failed attempt's TP ranks stay failed on a host not rebooted since:
            # its evidence, which makes that host degraded; nothing else may fail.
            failed = set(ssh(host, "systemctl list-units --state=failed --plain --no-legend "
                                   "| cut -d' ' -f1").stdout.split())
            assert all(unit.startswith("sglang-tp2-rank") for unit in failed), (host, failed)
            assert not (host == "wsb" and failed), failed
            assert (ssh(host, "systemctl is-system-running", check=False).stdout.strip()
                    == ("degraded" if failed else "running")), host
            assert ssh(host, f"test -e {marker}", check=False).returncode != 0, host
        assert marker.exists(), "a lab host emptied the machine's /tmp"
    finally:
        marker.unlink(missing_ok=True)


def test_a_service_bound_to_the_hosts_own_name_is_out_of_the_clients_reach() -> None:
    """
    As on Debian and Ubuntu, a host's own name is 127.0.1.1: what binds that
    name (as the router and the proxy once did) listens on loopback only.
    """
    assert ssh("gw", "getent hosts gw").stdout.split() == ["127.0.1.1", "gw"]
    port = 39123
    for bind, bound, reachable in (("gw", "127.0.1.1", False), ("0.0.0.0", "0.0.0.0", True)):
        server = ssh("gw", f"{PYTHON} -c 'import socket, time; s = socket.create_server("
                           f"(\"{bind}\", {port})); time.sleep(30)' >/dev/null 2>&1 & echo $!")
        pid = server.stdout.strip()
        try:
            wait_until(partial(listening, "gw", bound, port), what=f"a listener on {bound}")
            with socket.socket() as client:
                client.settimeout(5)
                assert (client.connect_ex(("10.66.0.13", port)) == 0) is reachable, bind
        finally:
            ssh("gw", f"kill {pid}", check=False)
