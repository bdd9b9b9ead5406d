"""
The hosts: a real site when ``TWINBOLT_SITE`` names a site file, else the embedded lab.

Groups: ``workstations`` (rank 0 first) and ``gateway``; the lab's hosts are also
in ``lab``, defined last so that ``group_data/lab.py`` wins over the
``workstations`` and ``gateway`` defaults (pyinfra applies group data in the
order the groups are defined here).

A site's values arrive as host data (see ``operations/site.py``), so they win
over every ``group_data/`` default. The lab's host data is only what differs
between its hosts; the rest is ``group_data/``.
"""

import os
from pathlib import Path

from operations.attempt import carried_data
from operations.connect import nodelay_data
from operations.site import SITE_ENV, load_site, sudo_data

if os.environ.get(SITE_ENV):
    _site = load_site(os.environ[SITE_ENV])
    workstations = _site.workstation_hosts()
    gateway = _site.gateway_hosts()

else:
    # `python -m lab up` creates these files; the lab's own topology honours the
    # same TWINBOLT_LAB_STATE override.
    _LAB = Path(os.environ.get("TWINBOLT_LAB_STATE", Path(__file__).resolve().parent / ".lab"))
    _CANDIDATE = _LAB / "modules" / "candidate" / "thunderbolt_net.ko"
    _CANDIDATE_SHA256 = _CANDIDATE.with_name(_CANDIDATE.name + ".sha256")

    # As on a real site, some hosts are reached as an unprivileged admin account
    # with passwordless sudo (the lab's `twinbolt`, a real sudoers entry), one as root.
    _OPERATOR = "twinbolt"
    _SSH_PORT = 22

    def _lab_ssh(address: str, user: str = "root") -> dict[str, object]:
        return {
            "ssh_hostname": address,
            "ssh_user": user,
            "ssh_port": _SSH_PORT,
            "ssh_key": str(_LAB / "ssh" / "id_ed25519"),
            "ssh_known_hosts_file": str(_LAB / "ssh" / "known_hosts"),
            "ssh_strict_host_key_checking": "yes",
            **sudo_data(user != "root"),
            **nodelay_data(address, _SSH_PORT),
        }

    def _lab_workstation(rank: int, address: str, link: str, peer_link: str,
                         user: str = "root") -> dict[str, object]:
        return {
            **_lab_ssh(address, user),
            "rank": rank,
            "thunderbolt_address": link,
            "peer_thunderbolt_address": peer_link,
            "candidate_path": str(_CANDIDATE),
            "ledger_path": str(_LAB / "ledger.jsonl"),
            # Until the lab has built the candidate there is no checksum; the
            # driver layer reports that, the inventory must still load.
            "candidate_sha256": (
                next(iter(_CANDIDATE_SHA256.read_text().split()), None)
                if _CANDIDATE_SHA256.exists()
                else None
            ),
        }

    workstations = [
        ("wsa", _lab_workstation(0, "10.66.0.11", "169.254.77.1", "169.254.77.2", _OPERATOR)),
        ("wsb", _lab_workstation(1, "10.66.0.12", "169.254.77.2", "169.254.77.1")),
    ]
    gateway = [("gw", _lab_ssh("10.66.0.13", _OPERATOR))]
    lab = ["wsa", "wsb", "gw"]

# A rollback's --data, carried by the run that started it (operations/attempt.py):
# host data, which wins over group data as --data does.
_carried = carried_data()
workstations = [(name, {**data, **_carried}) for name, data in workstations]
gateway = [(name, {**data, **_carried}) for name, data in gateway]
