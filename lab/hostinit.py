"""The first process of a lab host: its private mounts, then its init system.

Started by ``lab up`` inside the host's network namespace and a fresh mount and
UTS namespace. Under systemd (the default) it is PID 1 of its own PID
namespace too, and becomes ``systemd``, which starts sshd as a unit; under
runit it starts sshd and becomes ``runsvdir``. Either way the host lives
exactly as long as this process, and every SSH session sees the host's own
files.

A systemd host is sealed off from the machine before systemd starts: its own
``/tmp``, ``/var/tmp`` and ``/run``, its own unit directory with the machine's
units and generators hidden (so that no machine service, ``systemd-tmpfiles``
above all, runs inside it), and its own subtrees of the ``name=systemd`` and
unified cgroup hierarchies, which ``lab down`` removes.

Those fresh tmpfs mounts would hide a checkout under ``/tmp``, ``/var/tmp`` or
``/run``, and with it the host's own files and the interpreter it runs. So the
checkout is held open before the first mount and bound back at its own path
after each one that covers it: the host sees the checkout wherever it was cloned.

A step that fails ends the boot with one line, ``boot failed: step "<step>"
failed: <why>``, which ``lab up`` quotes with the end of the host's log.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from lab.cgroups import HIERARCHIES, cgroup_name, mount_source
from lab.hostfs import LAB_TARGET, OPERATOR_ACCOUNT
from lab.ssh import sshd_config_path
from lab.topology import LINK_INTERFACE, REPO, STATE, LabHost, host_named, init_system

SYSTEMD = "/lib/systemd/systemd"


def private_mounts(host: LabHost) -> list[tuple[Path, str]]:
    """The host's own directories, bind-mounted over the real paths."""
    mounts = [
        (host.root / "hosts", "/etc/hosts"),
        (host.root / "hostname", "/etc/hostname"),
        *((host.root / "etc" / name, f"/etc/{name}") for name in OPERATOR_ACCOUNT),
        (host.root / "etc" / "sudoers.d", "/etc/sudoers.d"),
        (host.root / "bashrc", "/root/.bashrc"),
        (host.root / "etc-sv", "/etc/sv"),
        (host.root / "etc-service", "/etc/service"),
        (host.root / "var-log", "/var/log"),
        (host.root / "var-lib", "/var/lib"),
        (host.root / "lib" / "modules", "/lib/modules"),
    ]
    if host.workstation:
        mounts += [
            (host.root / "sys-module", "/sys/module"),
            (host.root / "sys-bus", "/sys/bus"),
            (host.root / "statistics", f"/sys/class/net/{LINK_INTERFACE}/statistics"),
            (host.root / "sbin", "/usr/local/sbin"),
        ]
    return mounts


# The machine's units, generators and presets: none of them is the host's.
MACHINE_SYSTEMD_DIRS = tuple(f"/usr/lib/systemd/{name}" for name in (
    "system", "system-generators", "system-environment-generators", "system-preset",
    "system-shutdown", "system-sleep")) + ("/usr/local/lib/systemd/system",)


BOOTING = "lab host booting:"
BOOT_FAILED = "boot failed:"


class BootFailure(RuntimeError):
    """A boot step failed: which step, and what it said."""

    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f'step "{step}" failed: {reason}')


def mount(*arguments: str, pass_fds: tuple[int, ...] = ()) -> None:
    result = subprocess.run(["mount", *arguments], capture_output=True, text=True,
                            pass_fds=pass_fds)
    if result.returncode != 0:
        raise BootFailure(f"mount {shlex.join(arguments)}", result.stderr.strip())


class Checkout:
    """
    The checkout (and the lab's state directory, when it lives elsewhere), held
    open by a file descriptor, so that it can be bound back at its own path
    after a tmpfs covers it. The kernel resolves ``/proc/self/fd/N`` to the
    directory itself, not to its now hidden name.
    """

    def __init__(self, *paths: Path) -> None:
        self.held = {path: os.open(path, os.O_PATH | os.O_DIRECTORY)
                     for path in sorted(set(paths))}

    def tmpfs(self, target: str, mode: str) -> None:
        """Mount a fresh tmpfs at ``target``, then show the held paths it covers again."""
        mount("-t", "tmpfs", "-o", f"mode={mode}", "tmpfs", target)
        for path, fd in self.held.items():
            if path.is_relative_to(target) and not self.visible(path, fd):
                path.mkdir(parents=True, exist_ok=True)
                # --no-canonicalize: mount(8) would resolve the magic link to the
                # hidden name; the kernel resolves it to the directory.
                mount("--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", str(path),
                      pass_fds=(fd,))

    @staticmethod
    def visible(path: Path, fd: int) -> bool:
        try:
            seen = path.stat()
        except FileNotFoundError:
            return False
        held = os.stat(fd)
        return (seen.st_dev, seen.st_ino) == (held.st_dev, held.st_ino)


def own_cgroups(host: LabHost) -> None:
    """
    Give the host its own subtree of each hierarchy systemd needs, mounted where
    systemd looks (a tmpfs at /sys/fs/cgroup, as in hybrid mode), and enter it.
    """
    staging = Path("/run/lab-cgroup")
    for name in HIERARCHIES:
        root = staging / f"{name}-root"
        root.mkdir(parents=True)
        mount(*mount_source(name), str(root))
        (root / cgroup_name(host)).mkdir(exist_ok=True)
    mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/sys/fs/cgroup")
    for name in HIERARCHIES:
        target = Path("/sys/fs/cgroup") / name
        target.mkdir()
        mount("--bind", str(staging / f"{name}-root" / cgroup_name(host)), str(target))
        subprocess.run(["umount", str(staging / f"{name}-root")], check=True,
                       capture_output=True)
        (target / "cgroup.procs").write_text(f"{os.getpid()}\n")


def seal_for_systemd(host: LabHost, checkout: Checkout) -> None:
    """What systemd must not share with the machine (see the module's docstring)."""
    checkout.tmpfs("/tmp", "1777")
    checkout.tmpfs("/var/tmp", "1777")
    mount("--bind", str(host.root / "etc-systemd"), "/etc/systemd/system")
    for directory in MACHINE_SYSTEMD_DIRS:
        if os.path.isdir(directory):
            mount("--bind", str(host.root / "empty"), directory)
    own_cgroups(host)


def boot(host: LabHost) -> None:
    print(f"{BOOTING} {host.name} ({init_system()})", flush=True)
    checkout = Checkout(REPO, STATE)
    socket.sethostname(host.name)
    checkout.tmpfs("/run", "0755")
    for directory in ("/run/sshd", "/run/lab-gpu"):
        os.makedirs(directory, exist_ok=True)
    for source, target in private_mounts(host):
        if target.startswith("/sys/") and not os.path.isdir(target):
            # No thunderbolt0 while the driver is unloaded: the lab kernel binds its
            # statistics when a load creates it.
            continue
        if source.is_dir():
            # A fresh machine may lack a mount point (this kernel has no /lib/modules).
            os.makedirs(target, exist_ok=True)
        elif not os.path.exists(target):
            # A file needs a file to cover; creating one would touch the machine.
            # Without root's .bashrc there is no cost to hide anyway.
            continue
        mount("--bind", str(source), target)
    if init_system() == "systemd":
        seal_for_systemd(host, checkout)
        # container= tells systemd it is not the machine's init (no hardware, no
        # kernel setup); it starts the lab's target: the journal, sshd, and what
        # is enabled.
        os.execve(SYSTEMD, [SYSTEMD, "--system", f"--unit={LAB_TARGET}"],
                  {"container": "twinbolt-lab", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    sshd = subprocess.run(
        ["/usr/sbin/sshd", "-f", str(sshd_config_path(host)), "-E", "/var/log/sshd.log"],
        capture_output=True, text=True,
    )
    if sshd.returncode != 0:
        raise BootFailure("start sshd", sshd.stderr.strip() or f"exit {sshd.returncode}")
    os.execv("/usr/bin/runsvdir", ["runsvdir", "-P", "/etc/service"])


def main(name: str) -> None:
    try:
        boot(host_named(name))
    except (BootFailure, OSError, subprocess.CalledProcessError) as failure:
        print(f"{BOOT_FAILED} {failure}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
