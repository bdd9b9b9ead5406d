"""The lab's own SSH keys, daemon configs and client config, and its SGLang keys.

Nothing here reads or writes ``~/.ssh`` or ``/etc/ssh``: the lab pins each
host's key in a known_hosts file of its own and checks it strictly, so the
project's SSH code runs as it would against a real site.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

from lab.topology import SGLANG_KEYS, STATE, LabHost, hosts
from operations.site.hosts import ssh_config_word

SSH_DIR = STATE / "ssh"
CLIENT_KEY = SSH_DIR / "id_ed25519"
KNOWN_HOSTS = SSH_DIR / "known_hosts"
CLIENT_CONFIG = SSH_DIR / "config"
AUTHORIZED_KEYS = SSH_DIR / "authorized_keys"


def host_key_path(host: LabHost) -> Path:
    return SSH_DIR / "host_keys" / f"{host.name}_ed25519"


def sshd_config_path(host: LabHost) -> Path:
    return SSH_DIR / f"sshd_config.{host.name}"


def _keygen(path: Path, comment: str) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
        )


def sshd_config(host: LabHost) -> str:
    return "\n".join([
        f"ListenAddress {host.management_address}",
        "Port 22",
        f"HostKey {ssh_config_word(str(host_key_path(host)), tokens=False)}",
        "PidFile /run/sshd.pid",
        f"AuthorizedKeysFile {ssh_config_word(str(AUTHORIZED_KEYS))}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # The lab's files live in the checkout, whose modes sshd does not own.
        "StrictModes no",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
        "Subsystem sftp internal-sftp",
        "",
    ])


def client_config() -> str:
    blocks = []
    for host in hosts():
        blocks.append("\n".join([
            f"Host {host.name}",
            f"    HostName {host.management_address}",
            "    User root",
            f"    IdentityFile {ssh_config_word(str(CLIENT_KEY))}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {ssh_config_word(str(KNOWN_HOSTS))}",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    ConnectTimeout 5",
        ]))
    return "\n\n".join(blocks) + "\n"


def known_hosts() -> str:
    lines = []
    for host in hosts():
        key_type, key = host_key_path(host).with_suffix(".pub").read_text().split()[:2]
        lines.append(f"{host.name},{host.management_address} {key_type} {key}")
    return "\n".join(lines) + "\n"


def sglang_keys() -> None:
    """The SGLang servers' keys, made once, as docs/site.md has a site make them."""
    for path in SGLANG_KEYS.values():
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as key:
                key.write(f"sk-{secrets.token_hex(24)}\n")


def prepare() -> None:
    """Create keys once and (re)write every config; idempotent."""
    _keygen(CLIENT_KEY, "twinbolt-lab-operator")
    for host in hosts():
        _keygen(host_key_path(host), f"twinbolt-lab-{host.name}")
        sshd_config_path(host).write_text(sshd_config(host))
    AUTHORIZED_KEYS.write_text(CLIENT_KEY.with_suffix(".pub").read_text())
    KNOWN_HOSTS.write_text(known_hosts())
    CLIENT_CONFIG.write_text(client_config())
    for private in (CLIENT_KEY, *(host_key_path(host) for host in hosts())):
        private.chmod(0o600)
