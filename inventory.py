"""
The hosts: a real site when ``TWINBOLT_SITE`` names a site file, else the embedded
lab, as ``python -m lab up`` lists it (``operations/site/listing.py``): this file
imports nothing of the lab.

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

from operations.site.listing import listing_path, load_listing
from operations.site.model import SITE_ENV, load_site
from operations.site.options import carried_data

if os.environ.get(SITE_ENV):
    _site = load_site(os.environ[SITE_ENV])
    workstations = _site.workstation_hosts()
    gateway = _site.gateway_hosts()
    _pairs = _site.pair_groups()

else:
    # The lab's hosts, as `python -m lab up` lists them in its state directory
    # (lab/listing.py; TWINBOLT_LAB_STATE overrides where): a file like a site's,
    # validated as it is read.
    _listing = load_listing(listing_path(_CHECKOUT))
    workstations = _listing.hosts("workstations")
    gateway = _listing.hosts("gateway")
    _pairs = _listing.pairs
    # Its extra group, ``lab``, after ``workstations`` and ``gateway``.
    globals()[_listing.extra[0]] = _listing.extra[1]

# A rollback's --data, carried by the run that started it (operations/site/options.py):
# host data, which wins over group data as --data does.
_carried = carried_data()
workstations = [(name, {**data, **_carried}) for name, data in workstations]
gateway = [(name, {**data, **_carried}) for name, data in gateway]

# Each pair's group, pair_<name>: names only, the hosts' data is the other groups'.
globals().update(_pairs)
