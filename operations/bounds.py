"""
How long a whole ``deploy.py`` run may take, derived from the site's settings,
for whoever runs one as a process: the failed run's rollback
(``operations/safety/rollback.py``), the campaign's and the soak's deploys
(``harness/runs/campaign.py``); and how long its proof, ``pytest tests/verify``, may.

Each step of a run is bounded already, a remote command by the site's ``[ssh]
command_timeout_seconds``, a wait by itself and one command more
(:meth:`HostSettings.bound`). These bound the process as a whole, so that a run
that never ends (a connect that never completes, a pyinfra that never exits)
still ends its caller's step, which then fails as any other failure does.
"""

from __future__ import annotations

from operations.gateway import proxy
from operations.safety import rollback
from operations.site.settings import WorkstationSettings


def production_waits(pair: WorkstationSettings) -> tuple[float, ...]:
    """
    Every wait of a production converge, from rank 0's settings (the site's,
    the same on every host): the replicas start, then the router in front of
    them, the link retrains, the proxy restarts without the fallback.
    """
    return (pair.serving.start_timeout_seconds, pair.serving.start_timeout_seconds,
            pair.link.wait_seconds, proxy.START_TIMEOUT_SECONDS)


def rollback_timeout(pair: WorkstationSettings) -> int:
    """The bound of a rollback's run, a production converge (:func:`rollback.rollback_timeout`)."""
    return rollback.rollback_timeout(pair.command_timeout, production_waits(pair))


def deploy_timeout(pair: WorkstationSettings) -> int:
    """
    The bound of one ``deploy.py`` run to any state: its attempt, whose waits
    are no longer than a production converge's (a TP start waits as long as a
    replica's, and no router starts), then its rollback step, bounded by the
    rollback's bound and one command more, as ``deploy.py`` gives it.
    """
    rollback = rollback_timeout(pair)
    return rollback + pair.bound(rollback)


# A verify reads facts and sends a few requests, each bounded by a minute at
# most: seconds on a live pair. One that has not ended after this many
# commands' bounds waits on a host that stopped answering.
VERIFY_COMMAND_BOUNDS = 4


def verify_timeout(pair: WorkstationSettings) -> int:
    """The bound of one ``pytest tests/verify`` run: four remote commands' (1200 s by default)."""
    return VERIFY_COMMAND_BOUNDS * pair.command_timeout
