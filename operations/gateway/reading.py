"""
The gateway layer as a harness reads the gateway: the proxy's service, its
routing as the running proxy reports it and as its file says, and the user's
roles answering through it.

Status and diagnose read the same facts as the proxy step, and judge the
routing by the layer's judge (:func:`fallback_present`).
"""

from __future__ import annotations

from typing import Any

from operations.gateway.proxy import (
    ROLES,
    LiveRouting,
    ProxyConfig,
    fallback_present,
    serving_deployments,
)
from operations.gateway.route import RoleAnswers, answer_problems
from operations.plumbing.reading import Judgement, Query
from operations.services import RunningServices
from operations.site.settings import GatewaySettings


def reading(settings: GatewaySettings) -> list[Query]:
    """
    Whether the proxy runs, its routing as the running proxy reports it (the
    truth), and as its file says (what it would load next).
    """
    roles = settings.roles
    return [
        Query("proxy", RunningServices(), {"prefix": roles.litellm_service,
                                           "init_system": roles.init_system}),
        Query("live", LiveRouting(), {"url": settings.proxy_url,
                                      "master_key_file": roles.master_key_file}),
        Query("config", ProxyConfig(), {"path": roles.litellm_config_file}),
    ]


def roles(settings: GatewaySettings, tokens: int, timeout: float) -> list[Query]:
    """Each user's role asked for a completion of ``tokens``, within ``timeout`` each."""
    return [Query("roles", RoleAnswers(),
                  {"url": settings.proxy_url, "master_key_file": settings.roles.master_key_file,
                   "roles": ROLES, "tokens": tokens, "timeout": timeout})]


def judge(settings: GatewaySettings, values: dict[str, Any]) -> Judgement:
    """
    Whether the running proxy sends small to large on any error (``fallback``,
    ``None`` when its API does not answer) and the line an operator reads
    (``seen``); a problem if the proxy does not answer.
    """
    proxy = settings.roles.litellm_service
    live = values["live"]
    in_file = fallback_present(values["config"] or {})
    file_text = f"config file: general fallback {'present' if in_file else 'absent'}"
    if live is None:
        running = proxy in values["proxy"]
        return Judgement({"fallback": None,
                          "seen": f"{proxy} {'running' if running else 'stopped'}, "
                                  f"its API does not answer; {file_text}"},
                         [f"{proxy} does not answer"])
    general = live["fallbacks"].get("small", [])
    context = live["context_window_fallbacks"].get("small", [])
    return Judgement({"fallback": fallback_present(live),
                      "seen": f"{proxy}: small -> {', '.join(general) or 'nothing'} on any "
                              f"error; small -> {', '.join(context) or 'nothing'} on context "
                              f"overflow; {file_text}"})


def judge_roles(values: dict[str, Any], fallback: bool, tokens: int) -> list[Judgement]:
    """
    Each role's answer (read by :func:`roles`), served as ``fallback`` implies
    (small on large, or on its own): who served it and how fast (``seen``), and
    why it is not the completion of ``tokens`` it should be.
    """
    expected = serving_deployments(fallback)
    return [Judgement({"seen": f"role {role}: served by "
                               f"{answer.headers.get('x-litellm-model-id', 'nobody')} "
                               f"in {answer.seconds:.2f}s"},
                      answer_problems(role, answer, expected[role], tokens))
            for role, answer in values["roles"].items()]
