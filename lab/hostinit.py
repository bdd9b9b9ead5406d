"""The first process of a lab host: its private mounts, sshd, then runit.

Started by ``lab up`` inside the host's network namespace and a fresh mount and
UTS namespace; it becomes ``runsvdir``, so the host lives exactly as long as
this process, and every SSH session sees the host's own files.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from lab.ssh import sshd_config_path
from lab.topology import LINK_INTERFACE, LabHost, host_named


def private_mounts(host: LabHost) -> list[tuple[Path, str]]:
    """The host's own directories, bind-mounted over the real paths."""
    mounts = [
        (host.root / "hosts", "/etc/hosts"),
        (host.root / "etc" / "passwd", "/etc/passwd"),
        (host.root / "etc" / "group", "/etc/group"),
        (host.root / "etc" / "shadow", "/etc/shadow"),
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


def mount(*arguments: str) -> None:
    subprocess.run(["mount", *arguments], check=True)


def boot(host: LabHost) -> None:
    socket.sethostname(host.name)
    mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
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
    subprocess.run(
        ["/usr/sbin/sshd", "-f", str(sshd_config_path(host)), "-E", "/var/log/sshd.log"],
        check=True,
    )
    os.execv("/usr/bin/runsvdir", ["runsvdir", "-P", "/etc/service"])


if __name__ == "__main__":
    boot(host_named(sys.argv[1]))
