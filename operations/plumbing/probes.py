"""
Real requests from the machine that runs pyinfra, and bounded waits for them.

Acceptance is a served request, not a process or a green ``/health`` (the field
report's second lesson), and it is asked the way a client asks: over the
network, from outside the host. So the operator's machine must reach each
server's port (a site documents that in README.md); in exchange the probe
needs nothing on the hosts, sees the route clients use, and parses JSON in
Python rather than in a shell.

Nothing here knows SGLang's server layout beyond the OpenAI-compatible chat
API: the serving and gateway layers both use it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import httpx
from pyinfra import host, logger

ACCEPTANCE_PROMPT = "twinbolt acceptance: describe the cable between the two workstations."
# Each wait prints where it stands this often, so a long start is never silent.
PROGRESS_SECONDS = 5.0
# A wait asks again after an eighth of the time it has waited so far, within
# these bounds: what comes up in a second is seen a quarter of a second later,
# and a model that loads for fifteen minutes is asked every 2 s, not every second.
POLL_FRACTION = 1 / 8
POLL_SECONDS_MIN = 0.25
POLL_SECONDS_MAX = 2.0
# How long one proof's request may take.
REQUEST_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Answer:
    """One HTTP exchange: what came back, or why nothing did."""

    url: str
    status: int | None = None
    body: object = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    def describe(self) -> str:
        """A short account for evidence: the status and the start of the body, or the error."""
        if self.error:
            return f"{self.url}: {self.error}"
        text = self.body if isinstance(self.body, str) else repr(self.body)
        return f"{self.url}: HTTP {self.status} {text[:200]}"


@functools.cache
def client() -> httpx.Client:
    """
    The one HTTP client of a run. Making a client loads the CA bundle (about 27 ms
    of CPU, which in pyinfra's gevent loop stalls every host); a run asks a dozen
    times. Connections are not kept alive: a server restarted between two proofs
    must not be asked over its predecessor's socket.
    """
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def request(method: str, url: str, timeout: float, json: object = None,
            headers: dict[str, str] | None = None) -> Answer:
    """One request with a bound; every failure becomes an :class:`Answer` with its error."""
    started = time.monotonic()
    try:
        response = client().request(method, url, json=json, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return Answer(url, error=f"no answer within {timeout:g}s",
                      seconds=time.monotonic() - started)
    except httpx.HTTPError as error:
        return Answer(url, error=f"{type(error).__name__}: {error}",
                      seconds=time.monotonic() - started)
    try:
        body: object = response.json()
    except ValueError:
        body = response.text
    return Answer(url, response.status_code, body, dict(response.headers),
                  seconds=time.monotonic() - started)


def get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> Answer:
    return request("GET", url, timeout, headers=headers)


def chat_body(model: str, tokens: int, **extra: object) -> dict[str, object]:
    """
    The acceptance request for exactly ``tokens`` tokens, as a ``/v1/chat/completions`` body.

    ``ignore_eos`` keeps SGLang from stopping early at an end-of-sequence token,
    so the count asked for is the count a working server returns.
    """
    return {
        "model": model,
        "messages": [{"role": "user", "content": ACCEPTANCE_PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


def chat_completion(base_url: str, model: str, tokens: int, timeout: float,
                    headers: dict[str, str] | None = None, **extra: object) -> Answer:
    """Ask ``base_url``'s ``/v1/chat/completions`` for :func:`chat_body`."""
    return request("POST", f"{base_url}/v1/chat/completions", timeout,
                   json=chat_body(model, tokens, **extra), headers=headers)


def completion_problems(answer: Answer, tokens: int) -> list[str]:
    """Why ``answer`` is not a real completion of ``tokens`` tokens; empty when it is."""
    if not answer.ok:
        return [f"no completion: {answer.describe()}"]
    try:
        content = answer.body["choices"][0]["message"]["content"]
        completion_tokens = answer.body["usage"]["completion_tokens"]
    except (KeyError, IndexError, TypeError):
        return [f"not a chat completion: {answer.describe()}"]
    found = []
    if not content or not content.strip():
        found.append("the completion is empty")
    if completion_tokens != tokens:
        found.append(f"the completion has {completion_tokens} tokens, {tokens} were asked for")
    return found


def green_health(url: str, timeout: float = 5.0) -> list[str]:
    """
    What to add to a failed completion when the server's ``/health`` is green:
    that it proves nothing (rank 1's is a dummy; a hung rank 0's stays 200).
    """
    return ["its /health answers 200, which proves nothing"] if get(
        f"{url}/health", timeout).ok else []


# What a proof is of: a server served a real completion as declared
# (``serves``); the gateway's proxy routes as its config says (``routes``); each
# public role answered through it from the deployment it should (``answers``).
Claim = Literal["serves", "routes", "answers"]
# The process that passed a proof, or a server's processes (its main one and
# its workers) by their pids.
Pids = int | tuple[int, ...]


@dataclass(frozen=True)
class Proven:
    """
    One proof a run can make once: ``claim`` about ``service`` on ``host``; for
    the gateway's claims, with its temporary fallback present or absent.
    """

    host: str
    service: str
    claim: Claim = "serves"
    fallback: bool | None = None


@dataclass
class Proofs:
    """
    The proofs this run has made, each with the pid of the process that passed
    it (or the pids of the processes, for a server whose workers answer: the
    gateway's proxy). A run proves a server once: verifying it after its acceptance asks again
    only if another process serves now (restarted, replaced, crashed). A run is
    one process, the rollback another, so each starts with none.
    """

    pids: dict[Proven, Pids] = field(default_factory=dict)

    def remember(self, proven: Proven, pid: Pids) -> None:
        """Record that process ``pid`` passed the proof ``proven``."""
        self.pids[proven] = pid

    def made(self, proven: Proven, pid: Pids | None) -> bool:
        """Whether process ``pid`` passed the proof ``proven`` earlier in this run."""
        return pid is not None and self.pids.get(proven) == pid

    def once(self, proven: Proven, pid: Pids | None,
             prove: Callable[[], list[str]]) -> list[str]:
        """
        What ``prove()`` finds wrong, unless process ``pid`` passed ``proven``
        earlier in this run; a proof that finds nothing is remembered for ``pid``.
        """
        if self.made(proven, pid):
            return []
        found = prove()
        if not found and pid:
            self.remember(proven, pid)
        return found


def poll_interval(elapsed: float) -> float:
    """How long a wait that has waited ``elapsed`` seconds sleeps before it asks again."""
    return min(POLL_SECONDS_MAX, max(POLL_SECONDS_MIN, elapsed * POLL_FRACTION))


def wait_until(what: str, check: Callable[[float], tuple[list[str], bool]], timeout: float,
               outcome: dict) -> bool:
    """
    Poll ``check`` until it finds nothing, printing progress, for at most ``timeout`` seconds.

    ``check`` is given the seconds left (to bound its own requests) and returns
    what is still wrong and whether waiting can still help (a process that died
    will not serve by waiting). Run as a pyinfra
    ``FunctionCommand``; the operation that yields it reads ``outcome["found"]``
    afterwards and raises with the evidence, so the failure reads like any other
    operation error instead of a traceback from a callback.
    """
    started = time.monotonic()
    next_report = started + PROGRESS_SECONDS
    while True:
        found, worth_waiting = check(max(1.0, timeout - (time.monotonic() - started)))
        elapsed = time.monotonic() - started
        if not found:
            logger.info(f"    [{host.name}] {what}: yes, after {elapsed:.1f}s")
            outcome["found"] = []
            return True
        if not worth_waiting:
            outcome["found"] = [*found, f"(gave up after {elapsed:.0f}s: waiting cannot help)"]
            return True
        if elapsed >= timeout:
            outcome["found"] = [*found, f"(timed out after {timeout:g}s)"]
            return True
        if time.monotonic() >= next_report:
            logger.info(f"    [{host.name}] waiting for {what} ({elapsed:.0f}s of {timeout:g}s): "
                        + "; ".join(found))
            next_report += PROGRESS_SECONDS
        time.sleep(poll_interval(elapsed))


def stopped_at_bound(what: str, seconds: float, check: str) -> str:
    """
    How a process stopped at its bound reads, wherever one is run (the rollback,
    the campaign's deploys, the inventory's listing): what was stopped, after
    how long, and what to check.
    """
    return f"{what} did not end within its bound of {seconds:g}s and was stopped; check {check}"

