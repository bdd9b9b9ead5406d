"""
The gateway layer: the public roles on a LiteLLM proxy, and the temporary fallback.

Clients never call SGLang: they call the roles ``small`` (the Qwen model,
through sglang-router in front of the replicas) and ``large`` (the alternate
backend) on a LiteLLM proxy on the gateway. Production carries only a
context-window fallback ``small -> large``, which never fires on an outage. An
experiment adds a general fallback ``small -> large``; the proofs that the
route works through it are :mod:`operations.gateway.route`'s. The fallback goes
only after production is proven again.

This module runs the proxy. The master key is a mode-0600 file on the gateway:
the site's, or generated there. It never leaves that host. The proxy's service
reads it into its environment at start; every request that needs it is made on
the gateway by curl, which gets the ``Authorization`` header on its stdin from
the file, so the key is in no command line, no process list and no pyinfra
output, and neither pyinfra nor pytest ever holds it.

The proxy is judged by what it runs, not by what its file says: its own API
(``/v1/model/info``, ``/fallback/<role>``) tells which deployments and fallbacks
the running router has. A proxy whose routing differs from the rendered config
is reloaded, never restarted: it runs under gunicorn, whose master keeps the
port and, on ``SIGHUP``, forks workers that read the new config and retires
the old ones, which take no new connection, so no client is refused (a
restart closes the port for the seconds a new proxy takes to start). A reload
is waited out until its new workers are there and the proxy is ready *with
the new routing*, so a proof never reaches a worker that is shutting down.
Only a change of the service itself (its unit or run script) restarts it.

Clients reach it through its front (:mod:`operations.gateway.front`), which
sends again a request that a retiring worker closed unread: the one race a
reload leaves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, Host, QuoteString, StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.util import get_template
from pyinfra.operations import files

from operations import services
from operations.gateway.front import Front
from operations.gateway.front import present as front_present
from operations.plumbing import keys, probes, venvs
from operations.plumbing.facts import EmptyMeansSomething, FileDigest, digest, shell_script
from operations.plumbing.phase import elsewhere
from operations.plumbing.probes import Proofs, Proven
from operations.services import GatewayService, Service, log_tails
from operations.site.model import MASTER_KEY_ENV
from operations.site.settings import GatewaySettings, derived
from operations.step import Layer, failing, operation

LAYER = Layer.GATEWAY
ROLES = ("small", "large")
# Each role's own deployment, by the stable model_info.id that x-litellm-model-id reports.
DEPLOYMENTS = {"small": "small-router", "large": "large-backend"}
# The kinds of fallback, as the config names them and as /fallback/<role> asks for them.
FALLBACK_KINDS = {"fallbacks": "general", "context_window_fallbacks": "context_window"}
# The proxy twinbolt installs on the gateway; requirements-lab.txt pins the same release.
# litellm[proxy], hash-pinned; installed into the proxy's venv as it is.
LITELLM_LOCK = Path(__file__).resolve().parents[2] / "requirements-litellm.lock"
TEMPLATE = services.TEMPLATES / "litellm_config.yaml.j2"
# LiteLLM fetches these from GitHub or its documentation site unless told to use
# the copies bundled with it; a gateway may have no route to the internet.
OFFLINE_ENVIRONMENT = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
}
LARGE_KEY_ENV = "TWINBOLT_LARGE_API_KEY"
# The SGLang servers' key, which the router asks of its clients.
SMALL_KEY_ENV = "TWINBOLT_SMALL_API_KEY"
# For backends that ask for no key: the OpenAI client refuses to send none.
NO_KEY = "unused"
# Exports each NAME=FILE argument before ``--`` as NAME set to FILE's content,
# then runs the rest: the secrets are read at start, never written into the
# unit or the run script.
SECRETS_LOADER = (
    'while [ "$1" != -- ]; do value=$(cat "${1#*=}") || exit 1; '
    'export "${1%%=*}=$value"; shift; done; shift; exec "$@"'
)
START_TIMEOUT_SECONDS = 120.0
# Two workers forked by a gunicorn master that keeps the port: a reload forks
# their replacements before it retires them, and one worker's request in
# flight never holds up the other's.
WORKERS = 2
# Where LiteLLM listens: the gateway's loopback, where its front connects.
BACKEND_ADDRESS = "127.0.0.1"


# What runs: the site's settings and the service built from them


@dataclass(frozen=True)
class Deployment:
    """One role's backend, as LiteLLM calls it; ``api_key`` may be ``os.environ/NAME``."""

    id: str
    served_model_name: str
    api_base: str
    api_key: str


@dataclass(frozen=True)
class Proxy(GatewayService):
    """
    The LiteLLM proxy on the gateway and its two roles: the site's
    ``gateway_roles``, its own as ``litellm_*``
    (:func:`~operations.site.settings.derived`).

    ``secret_files`` are the environment variables the service reads from files
    on the gateway when it starts, the master key first. ``small_key_file``
    holds the key the router asks of it, put there from ``small_key_source``
    on the machine running twinbolt.
    """

    service: str
    config_file: str
    master_key_file: str
    small_key_file: str
    small_key_source: Path | str
    small: Deployment
    large: Deployment
    secret_files: tuple[tuple[str, str], ...]
    backend_port: int

    @property
    def front(self) -> Front:
        """Its front on the users' ``port``, in front of LiteLLM on ``backend_port``."""
        return Front.of(self.service, self.config_file, self.listen_address, self.port,
                        self.backend_port, self.user, self.init_system)

    @classmethod
    def from_host(cls, gateway: Host, small_model: str, small_url: str,
                  small_key_source: Path) -> Proxy:
        """
        The gateway's settings; ``small`` is ``small_model`` served at ``small_url``
        with the key in the local file ``small_key_source`` (the serving layer's
        router, whose settings the runbook passes on).
        """
        settings = GatewaySettings.of(gateway)
        roles = settings.roles
        secret_files = [(MASTER_KEY_ENV, roles.master_key_file),
                        (SMALL_KEY_ENV, roles.litellm_small_key_file)]
        large_key = NO_KEY
        if roles.large.api_key_file:
            secret_files.append((LARGE_KEY_ENV, roles.large.api_key_file))
            large_key = f"os.environ/{LARGE_KEY_ENV}"
        elif roles.large.api_key_env:
            # A variable the site puts in the proxy's environment itself.
            large_key = f"os.environ/{roles.large.api_key_env}"
        return derived(
            cls, settings, roles, prefix="litellm_",
            small=Deployment(DEPLOYMENTS["small"], small_model, f"{small_url}/v1",
                             f"os.environ/{SMALL_KEY_ENV}"),
            small_key_source=small_key_source,
            large=Deployment(DEPLOYMENTS["large"], roles.large.served_model_name,
                             str(roles.large.api_base).rstrip("/"), large_key),
            secret_files=tuple(secret_files),
        )


def proxy_service(proxy: Proxy) -> Service:
    """The LiteLLM proxy, its secrets read from their files as it starts."""
    return Service(
        name=proxy.service,
        description="LiteLLM proxy: the gateway's public roles small and large (twinbolt)",
        command=[
            "/bin/sh", "-c", SECRETS_LOADER, proxy.service,
            *(f"{name}={path}" for name, path in proxy.secret_files), "--",
            f"{proxy.venv}/bin/litellm", "--config", proxy.config_file,
            # Behind its front only: no client reaches a worker but through it.
            "--host", BACKEND_ADDRESS, "--port", str(proxy.backend_port),
            "--run_gunicorn", "--num_workers", str(WORKERS),
        ],
        environment=OFFLINE_ENVIRONMENT,
        user=proxy.user,
        reloadable=True,
    )


def template_context(proxy: Proxy, fallback: bool) -> dict[str, object]:
    return {"small": proxy.small, "large": proxy.large, "fallback": fallback}


def render_config(proxy: Proxy, fallback: bool) -> str:
    """The config :func:`proxy` uploads, rendered locally (pyinfra's own jinja2 environment)."""
    return get_template(str(TEMPLATE)).render(template_context(proxy, fallback))


def routing(config: dict) -> dict:
    """
    What a LiteLLM config routes where: each role's deployment, and each kind of
    fallback by role.

    .. code:: python

        {"deployments": {"small": {"id": "small-router", "model": "openai/qwen",
                                   "api_base": "http://gw:30080/v1"}, "large": {…}},
         "fallbacks": {"small": ["large"]}, "context_window_fallbacks": {"small": ["large"]}}
    """
    settings = config.get("router_settings") or {}
    return {
        "deployments": {
            entry["model_name"]: deployment_of(entry) for entry in config.get("model_list") or []
        },
        **{
            kind: {role: list(to) for rule in settings.get(kind) or [] for role, to in rule.items()}
            for kind in FALLBACK_KINDS
        },
    }


def deployment_of(entry: dict) -> dict:
    """The part of a ``model_list`` entry (or of ``/v1/model/info``) that routing depends on."""
    params = entry.get("litellm_params") or {}
    return {"id": (entry.get("model_info") or {}).get("id"), "model": params.get("model"),
            "api_base": params.get("api_base")}


def wanted_routing(proxy: Proxy, fallback: bool) -> dict:
    return routing(yaml.safe_load(render_config(proxy, fallback)))


def fallback_present(routing: dict) -> bool:
    """The gateway layer's judge: whether ``routing`` sends ``small`` to ``large`` on any error."""
    return "large" in routing.get("fallbacks", {}).get("small", [])


def serving_deployments(fallback: bool) -> dict[str, str]:
    """
    The deployment that answers each role: ``small`` is served by the replicas
    behind the router, or by ``large`` through the ``fallback`` while they are down.
    """
    small = "large" if fallback else "small"
    return {"small": DEPLOYMENTS[small], "large": DEPLOYMENTS["large"]}


# Facts


class ProxyConfig(EmptyMeansSomething):
    """The :func:`routing` of the LiteLLM config file at ``path``; ``None`` without the file."""

    def command(self, path: str) -> StringCommand:
        return StringCommand("cat", QuoteString(path), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> dict:
        return routing(yaml.safe_load("\n".join(output)) or {})


class LiveRouting(FactBase):
    """
    What the running proxy routes where, asked of its own API (``/v1/model/info``
    and ``/fallback/<role>``), in the shape of :func:`routing`; ``None`` while it
    does not answer.
    """

    def requires_command(self, url: str, master_key_file: str) -> str:
        return "curl"

    def command(self, url: str, master_key_file: str) -> StringCommand:
        # The five requests at once, each into its own file; then one line each,
        # in order: a tag, the body on one line, the HTTP status.
        kinds = " ".join(FALLBACK_KINDS.values())
        script = keys.keyed_curl(
            'url=$2; shift 2; out=$(mktemp -d) || exit 1; trap \'rm -rf "$out"\' EXIT; '
            'ask -s -m 5 -w " %{http_code}" "$url/v1/model/info" > "$out/models" & '
            f'for role in "$@"; do for kind in {kinds}; do '
            'ask -s -m 5 -w " %{http_code}" "$url/fallback/$role?fallback_type=$kind" '
            '> "$out/$kind.$role" & done; done; wait; '
            'echo "models $(tr -d "\\n" < "$out/models")"; '
            f'for role in "$@"; do for kind in {kinds}; do '
            'echo "$kind $role $(tr -d "\\n" < "$out/$kind.$role")"; done; done'
        )
        return shell_script(script, master_key_file, url, *ROLES)

    def process(self, output: list[str]) -> dict | None:
        answers = {}
        for line in output:
            tag, _, rest = line.partition(" ")
            role = None
            if tag != "models":
                role, _, rest = rest.partition(" ")
            body, _, status = rest.rpartition(" ")
            answers[tag, role] = (status, body)
        status, body = answers.get(("models", None), ("", ""))
        if status != "200":
            return None
        live: dict = {"deployments": {entry["model_name"]: deployment_of(entry)
                                      for entry in json.loads(body)["data"]}}
        for config_key, kind in FALLBACK_KINDS.items():
            live[config_key] = {
                role: json.loads(body)["fallback_models"]
                for (tag, role), (status, body) in answers.items()
                if tag == kind and status == "200"
            }
        return live


# Evidence


def describe(value: object) -> str:
    """Routing for a message: fallbacks as ``small -> large``, anything else as JSON."""
    if isinstance(value, dict) and all(isinstance(to, list) for to in value.values()):
        return ", ".join(f"{role} -> {', '.join(to)}" for role, to in value.items()) or "none"
    return json.dumps(value, sort_keys=True)


def routing_problems(what: str, observed: dict | None, wanted: dict, why: str) -> list[str]:
    """How ``observed`` routing differs from ``wanted``, part by part."""
    if observed is None:
        return [f"{what} does not exist"]
    return [
        f"{what} has {part} {describe(observed.get(part))}, but {why} {describe(wanted[part])}"
        for part in wanted
        if observed.get(part) != wanted[part]
    ]


def live_problems(proxy: Proxy, fallback: bool, proofs: Proofs,
                  retired: frozenset[int] = frozenset()) -> list[str]:
    """
    What keeps the running proxy from routing with the ``fallback`` present or
    absent: fewer than its workers forked since a reload (``retired``: those
    before it), not ready, or routing otherwise; asked once per run of the same
    workers.

    The retired workers are not waited for: gunicorn signals them as it forks
    their successors, and they take no connection from then on, but one may
    stay to finish an answer, or for good: a worker forked from LiteLLM's
    master can hang in its start (the master runs a thread of its own), takes
    no connection either, and gunicorn kills it at its own timeout.
    """
    wanted = wanted_routing(proxy, fallback)
    # The workers first, read once: the routing read next is then theirs or later ones'.
    workers = proxy_workers(proxy)
    if retired and len(fresh := set(workers[1:] if workers else ()) - retired) < WORKERS:
        return [f"the proxy has {len(fresh)} of its {WORKERS} workers forked since its reload: "
                "the reload has not taken yet"]
    # Asked from here, the clients' side: a proxy that listens only on the
    # gateway's loopback would pass a check made on the gateway.
    readiness = probes.get(f"{proxy.url}/health/readiness")
    if not readiness.ok:
        return [f"the proxy at {proxy.url} does not answer /health/readiness from this "
                f"machine (the clients' side): {readiness.describe()}"]

    def routing() -> list[str]:
        live = host.get_fact(LiveRouting, url=proxy.url, master_key_file=proxy.master_key_file)
        if live is None:
            return [f"the proxy at {proxy.url} does not answer /v1/model/info with the master "
                    f"key in {proxy.master_key_file}"]
        return routing_problems("the running proxy", live, wanted, "its config has")
    return proofs.once(routes(proxy, fallback), workers, routing)


def proxy_workers(proxy: Proxy) -> tuple[int, ...] | None:
    """
    The running proxy's main pid and its workers', which proofs made in this run
    are remembered by: a reload keeps the main process and replaces the workers,
    and the routing is theirs. ``None`` while no proxy runs.
    """
    process = host.get_fact(services.ServiceProcess, service=proxy.service,
                            init_system=proxy.init_system)
    return (process["pid"], *process["children"]) if process["pid"] else None


def routes(proxy: Proxy, fallback: bool) -> Proven:
    """The proof that this host's proxy routes as its config says, with or without the fallback."""
    return Proven(host.name, proxy.service, "routes", fallback)


def proxy_log(proxy: Proxy) -> str:
    return log_tails([(host, proxy.service, proxy.init_system),
                      (host, proxy.front.service, proxy.init_system)])


# Operations


@operation(LAYER)
def proxy(proxy: Proxy | None, fallback: bool, proofs: Proofs,
          timeout: float = START_TIMEOUT_SECONDS) -> Iterator[PyinfraCommand]:
    """
    Run the LiteLLM proxy with the public roles and the temporary general
    fallback ``small -> large`` present or absent, and wait until it is ready
    with exactly that routing.

    Installs ``litellm[proxy]`` into ``proxy.venv`` from its lock, generates the master key on
    the gateway if the site provides none, and renders the config. The proxy is
    reloaded (new workers on the port it keeps) unless it already routes as the
    config says (asked of its own API, so a proxy left running an older config is
    caught too); it is restarted only when its service itself changed. Its
    front (haproxy, installed where missing) is kept running on the users' port.

    + proxy: the gateway's :class:`Proxy`; ``None`` elsewhere (a no-op)
    + fallback: whether the general fallback ``small -> large`` is present
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`, where a proxy that
      routes as declared is remembered as proven
    + timeout: seconds to wait for the proxy to be ready with the new routing

    **Example:**

    .. code:: python

        proxy.proxy(
            name="Gateway: the temporary fallback small -> large is present",
            proxy=Proxy.from_host(host, router.served_model_name, router.url,
                                  router.api_key_file),
            fallback=True,
            proofs=run.proofs,
        )
    """
    if elsewhere(proxy, "gateway"):
        return
    wanted = wanted_routing(proxy, fallback)
    # The workers first: the routing read next is then theirs or later ones'.
    workers = proxy_workers(proxy)
    live = host.get_fact(LiveRouting, url=proxy.url, master_key_file=proxy.master_key_file)
    yield from venvs.locked._inner(venv=proxy.venv, lock=LITELLM_LOCK,
                                   pip_options=proxy.pip_options)
    yield from services.account_present(proxy.user)
    yield from keys.key_present(proxy.master_key_file, proxy.user)
    # Read into its environment as it starts: a reload would keep the old one.
    small_key_changed = yield from keys.key_put(proxy.small_key_source, proxy.small_key_file,
                                                proxy.user)
    # A static config needs new workers to take effect, including the settings
    # the proxy's API does not show (the retry policy).
    config_changed = (host.get_fact(FileDigest, path=proxy.config_file)
                      != digest(render_config(proxy, fallback), "644"))
    if config_changed:
        yield from files.template._inner(src=str(TEMPLATE), dest=proxy.config_file, mode="644",
                                         **template_context(proxy, fallback))
    # LiteLLM first: a gateway of an older twinbolt has it on the users' port.
    renewed = list(services.present._inner(service=proxy_service(proxy),
                                           init_system=proxy.init_system,
                                           restarted=small_key_changed,
                                           reloaded=live != wanted or config_changed))
    fronted = list(front_present(proxy.front))
    if not renewed and not fronted:
        if workers:
            proofs.remember(routes(proxy, fallback), workers)
        host.noop(f"the proxy routes as its config says, the fallback "
                  f"{'present' if fallback else 'absent'}")
        return
    yield from renewed
    yield from fronted
    # Reloaded, its workers are replaced; started or restarted, they are new anyway.
    retired = frozenset(workers[1:] if workers and renewed else ())
    outcome: dict = {}
    what = (f"the proxy at {proxy.url} ready with the fallback "
            f"{'present' if fallback else 'absent'}")
    yield FunctionCommand(probes.wait_until,
                          (what, lambda seconds_left: (
                              live_problems(proxy, fallback, proofs, retired), True),
                           timeout, outcome), {})
    if outcome.get("found"):
        yield failing(LAYER, [*outcome["found"], proxy_log(proxy)])


