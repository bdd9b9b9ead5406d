"""
What twinbolt's facts share.

pyinfra never calls a fact's ``process`` with an empty output: a command that
prints nothing gets ``default()``, which is ``None`` unless the fact says
otherwise. For a fact whose empty output has a meaning (no such interface, no
such file, no process), ``None`` is the wrong answer at the worst moment, say
``thunderbolt0`` read between ``rmmod`` and the next load.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase


class EmptyMeansSomething(FactBase):
    """A fact whose empty output means what ``process([])`` says it means."""

    def default(self) -> Any:
        return self.process([])
