"""
The proxy's front: haproxy on the users' port, retrying what a reload closed.

A reload of LiteLLM keeps its port (gunicorn's master holds the socket), but
one race is left inside it: a connection a retiring worker accepted in the
instant before its ``SIGTERM``, whose request it had not yet read, is closed
unanswered (uvicorn's worker, shutting down, closes every connection with no
request in progress). Nothing in LiteLLM, gunicorn or uvicorn can close that
race; something in front of them that sends such a request again can. So
clients reach the proxy through haproxy, Debian's and Ubuntu's package, on
``gateway_roles.litellm_port``; LiteLLM listens behind it on the gateway's
loopback alone (``litellm_backend_port``). haproxy sends a request again,
to a new connection and so to a new worker, when the connection failed or
closed before any byte of an answer (``retry-on conn-failure
empty-response``): such a request never reached LiteLLM's router, so sending
it again repeats no completion. A request that got any answer, an error
included, is never sent twice.

The front's config changes only with the site's ports: its change restarts
it (an upgrade, not an experiment). Every reload of LiteLLM's routing leaves
the front alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.util import get_template
from pyinfra.facts.files import File
from pyinfra.operations import apt, files

from operations import services
from operations.plumbing.facts import FileDigest, digest
from operations.services import InitSystem, Service

# Debian's and Ubuntu's package, and where it puts the binary.
PACKAGE = "haproxy"
BINARY = "/usr/sbin/haproxy"
TEMPLATE = services.TEMPLATES / "front.cfg.j2"
# The front of the proxy service NAME is the service NAME-front, its config
# NAME-front.cfg beside the proxy's own.
SUFFIX = "-front"
# LiteLLM's own bound on a request (its request_timeout, 600 s): the front
# never gives up on an answer before LiteLLM would.
ANSWER_TIMEOUT_SECONDS = 600
# How many times a request closed unanswered is sent again: a reload retires
# two workers, and each may close one connection.
RETRIES = 3
# The largest request the front can send again, which it must hold whole
# (haproxy's tune.bufsize): a prompt of some 200 KiB of text. A larger one
# goes through as well, but is not retried.
RETRYABLE_REQUEST_BYTES = 262_144


@dataclass(frozen=True)
class Front:
    """The front of a proxy service: where users connect, and where LiteLLM listens behind it."""

    service: str
    config_file: str
    listen_address: str
    port: int
    backend_port: int
    user: str
    init_system: InitSystem

    @classmethod
    def of(cls, proxy_service: str, proxy_config_file: str, listen_address: str, port: int,
           backend_port: int, user: str, init_system: InitSystem) -> Front:
        directory = PurePosixPath(proxy_config_file).parent
        return cls(service=front_name(proxy_service),
                   config_file=str(directory / f"{proxy_service}{SUFFIX}.cfg"),
                   listen_address=listen_address, port=port, backend_port=backend_port,
                   user=user, init_system=init_system)


def front_name(proxy_service: str) -> str:
    """The name of the service in front of the proxy service ``proxy_service``."""
    return f"{proxy_service}{SUFFIX}"


def front_service(front: Front) -> Service:
    """haproxy in the foreground, on the users' port, as the proxy's account."""
    return Service(
        name=front.service,
        description="haproxy: the LiteLLM proxy's front on the users' port (twinbolt)",
        command=[BINARY, "-db", "-f", front.config_file],
        user=front.user,
    )


def template_context(front: Front) -> dict[str, object]:
    return {"front": front, "answer_timeout": ANSWER_TIMEOUT_SECONDS, "retries": RETRIES,
            "buffer_bytes": RETRYABLE_REQUEST_BYTES}


def render_config(front: Front) -> str:
    """The config :func:`present` uploads, rendered locally (pyinfra's jinja2 environment)."""
    return get_template(str(TEMPLATE)).render(template_context(front))


def present(front: Front) -> Iterator[PyinfraCommand]:
    """
    Install haproxy where it is missing, render its config and keep it running;
    restarted when its config changed. The caller waits for the proxy behind it.
    """
    if not host.get_fact(File, path=BINARY):
        yield from apt.packages._inner(packages=[PACKAGE], update=True)
    config_changed = (host.get_fact(FileDigest, path=front.config_file)
                      != digest(render_config(front), "644"))
    if config_changed:
        yield from files.template._inner(src=str(TEMPLATE), dest=front.config_file, mode="644",
                                         **template_context(front))
    yield from services.present._inner(service=front_service(front),
                                       init_system=front.init_system, restarted=config_changed)
