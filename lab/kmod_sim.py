"""``insmod``, ``rmmod`` and ``modprobe`` for a kernel without module support.

Installed as those commands inside each lab workstation. They keep the kernel
semantics twinbolt depends on: ``insmod`` ignores unknown parameters and still
loads, refuses a vermagic from another kernel and a module already loaded;
``rmmod`` takes the interface down at once; ``modprobe`` loads the file that
``modinfo -n`` names, compressed or not; with ``sig_enforce`` on, an unsigned
module is refused, as under Secure Boot. Module state lives where the kernel shows it,
``/sys/module/<name>/``; the lab kernel (``lab.kernel``) reacts to it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab import faults
from lab.modules import signed

SYS_MODULE = Path("/sys/module")
KERNEL_LOG = Path("/var/log/kern.log")
TRUE_WORDS = {"y", "Y", "1", "true", "on"}
FALSE_WORDS = {"n", "N", "0", "false", "off"}
# How soon udev loads the module again after an rmmod, under ``udev_autoload``.
AUTOLOAD_SECONDS = 0.1


class ModuleError(Exception):
    """A refusal, worded as kmod words it."""


def kernel_log(message: str) -> None:
    KERNEL_LOG.parent.mkdir(parents=True, exist_ok=True)
    with KERNEL_LOG.open("a") as log:
        log.write(f"{time.strftime('%b %d %H:%M:%S')} kernel: {message}\n")


def modinfo_field(path: str, field: str) -> list[str]:
    out = subprocess.run(
        ["modinfo", "-F", field, path], capture_output=True, text=True, check=True
    )
    return [line for line in out.stdout.splitlines() if line]


# The kernel decompresses a module itself (CONFIG_MODULE_DECOMPRESS); so does insmod.
DECOMPRESS = {".zst": ["zstd", "-dcq"], ".xz": ["xz", "-dc"], ".gz": ["gzip", "-dc"]}


def plain_module(path: str) -> bytes:
    decompress = DECOMPRESS.get(Path(path).suffix)
    if decompress:
        return subprocess.run([*decompress, path], capture_output=True, check=True).stdout
    return Path(path).read_bytes()


def build_id_note(path: str) -> bytes:
    with tempfile.NamedTemporaryFile() as plain, tempfile.NamedTemporaryFile() as note:
        plain.write(plain_module(path))
        plain.flush()
        subprocess.run(
            ["objcopy", "-O", "binary", "--only-section=.note.gnu.build-id", plain.name,
             note.name],
            check=True,
        )
        return Path(note.name).read_bytes()


def signatures_enforced() -> bool:
    enforce = SYS_MODULE / "module" / "parameters" / "sig_enforce"
    return enforce.exists() and enforce.read_text().strip() == "Y"


def interface_down(name: str = "thunderbolt0") -> None:
    subprocess.run(["ip", "link", "set", name, "down"], capture_output=True)


def parse_bool(module: str, key: str, value: str) -> str:
    if value in TRUE_WORDS:
        return "Y"
    if value in FALSE_WORDS:
        return "N"
    kernel_log(f"{module}: '{value}' invalid for parameter '{key}'")
    raise ModuleError("Invalid parameters")


def insmod(path: str, arguments: list[str]) -> None:
    if not Path(path).is_file():
        raise ModuleError(f"could not load module {path}: No such file or directory")
    name = modinfo_field(path, "name")[0]
    vermagic = modinfo_field(path, "vermagic")[0].split()[0]
    if vermagic != os.uname().release:
        kernel_log(f"{name}: version magic '{vermagic}' should be '{os.uname().release}'")
        raise ModuleError(f"could not insert module {path}: Invalid module format")
    if (SYS_MODULE / name).exists():
        raise ModuleError(f"could not insert module {path}: File exists")
    if signatures_enforced() and not signed(plain_module(path)):
        kernel_log(f"{name}: Loading of unsigned module is rejected")
        raise ModuleError(f"could not insert module {path}: Key was rejected by service")
    for dependency in modinfo_field(path, "depends"):
        for needed in filter(None, dependency.split(",")):
            if not (SYS_MODULE / needed).exists():
                kernel_log(f"{name}: Unknown symbol in module ({needed} not loaded)")
                raise ModuleError(f"could not insert module {path}: Unknown symbol in module")

    declared = dict(entry.split(":", 1) for entry in modinfo_field(path, "parmtype"))
    values = {key: "Y" if key == "e2e" else "N" for key in declared}
    for argument in arguments:
        key, _, value = argument.partition("=")
        if key not in declared:
            # The kernel's behaviour that makes a load no proof of a parameter.
            kernel_log(f"{name}: unknown parameter '{key}' ignored")
            continue
        values[key] = parse_bool(name, key, value or "1")

    staging = Path(tempfile.mkdtemp(dir=SYS_MODULE, prefix=f".{name}."))
    (staging / "parameters").mkdir()
    (staging / "notes").mkdir()
    for key, value in values.items():
        (staging / "parameters" / key).write_text(f"{value}\n")
    (staging / "notes" / ".note.gnu.build-id").write_bytes(build_id_note(path))
    (staging / "refcnt").write_text("0\n")
    (staging / "taint").write_text("OE\n")
    (staging / "initstate").write_text("live\n")
    try:
        staging.rename(SYS_MODULE / name)
    except OSError:
        # Another load won the race (udev's, say): the kernel's EEXIST.
        shutil.rmtree(staging)
        raise ModuleError(f"could not insert module {path}: File exists") from None
    kernel_log(f"{name}: loading out-of-tree module taints kernel.")


def rmmod(name: str) -> None:
    name = Path(name).name.removesuffix(".ko").replace("-", "_")
    module = SYS_MODULE / name
    if not module.exists():
        raise ModuleError(f"Module {name} is not currently loaded")
    # The network device goes with the driver; the peer loses carrier at once.
    interface_down()
    shutil.rmtree(module)
    if faults.is_on("udev_autoload", socket.gethostname()):
        # The XDomain hotplug event that follows makes udev load the module again.
        subprocess.Popen(["sh", "-c", f"sleep {AUTOLOAD_SECONDS}; exec modprobe {name}"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)


def modprobe(arguments: list[str]) -> None:
    remove = "-r" in arguments or "--remove" in arguments
    names = [argument for argument in arguments if not argument.startswith("-")]
    if not names:
        raise ModuleError("missing module name")
    name = names[0].replace("-", "_")
    if remove:
        if (SYS_MODULE / name).exists():
            rmmod(name)
        return
    if (SYS_MODULE / name).exists():
        return
    found = subprocess.run(["modinfo", "-n", name], capture_output=True, text=True)
    if found.returncode != 0:
        raise ModuleError(f"Module {name} not found in directory /lib/modules/{os.uname().release}")
    try:
        insmod(found.stdout.strip(), names[1:])
    except ModuleError as error:
        # modprobe, unlike insmod, takes a module loaded meanwhile as done.
        if not str(error).endswith("File exists"):
            raise


def main(argv: list[str]) -> int:
    command, arguments = Path(argv[0]).name, argv[1:]
    try:
        if command == "insmod":
            if not arguments:
                raise ModuleError("missing filename.")
            insmod(arguments[0], arguments[1:])
        elif command == "rmmod":
            for name in arguments:
                rmmod(name)
        elif command == "modprobe":
            modprobe(arguments)
        else:
            raise ModuleError(f"unknown command {command}")
    except ModuleError as error:
        prefix = "modprobe: FATAL:" if command == "modprobe" else f"{command}: ERROR:"
        print(f"{prefix} {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
