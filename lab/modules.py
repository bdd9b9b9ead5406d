"""Kernel module files the real ``modinfo``, ``depmod`` and ``readelf`` accept.

This kernel has no module support, so the lab's ``thunderbolt_net`` builds are
relocatable ELF objects that carry only what the tools read: a ``.modinfo``
section (name, vermagic, parameters) and a GNU build-id. The stock build
declares the upstream ``e2e`` parameter; the candidate also declares ``tx_e2e``.
The stock file is installed zstd-compressed, as Ubuntu 24.04 installs it: the
real ``modinfo`` reads it (Debian's kmod links libzstd), ``readelf`` does not.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from lab.topology import MODULE_NAME, STATE, STOCK_MODULE_RELPATH

MODULES = STATE / "modules"
CANDIDATE = MODULES / "candidate" / f"{MODULE_NAME}.ko"
STOCK = MODULES / "stock" / f"{MODULE_NAME}.ko"

_E2E_PARM = "e2e:USB4NET full end-to-end flow control (default: true)"
_TX_E2E_PARM = "tx_e2e:USB4NET end-to-end flow control on the TX ring (default: false)"


def kernel_release() -> str:
    return os.uname().release


def _modinfo_fields(variant: str) -> list[str]:
    fields = [
        "license=GPL",
        "description=Thunderbolt/USB4 network driver",
        f"vermagic={kernel_release()} SMP preempt mod_unload modversions",
        f"name={MODULE_NAME}",
        "depends=thunderbolt",
        f"parm={_E2E_PARM}",
        "parmtype=e2e:bool",
    ]
    if variant == "candidate":
        fields += [f"parm={_TX_E2E_PARM}", "parmtype=tx_e2e:bool"]
    # Distinct code per variant gives each build its own build-id.
    fields.append(f"lab_variant={variant}")
    return fields


def _c_source(fields: list[str]) -> str:
    body = "".join(f'"{field}\\0"' for field in fields)
    return (
        "static const char lab_modinfo[] "
        '__attribute__((section(".modinfo"), used, aligned(1))) = '
        f"{body};\n"
    )


# A distribution signs its modules; ``scripts/sign-file`` appends the signature,
# a ``struct module_signature`` and this mark. The lab's stock build carries an
# empty one, enough for the kernel's check that a signature is there; the
# candidate, like an out-of-tree build, carries none.
SIGNATURE_TRAILER = bytes([0, 0, 2, 0, 0, 0, 0, 0]) + bytes(4) + b"~Module signature appended~\n"


def signed(data: bytes) -> bool:
    return data.endswith(SIGNATURE_TRAILER[-28:])


def build(variant: str, destination: Path) -> Path:
    """Compile one variant into ``destination`` (stock or candidate)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / f"{MODULE_NAME}.c"
        obj = Path(scratch) / f"{MODULE_NAME}.o"
        source.write_text(_c_source(_modinfo_fields(variant)))
        subprocess.run(["gcc", "-c", str(source), "-o", str(obj)], check=True)
        subprocess.run(
            ["ld", "-r", "--build-id=sha1", str(obj), "-o", str(destination)], check=True
        )
    if variant == "stock":
        destination.write_bytes(destination.read_bytes() + SIGNATURE_TRAILER)
    return destination


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_all() -> None:
    """Build the stock and candidate files once per kernel release and recipe (this file)."""
    stamp = MODULES / "release"
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    if stamp.exists() and stamp.read_text() == f"{kernel_release()} {recipe}" \
            and CANDIDATE.exists():
        return
    build("stock", STOCK)
    build("candidate", CANDIDATE)
    CANDIDATE.with_name(CANDIDATE.name + ".sha256").write_text(sha256(CANDIDATE) + "\n")
    stamp.write_text(f"{kernel_release()} {recipe}")


def install_stock(lib_modules: Path) -> None:
    """Lay the distribution's file and its modules.dep into a host's /lib/modules."""
    release_dir = lib_modules / kernel_release()
    target = release_dir / STOCK_MODULE_RELPATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(subprocess.run(["zstd", "-q", "-c", str(STOCK)], check=True,
                                      capture_output=True).stdout)
    (release_dir / "modules.order").write_text(f"{STOCK_MODULE_RELPATH}\n")
    for index in ("modules.builtin", "modules.builtin.modinfo"):
        (release_dir / index).touch()
    # depmod -b wants BASE/lib/modules/RELEASE; the host's directory is that tree.
    base = lib_modules.parent.parent
    subprocess.run(["depmod", "-b", str(base), kernel_release()], check=True)


def build_id(path: Path) -> str:
    """The GNU build-id of a module file, as ``readelf -n`` prints it."""
    out = subprocess.run(["readelf", "-n", str(path)], check=True, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if "Build ID:" in line:
            return line.split("Build ID:")[1].strip()
    raise ValueError(f"{path} has no GNU build-id note")
