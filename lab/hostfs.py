"""Each lab host's private files, laid out before the host boots.

A host's ``/etc/sv``, ``/etc/service``, ``/etc/systemd/system``,
``/etc/sudoers.d``, ``/var/log``, ``/var/lib`` and ``/lib/modules`` (and, on
workstations, ``/sys/module``, ``/sys/bus``, the link's statistics and the
simulated commands in ``/usr/local/sbin``) are directories here, and its
``/etc/hosts``, ``/etc/hostname``, ``/etc/passwd``, ``/etc/group``,
``/etc/shadow`` and ``/root/.bashrc`` files here, all bind-mounted by
``lab.hostinit``.

Under systemd a host sees only the units here: the lab's own (its target, the
journal, sshd, the gateway's alternate backend) and those twinbolt installs.
The machine's units and generators are hidden, so booting a host starts none of
the machine's services (``systemd-tmpfiles`` would empty the machine's ``/tmp``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

from lab import faults, modules
from lab.ssh import sshd_config_path
from lab.topology import (
    LARGE_BACKEND_PORT,
    LARGE_BACKEND_SERVICE,
    NHI_SLOT,
    OPERATOR,
    OPERATOR_HOME,
    OPERATOR_UID,
    PYTHON,
    REPO,
    STATE,
    LabHost,
)
from operations.services import unit_quote

SIMULATED_COMMANDS = {
    "insmod": "lab.kmod_sim insmod",
    "rmmod": "lab.kmod_sim rmmod",
    "modprobe": "lab.kmod_sim modprobe",
    "nvidia-smi": "lab.gpu_sim",
}
MODEL_DIRS = {True: ("qwen", "qwen-nextn"), False: ("large",)}
# The weights' config.json and index, which are all of the weights the simulator
# reads: the shape sets what TP2 all-reduces, the size and the KV cache what a
# decode pass reads from GPU memory. The shape is Qwen3-32B's published
# config.json (a dense Qwen of the field's size class; its exact 27B config is
# not at hand). The size is 27e9 parameters in NVFP4: a 4-bit value per weight
# plus an FP8 scale per block of 16, 4.5 bits in all (the checkpoint's unquantized
# embeddings and norms are left out). Neither is fitted to any figure of the
# field report.
MODEL_CONFIG = json.dumps({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 5120,
                           "num_hidden_layers": 64, "num_attention_heads": 64,
                           "num_key_value_heads": 8, "head_dim": 128,
                           "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1}) + "\n"
MODEL_WEIGHT_BYTES = 27_000_000_000 * 9 // 16
MODEL_INDEX = json.dumps({"metadata": {"total_size": MODEL_WEIGHT_BYTES},
                          "weight_map": {}}) + "\n"


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def large_backend_command(host: LabHost) -> list[str]:
    """The gateway's alternate backend: the SGLang simulator serving ``large``."""
    return [str(PYTHON), "-m", "lab.sglang_sim", "--model-path", "/var/lib/models/large",
            "--served-model-name", "large", "--host", host.management_address,
            "--port", str(LARGE_BACKEND_PORT), "--context-length", "262144",
            "--enable-cache-report"]


def large_backend_run_script(host: LabHost) -> str:
    """The alternate backend as a runit run script."""
    return "\n".join(["exec >>/var/log/lab-large.log 2>&1", f"cd {shlex.quote(str(REPO))}",
                      f"export PYTHONPATH={shlex.quote(str(REPO))}",
                      f"exec {shlex.join(large_backend_command(host))}"])


def unit_command(words: list[str]) -> str:
    """A command line as an ``ExecStart=`` takes it, each word quoted by systemd's rules."""
    return " ".join(unit_quote(word) for word in words)


# The targets units name, which on a real host stand for the whole boot; here
# nothing is behind them. multi-user.target is what enabled services want.
STUB_TARGETS = ("sysinit", "basic", "multi-user", "sockets", "timers", "paths", "slices",
                "local-fs", "network", "network-online", "shutdown")
LAB_TARGET = "lab.target"


def systemd_units(host: LabHost) -> dict[str, str]:
    """The unit files a systemd host boots with, by name."""
    units = {
        LAB_TARGET: unit(Unit={"Description": f"The twinbolt lab host {host.name}",
                               "Requires": "systemd-journald.socket ssh.service",
                               "Wants": "multi-user.target",
                               "After": "systemd-journald.socket ssh.service"}),
        # The journal, without the machine's unit's sandboxing (this kernel lacks parts
        # of it) or its /dev/log socket (/dev is the machine's).
        "systemd-journald.socket": unit(
            Unit={"Description": "Journal Socket", "DefaultDependencies": "no"},
            Socket={"ListenDatagram": "/run/systemd/journal/socket",
                    "ListenStream": "/run/systemd/journal/stdout", "PassCredentials": "yes",
                    "Service": "systemd-journald.service", "SocketMode": "0666"}),
        "systemd-journald.service": unit(
            Unit={"Description": "Journal Service", "DefaultDependencies": "no",
                  "Requires": "systemd-journald.socket", "After": "systemd-journald.socket"},
            Service={"Type": "notify", "ExecStart": "/lib/systemd/systemd-journald",
                     "Sockets": "systemd-journald.socket", "Restart": "always",
                     "RuntimeDirectory": "systemd/journal", "RuntimeDirectoryPreserve": "yes",
                     "StandardOutput": "null"}),
        "ssh.service": unit(
            Unit={"Description": "OpenSSH server"},
            Service={"ExecStartPre": "/bin/mkdir -p /run/sshd",
                     "ExecStart": unit_command(["/usr/sbin/sshd", "-D", "-f",
                                                str(sshd_config_path(host)),
                                                "-E", "/var/log/sshd.log"]),
                     "Restart": "on-failure"}),
    }
    for target in STUB_TARGETS:
        units[f"{target}.target"] = unit(Unit={"Description": f"{target} (stands for the boot)"})
    if not host.workstation:
        units[f"{LARGE_BACKEND_SERVICE}.service"] = unit(
            Unit={"Description": "The alternate large backend"},
            Service={"WorkingDirectory": str(REPO).replace("%", "%%"),
                     "Environment": unit_quote(f"PYTHONPATH={REPO}", variables=False),
                     "ExecStart": unit_command(large_backend_command(host)),
                     "StandardOutput": "append:/var/log/lab-large.log",
                     "StandardError": "inherit", "Restart": "on-failure"},
            Install={"WantedBy": "multi-user.target"})
    return units


def unit(**sections: dict[str, str]) -> str:
    return "".join(f"[{name}]\n" + "".join(f"{key}={value}\n" for key, value in body.items())
                   for name, body in sections.items())


def install_units(host: LabHost) -> None:
    directory = host.root / "etc-systemd"
    (directory / "multi-user.target.wants").mkdir(parents=True)
    for name, text in systemd_units(host).items():
        (directory / name).write_text(text)
        if "WantedBy=multi-user.target" in text:
            (directory / "multi-user.target.wants" / name).symlink_to(
                f"/etc/systemd/system/{name}")


# The machine's account files, each host's own copy of which ends with the
# lab's operator: these lines.
OPERATOR_ACCOUNT = {
    "passwd": f"{OPERATOR}:x:{OPERATOR_UID}:{OPERATOR_UID}:twinbolt lab operator:"
              f"{OPERATOR_HOME}:/bin/bash\n",
    "group": f"{OPERATOR}:x:{OPERATOR_UID}:\n",
    # "*": no password to log in with, yet not locked ("!"), so SSH keys work.
    "shadow": f"{OPERATOR}:*:20000:0:99999:7:::\n",
}


def accounts(root: Path) -> None:
    """
    The machine's accounts plus the lab's operator: an unprivileged user whose
    only power is a real sudoers entry, as a site's admin account. Accounts the
    gateway layer creates land in these copies, not in the machine's files.
    """
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    for name, entry in OPERATOR_ACCOUNT.items():
        shutil.copy2(f"/etc/{name}", etc / name)
        with (etc / name).open("a") as file:
            file.write(entry)
    sudoers = etc / "sudoers.d"
    sudoers.mkdir()
    (sudoers / OPERATOR).write_text(f"{OPERATOR} ALL=(ALL) NOPASSWD: ALL\n")
    (sudoers / OPERATOR).chmod(0o440)
    home = root / "var-lib" / Path(OPERATOR_HOME).name
    home.mkdir()
    os.chown(home, OPERATOR_UID, OPERATOR_UID)


# What a rebuilt host keeps, as a real disk keeps it over a reboot: the venvs the
# gateway layer builds from the locks in its private /var/lib (group_data/lab.py),
# a minute's install on this machine. A converge still checks them against the
# locks; tests/e2e/test_gateway_install.py removes them to prove a fresh install.
KEPT_OVER_A_REBUILD = ("var-lib/twinbolt/venvs",)


def prepare(host: LabHost) -> None:
    """
    Lay out a host's files from nothing but :data:`KEPT_OVER_A_REBUILD`: a rebuilt
    host starts as if freshly booted.
    """
    kept = STATE / "kept" / host.name
    shutil.rmtree(kept, ignore_errors=True)
    for path in KEPT_OVER_A_REBUILD:
        if (host.root / path).is_dir():
            (kept / path).parent.mkdir(parents=True, exist_ok=True)
            (host.root / path).rename(kept / path)
    shutil.rmtree(host.root, ignore_errors=True)
    for directory in ("etc-sv", "etc-service", "var-log", "var-lib", "lib/modules"):
        (host.root / directory).mkdir(parents=True)
    for path in KEPT_OVER_A_REBUILD:
        if (kept / path).is_dir():
            (host.root / path).parent.mkdir(parents=True, exist_ok=True)
            (kept / path).rename(host.root / path)
    shutil.rmtree(kept, ignore_errors=True)
    # Debian's and Ubuntu's layout: the host's own name is 127.0.1.1, so a
    # service bound to that name listens on loopback only.
    (host.root / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{host.name}\n"
                                     "::1\tlocalhost ip6-localhost ip6-loopback\n")
    # systemd names its host from this file, not from the UTS name it was given.
    (host.root / "hostname").write_text(f"{host.name}\n")
    (host.root / "empty").mkdir()
    install_units(host)
    # Ubuntu's root .bashrc (from /etc/skel) returns at once unless interactive;
    # bash reads it for every command sshd runs, so this machine's own, which
    # sets up pyenv, would add its cost to every remote command.
    (host.root / "bashrc").write_text("# ~/.bashrc: as /etc/skel/.bashrc begins\n"
                                      "case $- in *i*) ;; *) return;; esac\n")
    accounts(host.root)
    for model in MODEL_DIRS[host.workstation]:
        model_dir = host.root / "var-lib" / "models" / model
        model_dir.mkdir(parents=True)
        (model_dir / "config.json").write_text(MODEL_CONFIG)
        (model_dir / "model.safetensors.index.json").write_text(MODEL_INDEX)
    modules.install_stock(host.root / "lib" / "modules")
    if host.workstation:
        (host.root / "sys-module" / "thunderbolt").mkdir(parents=True)
        (host.root / "sys-module" / "thunderbolt" / "initstate").write_text("live\n")
        faults.signature_enforcement(host.root, faults.is_on("sig_enforce", host.name))
        (host.root / "sys-bus" / "thunderbolt" / "devices").mkdir(parents=True)
        nhi = host.root / "sys-bus" / "pci" / "devices" / NHI_SLOT
        (nhi / "domain0").mkdir(parents=True)
        (host.root / "sys-bus" / "thunderbolt" / "devices" / "domain0").symlink_to(
            f"../../pci/devices/{NHI_SLOT}/domain0")
        (host.root / "statistics").mkdir()
        for command, module in SIMULATED_COMMANDS.items():
            _script(host.root / "sbin" / command,
                    f"PYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(str(PYTHON))} "
                    f'-m {module} "$@"')
    else:
        service = host.root / "etc-sv" / LARGE_BACKEND_SERVICE
        _script(service / "run", large_backend_run_script(host))
        (host.root / "etc-service" / LARGE_BACKEND_SERVICE).symlink_to(
            f"/etc/sv/{LARGE_BACKEND_SERVICE}")
