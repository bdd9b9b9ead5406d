"""
Whether pyinfra is executing operations or only detecting what they would change.

Without ``-y`` (and with ``--dry``) pyinfra runs every operation body once to
predict changes, before anything is executed. A verification that depends on an
earlier operation's effect cannot judge then: it predicts, and judges for real
when the body runs again at execute time.
"""

from pyinfra import state
from pyinfra.api.state import StateStage


def executing() -> bool:
    """True while operations execute; false while pyinfra only predicts changes."""
    return state.current_stage == StateStage.Execute
