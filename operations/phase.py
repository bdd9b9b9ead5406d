"""
Whether pyinfra is executing operations or only detecting what they would change.

Without ``-y`` (and with ``--dry``) pyinfra runs every operation body once to
predict changes, before anything is executed. A verification that depends on an
earlier operation's effect cannot judge then: it predicts, and judges for real
when the body runs again at execute time.
"""

from pyinfra import host, state
from pyinfra.api.state import StateStage


def executing() -> bool:
    """True while operations execute; false while pyinfra only predicts changes."""
    return state.current_stage == StateStage.Execute


def elsewhere(settings: object | None, role: str) -> bool:
    """
    Whether this host has no part in an operation (its settings are ``None``).

    deploy.py calls the serving and gateway operations on every host, each host
    passing the settings it has and ``None`` for the rest: pyinfra orders
    operations across hosts only through the operations they share, so a
    gateway-only step could otherwise run before the workstations' steps above it.
    """
    if settings is None:
        host.noop(f"this host is not a {role}")
        return True
    return False
