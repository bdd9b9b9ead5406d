"""
The gateway layer's proofs: the user's route through the proxy, asked as a client asks.

An experiment proves the fallback through the exact route a client uses (the
field report's first lesson): a forced-fallback request
(``mock_testing_fallbacks``) before anything stops, then a real request to
``small`` answered by the ``large`` deployment once the replicas are down; and
production proves ``small`` is back on its own deployment. Which deployment
served a request is read from its ``x-litellm-model-id`` header, each
deployment having a stable ``model_info.id``. Every request is made on the
gateway by curl, with the master key on curl's stdin (see
:mod:`operations.gateway.proxy`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.api.command import PyinfraCommand

from operations.gateway.proxy import (
    DEPLOYMENTS,
    LAYER,
    ROLES,
    START_TIMEOUT_SECONDS,
    Proxy,
    ProxyConfig,
    live_problems,
    proxy_workers,
    routing_problems,
    serving_deployments,
    wanted_routing,
)
from operations.plumbing import keys, probes
from operations.plumbing.facts import EmptyMeansSomething, shell_script
from operations.plumbing.phase import elsewhere, executing
from operations.plumbing.probes import Proofs, Proven
from operations.step import failing, operation, refuse

PROOF_TOKENS = 8
# One proof request may take this long. During an outage LiteLLM first retries
# small with back-off (about 5 s in the lab) before it falls back.
REQUEST_TIMEOUT_SECONDS = 60.0


# Facts


class RoleAnswers(EmptyMeansSomething):
    """
    One real chat completion through each of ``roles`` at once, asked on the
    gateway with curl (``forced_fallback`` adds ``mock_testing_fallbacks``), as
    a :class:`probes.Answer` by role; its ``headers`` are lower-case.

    .. code:: python

        {"large": Answer(url="http://gw:4000/v1/chat/completions", status=200,
                         headers={"x-litellm-model-id": "large-backend",
                                  "x-litellm-attempted-fallbacks": "1", …},
                         body={"choices": […], "usage": {"completion_tokens": 8, …}},
                         seconds=5.04)}
    """

    def requires_command(self, url: str, master_key_file: str, roles: tuple[str, ...],
                         tokens: int, forced_fallback: bool = False,
                         timeout: float = REQUEST_TIMEOUT_SECONDS) -> str:
        return "curl"

    def command(self, url: str, master_key_file: str, roles: tuple[str, ...], tokens: int,
                forced_fallback: bool = False,
                timeout: float = REQUEST_TIMEOUT_SECONDS) -> StringCommand:
        extra = {"mock_testing_fallbacks": True} if forced_fallback else {}
        asked = [word for role in roles
                 for word in (role, json.dumps(probes.chat_body(role, tokens, **extra)))]
        # The roles first, so that an error before any request is each role's.
        # Then every request at once, each into its own file (headers, the body,
        # the status and time, and curl's own error, if any), and each file in order.
        script = f"echo {shlex.quote('@@roles ' + ' '.join(roles))}; " + keys.keyed_curl(
            'm=$2; url=$3; shift 3; out=$(mktemp -d) || exit 1; trap \'rm -rf "$out"\' EXIT; '
            'while [ $# -ge 2 ]; do '
            'ask -sS -m "$m" -D - -H "Content-Type: application/json" --data-binary "$2" '
            '-w "\\ncurl-result %{http_code} %{time_total} %{url_effective}\\n" '
            '"$url/v1/chat/completions" > "$out/$1" 2>&1 & shift 2; done; wait; '
            'for f in "$out"/*; do echo "@@answer ${f##*/}"; cat "$f"; done'
        )
        return shell_script(script, master_key_file, str(float(timeout)), url, *asked)

    def process(self, output: list[str]) -> dict[str, probes.Answer]:
        roles: list[str] = []
        before: list[str] = []
        chunks: dict[str, list[str]] = {}
        for line in output:
            if line.startswith("@@roles "):
                roles = line.split()[1:]
            elif line.startswith("@@answer "):
                chunks[line.split(" ", 1)[1]] = []
            elif chunks:
                chunks[list(chunks)[-1]].append(line)
            else:
                before.append(line)
        return {role: parse_answer(before + chunks.get(role, [])) for role in roles}


def parse_answer(output: list[str]) -> probes.Answer:
    """:class:`probes.Answer` from curl's ``-D -`` headers, body and ``curl-result`` line."""
    url = "the proxy"
    headers: dict[str, str] = {}
    body_lines: list[str] = []
    status: int | None = None
    seconds = 0.0
    errors = []
    in_headers = False
    for raw in output:
        line = raw.rstrip("\r")
        if line.startswith("keyfile-unreadable "):
            errors.append(f"the master key file {line.split(' ', 1)[1]} cannot be read")
        elif line.startswith("curl-result "):
            _, code, elapsed, url = line.split(" ", 3)
            status = int(code) or None
            seconds = float(elapsed)
        elif line.startswith("curl: "):
            errors.append(line)
        elif line.startswith("HTTP/") and not body_lines:
            in_headers, headers = True, {}
        elif in_headers and not line:
            in_headers = False
        elif in_headers:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            body_lines.append(line)
    text = "\n".join(body_lines).strip()
    try:
        body: object = json.loads(text)
    except ValueError:
        body = text
    return probes.Answer(url, status, body, headers, "; ".join(errors) or None, seconds)


# Evidence


def ask(proxy: Proxy, roles: tuple[str, ...], tokens: int,
        forced_fallback: bool = False) -> dict[str, probes.Answer]:
    """A real completion through each of ``roles`` at once, asked on the gateway."""
    return host.get_fact(RoleAnswers, url=proxy.url, master_key_file=proxy.master_key_file,
                         roles=roles, tokens=tokens, forced_fallback=forced_fallback)


def answer_problems(role: str, answer: probes.Answer, deployment: str,
                    tokens: int) -> list[str]:
    """Why ``answer`` is not a real completion through ``role`` served by ``deployment``."""
    found = probes.completion_problems(answer, tokens)
    served = answer.headers.get("x-litellm-model-id")
    if not found and served != deployment:
        fallbacks = answer.headers.get("x-litellm-attempted-fallbacks", "absent")
        found.append(f"it was served by deployment {served!r}, not {deployment!r} "
                     f"(x-litellm-attempted-fallbacks: {fallbacks})")
    return [f"role {role}: {problem}" for problem in found]


def large_problems(proxy: Proxy, tokens: int) -> list[str]:
    """
    Why ``large`` does not answer through the proxy. A proxy whose process runs but
    which takes no connection yet is starting (a run cut just after restarting it
    leaves it so), not broken: it is waited for, up to its start bound.
    """
    def check(seconds_left: float) -> tuple[list[str], bool]:
        answer = ask(proxy, ("large",), tokens)["large"]
        found = answer_problems("large", answer, DEPLOYMENTS["large"], tokens)
        return found, answer.status is None and proxy_workers(proxy) is not None

    outcome: dict = {}
    probes.wait_until(f"the large role answers through the proxy at {proxy.url}", check,
                      START_TIMEOUT_SECONDS, outcome)
    return outcome["found"]


def roles_problems(proxy: Proxy, fallback: bool, tokens: int, proofs: Proofs) -> list[str]:
    """
    A real request through each role, served by the deployment the ``fallback``
    implies; asked once per run while the same proxy process serves.
    """
    expected = serving_deployments(fallback)
    answered = Proven(host.name, proxy.service, "answers", fallback)
    return proofs.once(answered, proxy_workers(proxy), lambda: [
        problem for role, answer in ask(proxy, ROLES, tokens).items()
        for problem in answer_problems(role, answer, expected[role], tokens)])


# Operations


# What to do about the refusal a newcomer meets first: an experiment asked of a
# lab or site whose production (and so its gateway) was never converged.
NEVER_CONVERGED = ("fix: make the large role answer; if production was never converged "
                   "here, converge it first: pyinfra inventory.py deploy.py --data "
                   "state=production")


@operation(LAYER, is_idempotent=True)
def admissible(proxy: Proxy | None, fallback: bool,
               tokens: int = PROOF_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Refuse, before anything changes, a target that borrows the GPUs while the
    ``large`` role does not answer: ``small`` would have nowhere to fall back to.

    + proxy: the gateway's :class:`Proxy`; ``None`` elsewhere (a no-op)
    + fallback: whether the target needs the fallback ``small -> large`` (its replicas are down)
    + tokens: the length of the real completion asked of ``large``

    **Example:**

    .. code:: python

        route.admissible(name="Preflight: the large role answers", proxy=proxy,
                           fallback=True)
    """
    if elsewhere(proxy, "gateway"):
        return
    if not fallback:
        host.noop("the replicas keep serving small: no fallback needed")
        return
    found = large_problems(proxy, tokens)
    if found:
        refuse(LAYER, [*found, "small would have nowhere to fall back to while the "
                               "replicas are down", NEVER_CONVERGED])
    host.noop("the large role answers: small has somewhere to fall back to")
    yield from ()


@operation(LAYER, is_idempotent=True)
def fallback_proven(proxy: Proxy | None, tokens: int = PROOF_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Prove the fallback before anything stops: a request to ``small`` that forces
    the fallback path (``mock_testing_fallbacks``) must be answered by the
    ``large`` deployment.

    + proxy: the gateway's :class:`Proxy`; ``None`` elsewhere (a no-op)
    + tokens: the length of the real completion asked for

    **Example:**

    .. code:: python

        route.fallback_proven(name="Gateway: a forced fallback through small reaches large",
                                proxy=proxy)
    """
    if elsewhere(proxy, "gateway"):
        return
    if not executing():
        host.noop("proven when the run executes, once the fallback is in place")
        return
    answer = ask(proxy, ("small",), tokens, forced_fallback=True)["small"]
    found = answer_problems("small", answer, DEPLOYMENTS["large"], tokens)
    if found:
        yield failing(LAYER, ["a forced fallback through small did not reach large", *found])
        return
    host.noop(f"a forced fallback through small was served by large ({answer.seconds:.2f}s)")


@operation(LAYER, is_idempotent=True)
def roles_proven(proxy: Proxy | None, fallback: bool, proofs: Proofs,
                 tokens: int = PROOF_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Prove the user's route: a real request through each role answers, served by
    the deployment the state implies (``small`` by the replicas behind the
    router, or by ``large`` through the fallback while they are down).

    + proxy: the gateway's :class:`Proxy`; ``None`` elsewhere (a no-op)
    + fallback: whether ``small`` falls back to ``large`` (the replicas are down)
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`
    + tokens: the length of each real completion

    **Example:**

    .. code:: python

        route.roles_proven(name="Gateway: small answers through the fallback",
                                   proxy=proxy, fallback=True, proofs=run.proofs)
    """
    if elsewhere(proxy, "gateway"):
        return
    if not executing():
        host.noop("proven when the run executes")
        return
    found = roles_problems(proxy, fallback, tokens, proofs)
    if found:
        yield failing(LAYER, found)
        return
    expected = serving_deployments(fallback)
    host.noop(", ".join(f"{role} is served by {expected[role]}" for role in ROLES))


@operation(LAYER, is_idempotent=True)
def verified(proxy: Proxy | None, fallback: bool, proofs: Proofs,
             tokens: int = PROOF_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Prove the gateway is as the state declares, with the evidence if not: the
    config's fallbacks match it (the general one only with ``fallback``), the
    running proxy routes as its config says, and each role is served by the
    deployment the state implies.

    + proxy: the gateway's :class:`Proxy`; ``None`` elsewhere (a no-op)
    + fallback: whether the state carries the temporary fallback ``small -> large``
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`, proofs made earlier in the run
    + tokens: the length of each real completion

    **Example:**

    .. code:: python

        route.verified(name="Verify: the gateway", proxy=proxy, fallback=False,
                               proofs=run.proofs)
    """
    if elsewhere(proxy, "gateway"):
        return
    if not executing():
        host.noop("verified when the run executes")
        return
    wanted = wanted_routing(proxy, fallback)
    found = routing_problems(f"the config {proxy.config_file}",
                             host.get_fact(ProxyConfig, path=proxy.config_file), wanted,
                             "the state declares")
    found += (live_problems(proxy, fallback, proofs)
              or roles_problems(proxy, fallback, tokens, proofs))
    if found:
        yield failing(LAYER, found)
        return
    host.noop(f"the gateway routes as declared, the fallback {'present' if fallback else 'absent'}")
