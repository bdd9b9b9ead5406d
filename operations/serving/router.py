"""
The serving layer on the gateway: sglang-router in front of the replicas.

It runs with the replicas and only with them: in a TP state its workers are
gone, and on their port rank 1's dummy ``/health`` would answer 200 and draw
traffic it cannot serve. It is accepted only by ``/readiness`` (its ``/health``
always says OK) and a real completion through it. sglang-router comes from its
own hash-pinned lock, installed into the router's venv on the gateway.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api import Host
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.exceptions import PyinfraError

from operations import services
from operations.plumbing import probes, venvs
from operations.plumbing.phase import elsewhere, executing
from operations.plumbing.probes import Proofs, Proven
from operations.services import GatewayService, Service, ServiceProcess, log_tails
from operations.serving.sglang import (
    ACCEPTANCE_TOKENS,
    LAYER,
    ROUTER,
    Check,
    Sglang,
    accept,
    process_problems,
)
from operations.site.settings import GatewaySettings, derived
from operations.step import failing, operation

# The router twinbolt installs on the gateway; requirements-lab.txt pins the same release.
# sglang-router, hash-pinned; installed into the router's venv as it is.
ROUTER_LOCK = Path(__file__).resolve().parents[2] / "requirements-router.lock"


@dataclass(frozen=True)
class Router(GatewayService):
    """
    sglang-router on the gateway and its workers: the site's ``gateway_roles``,
    its own as ``router_*`` (:func:`~operations.site.settings.derived`), and
    every replica's URL, model and start's bound.
    """

    workers: tuple[str, ...]
    served_model_name: str
    start_timeout_seconds: float

    @classmethod
    def from_hosts(cls, gateway: Host, workstations: Sequence[Host],
                   workers: tuple[str, ...] | None = None) -> Router:
        """
        The gateway's settings, for the replicas of ``workstations``, fronting
        ``workers`` (:func:`router_workers`), by default every one of them.
        """
        replicas = [Sglang.from_host(workstation) for workstation in workstations]
        settings = GatewaySettings.of(gateway)
        return derived(
            cls, settings, settings.roles, prefix="router_",
            workers=tuple(replica.url for replica in replicas) if workers is None else workers,
            served_model_name=replicas[0].served_model_name,
            start_timeout_seconds=max(replica.start_timeout_seconds for replica in replicas),
        )

    @property
    def runs(self) -> bool:
        """The router runs while some replica serves: it never runs without a worker."""
        return bool(self.workers)


def router_workers(workstations: Sequence[Host], in_run: Collection[Host],
                   run_serves_replicas: bool, fronted: Collection[str]) -> tuple[str, ...]:
    """
    The replicas the router is to front once this run is done, in the
    inventory's order: the run's own when its state serves replicas
    (production), and those of the pairs outside the run that it fronts now
    (``fronted``, :func:`fronted_workers`), which keep serving ``small``.
    """
    urls = [(workstation, Sglang.from_host(workstation).url) for workstation in workstations]
    return tuple(url for workstation, url in urls
                 if (run_serves_replicas if workstation in in_run else url in fronted))


class FrontedUnknown(PyinfraError):
    """The router runs but says not which replicas it fronts; this run changed nothing."""


def fronted_workers(gateway: Host, settings: GatewaySettings) -> list[str]:
    """
    The replicas the router on ``gateway`` fronts now, as its own ``/workers``
    lists them; none while it is stopped. A pair outside the run that it fronts
    serves ``small``: the run keeps it there. (Its command line cannot say:
    sglang-router renames its process, so ``/proc`` shows ``sglang::router``.)
    """
    process = gateway.get_fact(ServiceProcess, service=ROUTER,
                               init_system=settings.roles.init_system)
    if not process["running"]:
        return []
    answer = probes.get(f"{settings.router_url}/workers")
    listed = workers_listed(answer)
    if listed is None:
        raise FrontedUnknown(
            f"{gateway.name}: the router runs (pid {process['pid']}) but its worker list cannot "
            f"be read: {answer.describe()}; this run must know which pairs it serves. Nothing "
            "was changed")
    return listed


def workers_listed(answer: probes.Answer) -> list[str] | None:
    """The worker URLs in a router's ``/workers`` answer, or None if it is no such answer."""
    body = answer.body if answer.ok else None
    if not (isinstance(body, dict) and isinstance(body.get("workers"), list)):
        return None
    return [worker["url"] for worker in body["workers"]
            if isinstance(worker, dict) and isinstance(worker.get("url"), str)]


def router_service(router: Router) -> Service:
    """sglang-router in front of the replicas; only replicas are ever its workers."""
    return Service(
        name=ROUTER,
        description="sglang-router in front of the SGLang replicas (twinbolt production)",
        command=[
            f"{router.venv}/bin/python", "-m", "sglang_router.launch_router",
            "--worker-urls", *router.workers,
            "--policy", "cache_aware",
            "--host", router.listen_address,
            "--port", str(router.port),
        ],
        user=router.user,
    )


def router_check(router: Router, tokens: int, proofs: Proofs) -> Check:
    """The router's acceptance: running, ready with a healthy worker, and serving."""

    def check(seconds_left: float = probes.REQUEST_TIMEOUT_SECONDS) -> tuple[list[str], bool]:
        wanted = router_service(router)
        process = host.get_fact(ServiceProcess, service=ROUTER, init_system=router.init_system,
                                variables=tuple(wanted.environment))
        found = process_problems(process, wanted, argv=False)
        if found:
            return found, False
        # Its /health always says OK; /readiness needs a healthy worker.
        readiness = probes.get(f"{router.url}/readiness")
        if not readiness.ok:
            return [f"the router is not ready: {readiness.describe()}"], True
        served = Proven(host.name, ROUTER)
        return proofs.once(served, process["pid"], lambda: probes.completion_problems(
            probes.chat_completion(router.url, router.served_model_name, tokens,
                                   timeout=min(probes.REQUEST_TIMEOUT_SECONDS, seconds_left)),
            tokens)), True

    return check


@operation(LAYER)
def router(router: Router | None, present: bool = True) -> Iterator[PyinfraCommand]:
    """
    Install and run sglang-router on the gateway with the replicas as its workers,
    or stop it.

    + router: the gateway's :class:`Router` settings and workers; ``None`` elsewhere (a no-op)
    + present: whether the router should run

    **Example:**

    .. code:: python

        router.router(
            name="Serving: the router fronts the replicas",
            router=Router.from_hosts(host, inventory.get_group("workstations")),
        )
    """
    if elsewhere(router, "gateway"):
        return
    if not present:
        yield from services.absent._inner(service=ROUTER, init_system=router.init_system)
        return
    yield from venvs.locked._inner(venv=router.venv, lock=ROUTER_LOCK,
                                   pip_options=router.pip_options)
    yield from services.account_present(router.user)
    yield from services.present._inner(service=router_service(router),
                                       init_system=router.init_system)


@operation(LAYER, is_idempotent=True)
def router_accepted(router: Router | None, proofs: Proofs,
                    tokens: int = ACCEPTANCE_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Accept the router only by ``/readiness`` (its ``/health`` always says OK) and a
    real completion of ``tokens`` tokens through it.

    + router: the gateway's :class:`Router` settings; ``None`` elsewhere (a no-op)
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`
    + tokens: the completion's length

    **Example:**

    .. code:: python

        router.router_accepted(name="Serving: the router serves", router=router,
                                       proofs=run.proofs)
    """
    if elsewhere(router, "gateway"):
        return
    yield from accept(
        f"the router at {router.url} serves a real completion",
        router_check(router, tokens, proofs),
        router.start_timeout_seconds,
        lambda: log_tails([(host, ROUTER, router.init_system)]),
    )


@operation(LAYER, is_idempotent=True)
def router_verified(router: Router | None, proofs: Proofs, present: bool = True,
                    tokens: int = ACCEPTANCE_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Prove the router runs and serves (production), or is stopped (TP states).

    + router: the gateway's :class:`Router` settings; ``None`` elsewhere (a no-op)
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`, proofs its acceptance made
    + present: whether the router should run
    + tokens: the completion's length

    **Example:**

    .. code:: python

        router.router_verified(name="Verify: the router", router=router,
                                       proofs=run.proofs, present=True)
    """
    if elsewhere(router, "gateway"):
        return
    if not executing():
        host.noop("verified when the run executes")
        return
    if present:
        found = router_check(router, tokens, proofs)()[0]
    else:
        process = host.get_fact(ServiceProcess, service=ROUTER, init_system=router.init_system)
        found = [f"the router runs (pid {process['pid']}) while the replicas are down"
                 ] if process["running"] else []
    if found:
        yield failing(LAYER, [*found, log_tails([(host, ROUTER, router.init_system)])])
        return
    host.noop("the router is " + ("serving" if present else "stopped"))
