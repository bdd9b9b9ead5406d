"""
A host's part in a run: its settings and what each of its layers is given,
built once from the host's final data, so that ``deploy.py`` holds the steps
and nothing else.

A host's part is chosen here, once, by its inventory group: a workstation gets
a :class:`WorkstationPart` (the driver, the link, the guard, its replica or TP
rank), the gateway none, and each serving layer's value is None on the host
where it has no part. ``deploy.py`` calls a workstation's own steps only where
there is a :class:`WorkstationPart`; it calls every serving step on every host,
where a None value is a no-op, because pyinfra orders operations across hosts
only through the ones they share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from pyinfra.api import Host, Inventory

from operations import bounds
from operations.gateway import route
from operations.gateway.proxy import START_TIMEOUT_SECONDS as PROXY_START_TIMEOUT_SECONDS
from operations.gateway.proxy import Proxy
from operations.run import Run
from operations.safety import lock
from operations.safety.guard import Guard, disarm_first
from operations.serving import router
from operations.serving.router import Router
from operations.serving.sglang import Sglang, replica_runs
from operations.site.model import pair_group
from operations.site.settings import (
    GatewaySettings,
    HostSettings,
    WorkstationSettings,
)
from operations.states import Driver, State
from operations.thunderbolt.driver import CandidateModule, swap_planned
from operations.thunderbolt.link import ExpectedLink


@dataclass(frozen=True)
class WorkstationPart:
    """
    What a workstation's own steps are given: the candidate, the link as this
    host expects it and its wait's bound, the guard, the pair's names (the
    ledger's key for these controllers) and the gateway's address (which must
    not be reached across the link).
    """

    settings: WorkstationSettings
    candidate: CandidateModule
    link: ExpectedLink
    link_bound: int
    guard: Guard
    pair: list[str]
    gateway_address: str
    # The conditions of its steps (their _if), each a layer's answer from its
    # facts, asked when the step runs as facts are, so that deploy.py names them
    # and no layer is handed another's: what a refusal before any change keeps
    # (production's replica, serving here), whether the driver step will reload
    # the module (the TP ranks above it stop first), and whether the guard is
    # disarmed before that step.
    replica_serves: Callable[[], bool]
    no_replica_serves: Callable[[], bool]
    driver_swaps: Callable[[], bool]
    guard_disarms_first: Callable[[], bool]

    @classmethod
    def of(cls, settings: WorkstationSettings, inventory: Inventory, the_sglang: Sglang,
           target: Driver) -> WorkstationPart:
        link = ExpectedLink.of(settings)
        candidate = CandidateModule.of(settings)
        return cls(
            settings=settings,
            candidate=candidate,
            link=link,
            link_bound=settings.bound(link.wait_seconds),
            guard=Guard.of(settings, link),
            pair=[member.name for member in inventory.get_group(pair_group(settings.pair))
                  if "workstations" in member.groups],
            gateway_address=GatewaySettings.of(inventory.get_group("gateway")[0]).address,
            replica_serves=partial(replica_runs, the_sglang),
            no_replica_serves=partial(replica_runs, the_sglang, running=False),
            driver_swaps=partial(swap_planned, target, candidate),
            guard_disarms_first=partial(disarm_first, target, candidate),
        )


@dataclass(frozen=True)
class Part:
    """
    A host's part in a run: its settings, its :class:`WorkstationPart` (None on
    the gateway), its serving layers' values (None where it has no part in
    them), whether the user's ``small`` needs the temporary fallback to
    ``large`` (``fallback``: only while no pair's replicas serve it), and the
    bounds of the steps that wait longer than one command, each by its own wait
    (a serving start waits as long on the gateway, for the router, as on a
    workstation); the rollback converges production, and is bounded by every
    wait of one.
    """

    settings: HostSettings
    workstation: WorkstationPart | None
    sglang: Sglang | None
    router: Router | None
    proxy: Proxy | None
    fallback: bool
    start_bound: int
    proxy_bound: int
    request_bound: int
    rollback_timeout: int
    rollback_bound: int

    @classmethod
    def of(cls, host: Host, inventory: Inventory, in_run: Sequence[Host], state: State,
           run: Run) -> Part:
        """
        ``host``'s part in ``run``, to ``state``, which reaches ``in_run``, from
        its final data (--data too). On the gateway of a site whose pairs are
        not all in the run, it holds the gateway's lock first (a run on another
        pair may be changing the router: :func:`lock.gateway_taken`), then reads
        which replicas of those pairs the router fronts: they keep serving
        ``small`` through it, whatever this run does.
        """
        settings: HostSettings
        if "workstations" in host.groups:
            settings = WorkstationSettings.of(host)
            the_sglang = Sglang.from_host(host)
            workstation = WorkstationPart.of(settings, inventory, the_sglang, state.driver)
        else:
            settings = GatewaySettings.of(host)
            the_sglang = workstation = None
        the_router = the_proxy = None
        if "gateway" in host.groups:
            workstations = inventory.get_group("workstations")
            fronted = []
            if any(member not in in_run for member in workstations):
                lock.gateway_taken(host, settings.run_dir, run, run.attempt.dry,
                                   bounds.deploy_timeout(WorkstationSettings.of(workstations[0])))
                try:
                    fronted = router.fronted_workers(host, GatewaySettings.of(host))
                except router.FrontedUnknown:
                    # The run ends before it begins: nothing of it may stay held.
                    run.locks.release_taken()
                    raise
            the_router = Router.from_hosts(
                host, [member for member in workstations if member in in_run],
                router.router_workers(workstations, in_run, not state.tensor_parallel, fronted))
            the_proxy = Proxy.from_host(host, the_router.served_model_name, the_router.url,
                                       the_router.api_key_file)
        rollback_timeout = bounds.rollback_timeout(
            WorkstationSettings.of(inventory.get_group("workstations")[0]))
        return cls(
            settings=settings,
            workstation=workstation,
            sglang=the_sglang,
            router=the_router,
            proxy=the_proxy,
            fallback=state.gateway_fallback and not (the_router and the_router.runs),
            start_bound=settings.bound((the_sglang or the_router).start_timeout_seconds),
            proxy_bound=settings.bound(PROXY_START_TIMEOUT_SECONDS),
            request_bound=settings.bound(route.REQUEST_TIMEOUT_SECONDS),
            rollback_timeout=rollback_timeout,
            rollback_bound=settings.bound(rollback_timeout),
        )

    @property
    def router_runs(self) -> bool:
        """The gateway's router is to run after this run: some pair's replicas serve."""
        return bool(self.router and self.router.runs)
