"""Lab knobs: what real hardware decides, the lab sets by environment.

Every knob is read once at start and a bad value names its variable, so a typo
in a run script stops the server instead of silently changing the physics.
Faults are the exception: they are files, read at the moment they would bite,
each for the host the simulator runs on (its own name, as a lab host's UTS
namespace gives it).
"""

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from lab.faults import switched_on
from lab.sglang_sim import __version__

REPO = Path(__file__).resolve().parents[2]


def default_faults_dir() -> Path:
    """Where ``python -m lab fault NAME on`` puts its files."""
    return Path(os.environ.get("TWINBOLT_LAB_STATE", REPO / ".lab")) / "faults"


def _in_range(value: float, metadata: Mapping[str, object]) -> bool:
    return value > 0 if metadata.get("positive") else value >= 0


class KnobError(ValueError):
    """A lab knob with a value the simulator cannot use."""


@dataclass(frozen=True)
class Knobs:
    """The simulator's physics and its files; each field is ``LAB_SGLANG_<NAME>`` unless named."""

    load_seconds: float = 1.0
    # One RTX 5090: NVIDIA's figure for its 512-bit GDDR7 memory at 28 Gb/s per pin.
    gpu_bandwidth_gb_s: float = field(default=1792.0, metadata={"positive": True})
    prefill_tokens_per_second: float = field(default=200_000.0, metadata={"positive": True})
    spec_accept_rate: float = 0.966
    peer_timeout_seconds: float = field(default=600.0, metadata={"positive": True})
    version: str = __version__
    # SGLang's own variable: how long /health waits for the scheduler's output.
    health_check_timeout: float = field(
        default=20.0, metadata={"env": "SGLANG_HEALTH_CHECK_TIMEOUT", "positive": True}
    )
    gpu_dir: Path = Path("/run/lab-gpu")
    faults_dir: Path = field(
        default_factory=default_faults_dir, metadata={"env": "LAB_FAULTS_DIR"}
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Knobs":
        """Read every knob that is set; the others keep their defaults."""
        values = {}
        for knob in fields(cls):
            name = knob.metadata.get("env", f"LAB_SGLANG_{knob.name.upper()}")
            if name not in environ:
                continue
            try:
                value = knob.type(environ[name])
            except ValueError:
                raise KnobError(
                    f"{name}={environ[name]!r} is not a valid {knob.type.__name__}"
                ) from None
            if isinstance(value, int | float) and not _in_range(value, knob.metadata):
                raise KnobError(f"{name}={environ[name]!r} is out of range")
            values[knob.name] = value
        return cls(**values)

    def fault_on(self, name: str) -> bool:
        """Whether the lab has switched fault ``name`` on for this host, as of now."""
        return switched_on(self.faults_dir, name, socket.gethostname())
