"""
What a harness reads of a host for a layer, and what the layer's judge says of it.

The harness reads hosts outside a pyinfra run, several facts in one SSH round
trip (``harness.hosts.remote``). Which facts, with which arguments, is each
layer's own knowledge: a layer exports its reading (a list of :class:`Query`,
each fact filed under a key) and a judge of the values read, so that every
reader of a host (status, diagnose, the counters, ``tests/verify``) reads and
judges the layer as the layer does, never by a copy of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyinfra.api import FactBase

from operations.plumbing.facts import raw_command


@dataclass(frozen=True)
class Query:
    """One fact to read: the name its value is filed under, the fact, its arguments."""

    key: str
    fact: FactBase
    arguments: dict[str, Any] = field(default_factory=dict)

    def command(self) -> str:
        return raw_command(self.fact, self.arguments)


@dataclass(frozen=True)
class Judgement:
    """
    A layer's judge on one host: what it observed (values and the line an
    operator reads, by name) and what is wrong, in the layer's words; none if
    the layer holds.
    """

    observed: dict[str, Any]
    problems: list[str] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        """What an operator reads of it, a line each: its ``seen``, one line or several."""
        seen = self.observed.get("seen", [])
        return [seen] if isinstance(seen, str) else list(seen)
