"""
The serving layer on the gateway: sglang-router in front of the replicas.

It runs with the replicas and only with them: in a TP state its workers are
gone, and on their port rank 1's dummy ``/health`` would answer 200 and draw
traffic it cannot serve. It is accepted only by ``/readiness`` (its ``/health``
always says OK) and a real completion through it. sglang-router comes from its
own hash-pinned lock, installed into the router's venv on the gateway.

Its workers change through its own API, never by a restart: ``POST /workers``
registers a replica (in the background: the run waits until the router lists
it healthy), ``DELETE /workers/{id}`` removes one. sglang-router does not
drain, so a removed replica is waited on until its own ``/v1/loads`` counts no
request, before its server stops. The unit's ``--worker-urls`` is rewritten to
the live list without a restart, so that a router restarted by a reboot or a
crash comes back to the same workers; the router restarts only when the rest
of its unit changes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, Host, StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.exceptions import PyinfraError

from operations import services
from operations.plumbing import keys, probes, venvs
from operations.plumbing.facts import shell_script
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
# How long a removed replica may take to finish what it answers before its server
# stops anyway: longer than the longest answer a user of small waits for.
DRAIN_TIMEOUT_SECONDS = 60.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Router(GatewayService):
    """
    sglang-router on the gateway and its workers: the site's ``gateway_roles``,
    its own as ``router_*`` (:func:`~operations.site.settings.derived`), and
    every replica's URL, model and start's bound.
    """

    key_file: str
    worker_key_file: str
    # The SGLang servers' key on the machine running twinbolt ([serving] api_key_file).
    api_key_file: Path | str
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
            api_key_file=replicas[0].api_key_file,
            start_timeout_seconds=max(replica.start_timeout_seconds for replica in replicas),
        )

    @property
    def headers(self) -> dict[str, str]:
        """What a client of the router shows it: the SGLang servers' key, as the proxy does."""
        return keys.bearer(self.api_key_file)

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
    listed = gateway.get_fact(RouterWorkers, url=settings.router_url,
                              key_file=settings.roles.router_key_file)
    if listed is None:
        raise FrontedUnknown(
            f"{gateway.name}: the router runs (pid {process['pid']}) but its worker list cannot "
            f"be read at {settings.router_url}/workers with the key in "
            f"{settings.roles.router_key_file}; this run must know which pairs it serves. "
            "Nothing was changed")
    return [worker["url"] for worker in listed]


# The router's keys, read from their files as it starts, so that no unit holds
# them: the one its worker API asks (--control-plane-api-keys, id:name:role:key),
# and the SGLang servers' (--api-key), which it sends its workers and asks of its
# own clients. sglang-router takes neither any other way than on its command
# line, which it overwrites as it renames its process (sglang::router).
KEYS_LOADER = (
    'key=$(cat "$1") && worker_key=$(cat "$2") || exit 1; shift 2; '
    'exec "$@" --control-plane-api-keys "twinbolt:twinbolt:admin:$key" --api-key "$worker_key"'
)


def router_service(router: Router) -> Service:
    """
    sglang-router in front of the replicas; only replicas are ever its workers,
    in a stable order, so that the same workers render the same unit.
    """
    return Service(
        name=ROUTER,
        description="sglang-router in front of the SGLang replicas (twinbolt production)",
        command=[
            "/bin/sh", "-c", KEYS_LOADER, ROUTER, router.key_file, router.worker_key_file,
            f"{router.venv}/bin/python", "-m", "sglang_router.launch_router",
            "--worker-urls", *sorted(router.workers),
            "--policy", "cache_aware",
            "--host", router.listen_address,
            "--port", str(router.port),
        ],
        user=router.user,
    )


class RouterWorkers(FactBase):
    """
    The workers the router at ``url`` fronts, as its own ``GET /workers`` lists
    them, asked on the gateway with the key in ``key_file`` (on curl's stdin);
    ``None`` while it does not answer, or refuses the key.

    .. code:: python

        [{"id": "6562bd21-b1d5-4ab0-90c7-2d950633f5bc", "url": "http://10.66.0.11:30000",
          "is_healthy": True, "load": 0}]
    """

    def requires_command(self, url: str, key_file: str) -> str:
        return "curl"

    def command(self, url: str, key_file: str) -> StringCommand:
        return shell_script(keys.keyed_curl('ask -s -m 5 -w "\\n%{http_code}" "$2/workers"; true'),
                            key_file, url)

    def process(self, output: list[str]) -> list[dict] | None:
        if not output or output[-1].strip() != "200":
            return None
        listed = json.loads("\n".join(output[:-1])).get("workers")
        if not isinstance(listed, list):
            return None
        return [{key: worker.get(key) for key in ("id", "url", "is_healthy", "load")}
                for worker in listed if isinstance(worker, dict)]


def worker_removed(router: Router, worker_id: str) -> StringCommand:
    """Have the router stop sending anything to one worker (``DELETE /workers/{id}``)."""
    return shell_script(keys.keyed_curl(
        'ask -sS -f -m 10 -o /dev/null -X DELETE "$2/workers/$3"'),
        router.key_file, router.url, worker_id)


def worker_added(router: Router, worker_url: str) -> StringCommand:
    """
    Have the router register one worker, in the background (``POST /workers``,
    202), with the key it sends that worker: a worker registered without one is
    asked without one, and refuses every request.
    """
    return shell_script(
        'key=$(cat "$1") && worker_key=$(cat "$4") || exit 1; '
        # curl's config on its stdin: neither key is on its command line.
        'printf \'header = "Authorization: Bearer %s"\\ndata = "{\\\\"url\\\\": '
        '\\\\"%s\\\\", \\\\"api_key\\\\": \\\\"%s\\\\"}"\\n\' "$key" "$3" "$worker_key" | '
        'curl -K - -sS -f -m 10 -o /dev/null -H "Content-Type: application/json" '
        '-X POST "$2/workers"',
        router.key_file, router.url, worker_url, router.worker_key_file)


def workers_problems(router: Router) -> list[str]:
    """How the router's live workers differ from ``router.workers``, healthy each."""
    live = host.get_fact(RouterWorkers, url=router.url, key_file=router.key_file)
    if live is None:
        return [f"the router at {router.url} does not answer /workers with the key in "
                f"{router.key_file}"]
    urls = {worker["url"] for worker in live}
    found = [f"the router does not list {url} yet" for url in sorted(set(router.workers) - urls)]
    found += [f"the router still lists {url}" for url in sorted(urls - set(router.workers))]
    found += [f"the router lists {worker['url']} as unhealthy" for worker in live
              if worker["url"] in router.workers and not worker["is_healthy"]]
    return found


def drain_problems(removed: Collection[str], headers: dict[str, str]) -> list[str]:
    """
    The removed replicas still answering a request, by their own ``/v1/loads``:
    sglang-router does not drain. A server that does not answer has nothing left
    to finish.
    """
    found = []
    for url in sorted(removed):
        answer = probes.get(f"{url}/v1/loads?include=core", headers=headers)
        body = answer.body if answer.ok and isinstance(answer.body, dict) else {}
        left = (body.get("aggregate") or {}).get("total_reqs") or 0
        if left:
            found.append(f"{url} still answers {left} request(s)")
    return found


def drained(removed: Collection[str], headers: dict[str, str], timeout: float) -> bool:
    """
    Wait, bounded, until the ``removed`` replicas answer nothing; a drain that
    runs out is said, not failed: the server stops, as it did before drains.
    """
    outcome: dict = {}
    probes.wait_until("the replicas the router no longer fronts finished their requests",
                      lambda seconds_left: (drain_problems(removed, headers), True),
                      timeout, outcome)
    if outcome["found"]:
        logger.warning(f"    [{host.name}] stopping them anyway: {'; '.join(outcome['found'])}")
    return True


def unit_digest(router: Router, workers: Collection[str]) -> str:
    """The digest of the router's rendered file, were it to front ``workers``."""
    return services.rendered_digest(router_service(replace(router, workers=tuple(workers))),
                                    router.init_system)


def workers_changed(router: Router, live: list[dict]) -> Iterator[PyinfraCommand]:
    """
    Move the running router's workers from ``live`` to ``router.workers`` through
    its API: register the new ones, remove the old ones, wait until it lists
    exactly the wanted ones healthy, then until the removed ones are drained.
    """
    urls = {worker["url"] for worker in live}
    for url in sorted(set(router.workers) - urls):
        yield worker_added(router, url)
    removed = {worker["url"] for worker in live if worker["url"] not in router.workers}
    for worker in sorted(live, key=lambda worker: worker["url"]):
        if worker["url"] in removed:
            yield worker_removed(router, worker["id"])
    outcome: dict = {}
    yield FunctionCommand(probes.wait_until, (
        f"the router at {router.url} fronts {', '.join(sorted(router.workers)) or 'no worker'}",
        lambda seconds_left: (workers_problems(router), True),
        router.start_timeout_seconds, outcome), {})
    if outcome.get("found"):
        yield failing(LAYER, [*outcome["found"], log_tails([(host, ROUTER, router.init_system)])])
    if removed:
        yield FunctionCommand(drained, (removed, router.headers, DRAIN_TIMEOUT_SECONDS), {})


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
                                   timeout=min(probes.REQUEST_TIMEOUT_SECONDS, seconds_left),
                                   headers=router.headers),
            tokens)), True

    return check


@operation(LAYER)
def router(router: Router | None, present: bool = True) -> Iterator[PyinfraCommand]:
    """
    Install and run sglang-router on the gateway with the replicas as its workers,
    or stop it.

    A running router whose unit differs only in its workers keeps running: they
    change through its API (new ones registered and waited for, removed ones
    drained), and its file is rewritten to them. Stopping drains every worker first.

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
    process = host.get_fact(ServiceProcess, service=ROUTER, init_system=router.init_system)
    live = (host.get_fact(RouterWorkers, url=router.url, key_file=router.key_file)
            if process["running"] else None)
    if not present:
        if live:
            # Drained before it stops: what it answers now finishes first.
            yield from workers_changed(replace(router, workers=()), live)
        yield from services.absent._inner(service=ROUTER, init_system=router.init_system)
        return
    yield from venvs.locked._inner(venv=router.venv, lock=ROUTER_LOCK,
                                   pip_options=router.pip_options)
    yield from services.account_present(router.user)
    # A key it did not start with is read only by a new start.
    key_changed = False
    for command in keys.key_present(router.key_file, router.user):
        key_changed = True
        yield command
    key_changed = (yield from keys.key_put(router.api_key_file, router.worker_key_file,
                                           router.user)) or key_changed
    service = router_service(router)
    on_disk, settled = services.observed(service, router.init_system)
    live_urls = {worker["url"] for worker in live or ()}
    # The same unit but for its workers, run as declared (enabled at boot): the
    # workers change through the API, and the file follows them without a restart.
    # The file first: a run cut between the two leaves a unit naming the wanted
    # workers, which the next run recognises and changes through the API too.
    if not key_changed and live is not None and settled and on_disk in (
            unit_digest(router, live_urls), unit_digest(router, router.workers)):
        yield from services.rendered._inner(service=service, init_system=router.init_system)
        if live_urls != set(router.workers):
            yield from workers_changed(router, live)
        return
    yield from services.present._inner(service=service, init_system=router.init_system,
                                       restarted=key_changed)


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
