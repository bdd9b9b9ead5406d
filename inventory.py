"""
The hosts: a real site when ``TWINBOLT_SITE`` names a site file, else the embedded lab.

Groups: ``workstations`` (every pair's, pair by pair, rank 0 first in each),
``gateway``, and each pair's own, ``pair_<name>``, which holds the gateway too
(``--limit pair_b`` moves pair b and the gateway); the
lab's hosts are also in ``lab``, defined last so that ``group_data/lab.py`` wins
over the ``workstations`` and ``gateway`` defaults (pyinfra applies group data
in the order the groups are defined here).

A site's values arrive as host data (see ``operations/site/model.py``), so they win
over every ``group_data/`` default. The lab's host data is only what differs
between its hosts; the rest is ``group_data/``.
"""

import os
from pathlib import Path

import pyinfra
from pyinfra.api.exceptions import PyinfraError

# pyinfra reads config.py (the state and --data checks, the signal handling)
# from the current directory only: a run started elsewhere would go without them.
# Checked before twinbolt's own imports, which only the checkout's directory finds.
_CHECKOUT = Path(__file__).resolve().parent
if pyinfra.state.cwd and Path(pyinfra.state.cwd).resolve() != _CHECKOUT:
    raise PyinfraError(
        f"run pyinfra from twinbolt's checkout: it reads config.py (the state and --data "
        f"checks, the handling of Ctrl-C) from the current directory only, and this is "
        f"{pyinfra.state.cwd}; cd {_CHECKOUT} and run the command again. Nothing was changed")

from operations.plumbing.connect import connection_data
from operations.site.model import (
    SITE_ENV,
    load_site,
    pair_group,
    sudo_data,
    tp_group_data,
)
from operations.site.options import carried_data

if os.environ.get(SITE_ENV):
    _site = load_site(os.environ[SITE_ENV])
    workstations = _site.workstation_hosts()
    gateway = _site.gateway_hosts()
    _pairs = _site.pair_groups()

else:
    # The lab's hosts as lab/topology.py makes them; `python -m lab up` creates
    # these files, and both honour the same TWINBOLT_LAB_STATE override.
    from lab import topology as _lab

    _CANDIDATE = _lab.STATE / "modules" / "candidate" / "thunderbolt_net.ko"
    _CANDIDATE_SHA256 = _CANDIDATE.with_name(_CANDIDATE.name + ".sha256")
    _SSH_PORT = 22

    # As on a real site, some hosts are reached as an unprivileged admin account
    # with passwordless sudo (the lab's `twinbolt`, a real sudoers entry), one as root.
    def _lab_ssh(host: _lab.LabHost) -> dict[str, object]:
        return {
            "ssh_hostname": host.management_address,
            "ssh_user": host.ssh_user,
            "ssh_port": _SSH_PORT,
            "ssh_key": str(_lab.STATE / "ssh" / "id_ed25519"),
            "ssh_known_hosts_file": str(_lab.STATE / "ssh" / "known_hosts"),
            "ssh_strict_host_key_checking": "yes",
            **sudo_data(host.ssh_user != "root"),
            **connection_data(host.management_address, _SSH_PORT),
        }

    def _lab_workstation(pair: _lab.LabPair, rank: int, host: _lab.LabHost) -> dict[str, object]:
        links = [str(workstation.link_address) for workstation in pair.workstations]
        return {
            **_lab_ssh(host),
            **tp_group_data(pair.name, links, rank),
            "candidate_path": str(_CANDIDATE),
            "ledger_path": str(_lab.STATE / "ledger.jsonl"),
            **{f"serving_{name}": str(path) for name, path in _lab.SGLANG_KEYS.items()},
            # Until the lab has built the candidate there is no checksum; the
            # driver layer reports that, the inventory must still load.
            "candidate_sha256": (
                next(iter(_CANDIDATE_SHA256.read_text().split()), None)
                if _CANDIDATE_SHA256.exists()
                else None
            ),
        }

    # The pairs `python -m lab up --pairs N` built, as the lab records them.
    workstations = [(host.name, _lab_workstation(pair, rank, host))
                    for pair in _lab.lab_pairs() for rank, host in enumerate(pair.workstations)]
    gateway = [(_lab.GATEWAY.name, _lab_ssh(_lab.GATEWAY))]
    _pairs = {pair_group(pair.name): [*(host.name for host in pair.workstations),
                                      _lab.GATEWAY.name]
              for pair in _lab.lab_pairs()}
    lab = [host.name for host in _lab.hosts()]

# A rollback's --data, carried by the run that started it (operations/site/options.py):
# host data, which wins over group data as --data does.
_carried = carried_data()
workstations = [(name, {**data, **_carried}) for name, data in workstations]
gateway = [(name, {**data, **_carried}) for name, data in gateway]

# Each pair's group, pair_<name>: names only, the hosts' data is the other groups'.
globals().update(_pairs)
