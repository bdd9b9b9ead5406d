"""``up`` is idempotent and repairs a stale lab; ``down`` leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab_helpers import lab, ssh

from lab import cable, cgroups, network
from lab.control import processes
from lab.topology import (
    EVERY_HOST,
    OPERATOR,
    OWNER_FILE,
    PYTHON,
    REPO,
    STATE,
    alive,
    host_named,
    hosts,
    read_pid,
)

# What a clone holds that the copy needs: everything tracked, and the operator's venv.
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv*", ".lab", "wheelhouse", "reports",
                                        "__pycache__", ".ruff_cache", ".pytest_cache")


def leftovers() -> list[str]:
    """What any lab, of any pairs, made that is still there."""
    found = [f"netns {h.name}" for h in EVERY_HOST if network.netns_exists(h.name)]
    found += [f"netns {name}" for name in ["tbcable", *(network.parking(h) for h in EVERY_HOST
                                                       if h.workstation)]
              if network.netns_exists(name)]
    found += [f"link {name}" for name in ["tblab0", *(h.management_veth for h in EVERY_HOST)]
              if network.link_exists(name)]
    found += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text()
              .splitlines() if str(STATE) in line or "/run/netns/tb" in line.split()[4]
              or any(f"/run/netns/{h.name}" == line.split()[4] for h in EVERY_HOST)]
    names = [cgroups.cgroup_name(host) for host in EVERY_HOST]
    found += [f"cgroup {name}" for name in cgroups.existing(names)]
    return found


def test_second_up_changes_nothing() -> None:
    pids = {name: read_pid(name) for name in processes()}
    result = lab("up")
    assert result.returncode == 0
    assert "nothing changed" in result.stdout
    assert {name: read_pid(name) for name in processes()} == pids


def test_down_leaves_nothing_then_up_rebuilds_a_stale_lab() -> None:
    pids = [pid for name in processes() if (pid := read_pid(name))]
    for host in hosts():
        pids += network.netns_pids(host.name)
    assert lab("down").returncode == 0
    assert leftovers() == []
    assert not [pid for pid in pids if alive(pid)]
    assert lab("down").returncode == 0, "down on a lab that is already down must succeed"

    assert lab("up").returncode == 0
    # A session ends: its processes die, its namespaces survive.
    for name in processes():
        os.kill(read_pid(name), signal.SIGKILL)
    for host in hosts():
        for pid in network.netns_pids(host.name):
            # A host's processes die with its PID 1: some are gone before their turn.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    stale = lab("status")
    assert stale.returncode == 3
    assert "kernel: not running" in stale.stdout, stale.stdout
    rebuilt = lab("up")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "stale" in rebuilt.stdout
    assert ssh("wsa", "cat /sys/module/thunderbolt_net/parameters/e2e").stdout.strip() == "Y"
    assert lab("status").returncode == 0


def test_a_wake_that_finds_no_lab_kernel_says_so_and_up_repairs_it() -> None:
    """
    The lab kernel is what retrains the link: a ``suspend`` whose wait for the link
    meets a dead kernel names it, instead of timing out on a carrier nothing raises.
    """
    assert lab("up").returncode == 0
    sleeping = subprocess.Popen([str(PYTHON), "-m", "lab", "suspend", "wsb", "--seconds", "2"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not cable.suspend_marker(host_named("wsb")).exists():
            assert sleeping.poll() is None, sleeping.communicate()
            time.sleep(0.05)
        os.kill(read_pid("kernel"), signal.SIGKILL)
        _, said = sleeping.communicate(timeout=60)
    finally:
        sleeping.kill()
    assert sleeping.returncode == 1
    assert "the lab kernel is not running" in said and "run `python -m lab up`" in said, said
    stale = lab("status")
    assert stale.returncode == 3 and "kernel: not running" in stale.stdout, stale.stdout
    assert lab("up").returncode == 0
    assert "kernel: ticking" in lab("status").stdout


def test_up_rebuilds_a_lab_whose_hosts_lost_their_own_accounts() -> None:
    """
    As after ``apt install`` of a package that adds a system user on the machine:
    its adduser renames a new /etc/passwd over the old one, which detaches the
    hosts' own copy; here the mount is taken away directly.
    """
    wsa = read_pid("host-wsa")
    # umount(8) refuses this bind mount of a file ("No such file or directory");
    # the system call itself is what the kernel does to it.
    detach = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
              "assert libc.umount2(b'/etc/passwd', 0) == 0, os.strerror(ctypes.get_errno())")
    subprocess.run(["nsenter", "-t", str(wsa), "-m", sys.executable, "-c", detach], check=True)
    assert ssh("wsa", f"getent passwd {OPERATOR}", check=False).stdout == ""
    assert lab("status").returncode == 3
    rebuilt = lab("up")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "unmounted" in rebuilt.stdout
    assert ssh("wsa", f"getent passwd {OPERATOR}").stdout.startswith(f"{OPERATOR}:")
    assert lab("status").returncode == 0


def test_reboot_empties_run_kills_the_hosts_processes_and_boots_on_the_stock_driver() -> None:
    ssh("wsb", "mkdir -p /run/twinbolt && touch /run/twinbolt/lock")
    ssh("wsb", "rmmod thunderbolt_net; modprobe thunderbolt_net")
    ssh("wsb", "sleep 600 >/dev/null 2>&1 &")
    others = {host.name: read_pid(f"host-{host.name}") for host in hosts() if host.name != "wsb"}
    rebooted = lab("reboot", "wsb")
    assert rebooted.returncode == 0, rebooted.stderr
    assert "wsb rebooted" in rebooted.stdout
    # Its pids are its own PID namespace's under systemd: look from the machine's side.
    assert not any(Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00600\x00"
                   for pid in network.netns_pids("wsb")), "a process outlived the reboot"
    assert ssh("wsb", "ls -A /run/twinbolt 2>/dev/null; true").stdout.strip() == ""
    assert ssh("wsb", "cat /sys/module/thunderbolt_net/initstate").stdout.strip() == "live"
    assert ssh("wsb", "test -e /sys/module/thunderbolt_net/parameters/tx_e2e",
               check=False).returncode == 1
    # Only wsb rebooted.
    assert {name: read_pid(f"host-{name}") for name in others} == others
    assert lab("status").returncode == 0


def test_reboot_of_an_unknown_host_is_refused() -> None:
    refused = lab("reboot", "wsc")
    assert refused.returncode == 2 and "invalid choice: 'wsc'" in refused.stderr


@contextmanager
def checkout_under_tmp() -> Iterator[Path]:
    """
    A copy of the checkout where a quick try lands: under /tmp, in a directory
    whose name has a space, reached through a symlink. Yields the symlink.
    """
    directory = Path(tempfile.mkdtemp(prefix="twinbolt try "))
    copy = directory / "checkout"
    shutil.copytree(REPO, copy, symlinks=True, ignore=NOT_IN_A_CLONE)
    # A venv of its own, as a clone has: a link to this checkout's would reach
    # through a path the host's own /tmp hides when this checkout is under /tmp too.
    shutil.copytree(REPO / ".venv", copy / ".venv", symlinks=True)
    link = Path(tempfile.mkdtemp(prefix="twinbolt-link-")) / "twinbolt"
    link.symlink_to(copy)
    try:
        yield link
    finally:
        lab("down", checkout=link)
        shutil.rmtree(link.parent)
        shutil.rmtree(directory)
        assert lab("up").returncode == 0


def test_the_lab_boots_from_a_checkout_under_tmp_and_says_why_a_host_did_not() -> None:
    assert lab("up").returncode == 0
    ours = read_pid("kernel")
    with checkout_under_tmp() as checkout:
        state = checkout.resolve() / ".lab"
        up = lab("up", checkout=checkout)
        assert up.returncode == 0, up.stdout + up.stderr
        # The lab is the machine's: the copy rebuilt it, and stopped the kernel this
        # checkout had started, by this checkout's pid file.
        assert "stale" in up.stdout
        assert not alive(ours), f"this checkout's lab kernel (pid {ours}) ticks on"
        assert OWNER_FILE.read_text().strip() == str(state)
        assert lab("status", checkout=checkout).returncode == 0
        config = state / "ssh" / "config"
        # The gateway's backend is a unit that runs the copy's interpreter from its path.
        assert ssh("gw", "systemctl is-active lab-large", config=config).stdout.strip() == "active"
        assert ssh("wsa", "cat /sys/module/thunderbolt_net/parameters/e2e",
                   config=config).stdout.strip() == "Y"

        # A host whose boot cannot mount its own /var/log: one message, at once.
        shutil.rmtree(state / "hosts" / "wsb" / "var-log")
        failed = lab("reboot", "wsb", checkout=checkout)
        assert failed.returncode == 1
        source = state / "hosts" / "wsb" / "var-log"
        first, *rest = failed.stderr.splitlines()
        assert first == (f'lab: wsb did not boot: step "mount --bind \'{source}\' /var/log" '
                         f"failed: mount: /var/log: special device {source} does not exist.")
        assert "  the end of its log:" in rest
        assert "    lab host booting: wsb (systemd)" in rest
        assert f"  the whole log: {state / 'logs' / 'host-wsb.log'}" in rest
        # Failed when its init died, not when the wait for sshd ran out.
        assert "did not answer" not in failed.stderr
        rebuilt = lab("up", checkout=checkout)
        assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
        assert ssh("wsb", "test -d /var/log", config=config).returncode == 0
        theirs = read_pid("kernel", state)
        # And back: this checkout's `up` stops the copy's kernel as the copy stopped its.
        assert lab("up").returncode == 0
        assert not alive(theirs), f"the copy's lab kernel (pid {theirs}) ticks on"
        assert OWNER_FILE.read_text().strip() == str(STATE)
