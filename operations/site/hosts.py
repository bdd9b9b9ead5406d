"""
The inventory's hosts as plain data, for code that is not a pyinfra run: the
testinfra checks and the experiment harness.

It asks pyinfra itself (``pyinfra inventory.py debug-inventory --json``), so
group data, site data and the lab's defaults merge exactly as in a deploy, and
importing pyinfra's CLI (which monkey-patches the process with gevent) stays out
of the caller's process.

The listing reaches no host, so it is bounded as one command is
(:data:`LISTING_TIMEOUT`): an inventory that never loads (a site file on a mount
that stopped answering) ends its caller, non-zero, saying so, instead of holding
a campaign or a verify that has not yet begun. The bound is the site model's
default ``[ssh] command_timeout_seconds``, not the site file's own value: that
value is what the listing reads, and reading the file here first would wait on
that same mount, unbounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from operations.plumbing.probes import stopped_at_bound
from operations.site.model import SITE_ENV, SUDO, Ssh, site_default
from operations.site.syntax import ssh_config_word  # the lab's ssh configs import it from here

REPO = Path(__file__).resolve().parents[2]
# One command's bound, as the site model defaults it (the module's docstring says why).
LISTING_TIMEOUT: int = site_default(Ssh, "command_timeout_seconds")


@dataclass(frozen=True)
class InventoryEntry:
    """One host: its name, its groups, and its merged pyinfra data."""

    name: str
    groups: tuple[str, ...]
    data: dict[str, Any] = field(hash=False)

    @property
    def sudo(self) -> bool:
        """
        Whether commands on this host run under sudo: pyinfra's already do (its
        ``_sudo`` host data), and twinbolt's own must read what they changed.
        """
        return bool(self.data.get(SUDO))


def inventory_entries(repo: Path = REPO,
                      timeout: float = LISTING_TIMEOUT) -> list[InventoryEntry]:
    """
    Every host of ``inventory.py``, in inventory order (rank 0 first), listed
    within ``timeout`` seconds, else a ``TimeoutError`` (which the harness's
    command line reports as it reports an ``OSError``) that names the listing,
    its bound and what to check.
    """
    command = [str(Path(sys.executable).with_name("pyinfra")), "inventory.py",
               "debug-inventory", "--json"]
    try:
        result = subprocess.run(command, cwd=repo, capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        # subprocess.run has killed it.
        raise TimeoutError(stopped_at_bound(
            f"listing the inventory (pyinfra {' '.join(command[1:])})", timeout,
            f"what inventory.py reads: the site file {SITE_ENV} names (its mount), "
            "~/.ssh/config, the lab's state directory; run the listing by hand to see "
            "where it waits")) from None
    if result.returncode != 0:
        raise RuntimeError(f"inventory.py: {result.stderr.strip() or result.stdout.strip()}")
    return [InventoryEntry(host["name"], tuple(host["groups"]), host["data"])
            for host in json.loads(result.stdout)]


def in_group(entries: list[InventoryEntry], group: str) -> list[InventoryEntry]:
    return [entry for entry in entries if group in entry.groups]


def ssh_config(entries: list[InventoryEntry]) -> str:
    """An OpenSSH client config with one block per host, from the inventory's SSH data."""
    blocks = []
    for entry in entries:
        data = entry.data
        lines = [
            f"Host {ssh_config_word(entry.name, tokens=False)}",
            f"    HostName {ssh_config_word(str(data['ssh_hostname']))}",
            f"    User {ssh_config_word(str(data.get('ssh_user') or 'root'))}",
            f"    Port {data.get('ssh_port') or 22}",
            "    BatchMode yes",
            "    ConnectTimeout 5",
            f"    StrictHostKeyChecking {data.get('ssh_strict_host_key_checking') or 'yes'}",
        ]
        if data.get("ssh_key"):
            lines += [f"    IdentityFile {ssh_config_word(str(data['ssh_key']))}",
                      "    IdentitiesOnly yes"]
        if data.get("ssh_known_hosts_file"):
            lines.append("    UserKnownHostsFile "
                         + ssh_config_word(str(data["ssh_known_hosts_file"])))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
