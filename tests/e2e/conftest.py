"""End-to-end tests on the embedded lab: every test starts from, and leaves, production."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_helpers import deploy, lab


@pytest.fixture(scope="session", autouse=True)
def lab_in_production() -> Iterator[None]:
    """The lab up and in production before the suite, and restored after it."""
    lab("up")
    run = deploy("production")
    assert run.returncode == 0, run.output[-3000:]
    yield
    run = deploy("production")
    assert run.returncode == 0, run.output[-3000:]
