"""
The lab as a site the inventory reads: its hosts' data, as ``inventory.py`` gives
it to pyinfra, written by ``up`` to the lab's state directory
(:mod:`operations.site.listing`). The inventory reads that file and imports
nothing of the lab: the code a real site runs has no lab in it.
"""

from __future__ import annotations

from pathlib import Path

from lab.topology import GATEWAY, SGLANG_KEYS, STATE, LabHost, LabPair, lab_pairs
from operations.site.listing import LISTING_NAME, Listing, write_listing
from operations.site.model import pair_group, sudo_data, tp_group_data

SSH_PORT = 22


def listing(pairs: tuple[LabPair, ...], state: Path = STATE) -> Listing:
    """The inventory of a lab of ``pairs`` whose files are in ``state``."""
    candidate = state / "modules" / "candidate" / "thunderbolt_net.ko"
    checksum = candidate.with_name(candidate.name + ".sha256")

    # As on a real site, some hosts are reached as an unprivileged admin account
    # with passwordless sudo (the lab's `twinbolt`, a real sudoers entry), one as root.
    def ssh(host: LabHost) -> dict[str, object]:
        return {
            "ssh_hostname": host.management_address,
            "ssh_user": host.ssh_user,
            "ssh_port": SSH_PORT,
            "ssh_key": str(state / "ssh" / "id_ed25519"),
            "ssh_known_hosts_file": str(state / "ssh" / "known_hosts"),
            "ssh_strict_host_key_checking": "yes",
            **sudo_data(host.ssh_user != "root"),
        }

    def workstation(pair: LabPair, rank: int, host: LabHost) -> dict[str, object]:
        links = [str(member.link_address) for member in pair.workstations]
        return {
            **ssh(host),
            **tp_group_data(pair.name, links, rank),
            "candidate_path": str(candidate),
            "ledger_path": str(state / "ledger.jsonl"),
            **{f"serving_{name}": str(state / path.relative_to(STATE))
               for name, path in SGLANG_KEYS.items()},
            # Until the lab has built the candidate there is no checksum; the
            # driver layer reports that, the inventory must still load.
            "candidate_sha256": (next(iter(checksum.read_text().split()), None)
                                 if checksum.exists() else None),
        }

    hosts = [host for pair in pairs for host in pair.workstations]
    return Listing.model_validate({
        "workstations": [(host.name, workstation(pair, rank, host))
                         for pair in pairs for rank, host in enumerate(pair.workstations)],
        "gateway": [(GATEWAY.name, ssh(GATEWAY))],
        "pairs": {pair_group(pair.name): [*(host.name for host in pair.workstations),
                                          GATEWAY.name] for pair in pairs},
        "extra": ("lab", [*(host.name for host in hosts), GATEWAY.name]),
    })


def write(pairs: tuple[LabPair, ...] | None = None, state: Path = STATE) -> Path:
    """Write the inventory of the lab's pairs (those `up` recorded) where inventory.py reads it."""
    path = state / LISTING_NAME
    write_listing(path, listing(pairs or lab_pairs(), state))
    return path
