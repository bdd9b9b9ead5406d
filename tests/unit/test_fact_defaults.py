"""
pyinfra never hands a fact an empty output: a command that prints nothing
gets the fact's ``default()``. So wherever ``process([])`` has a meaning, the
default must say the same, or an operation meets ``None`` where it expects
"nothing there" (thunderbolt0 read between ``rmmod`` and the next load).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from pyinfra.api import FactBase

import operations

FACTS = sorted(
    {cls for module in pkgutil.walk_packages(operations.__path__, "operations.")
     for _, cls in inspect.getmembers(importlib.import_module(module.name),
                                      inspect.isclass)
     if issubclass(cls, FactBase) and cls.__module__.startswith("operations.")},
    key=lambda cls: cls.__name__)


@pytest.mark.parametrize("fact", FACTS, ids=lambda cls: cls.__name__)
def test_an_empty_output_means_what_pyinfra_returns_for_it(fact: type[FactBase]) -> None:
    try:
        meaning = fact().process([])
    except (IndexError, KeyError, ValueError):
        pytest.skip(f"{fact.__name__} always prints something")
    assert fact().default() == meaning
