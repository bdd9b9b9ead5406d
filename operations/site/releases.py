"""
What the supported SGLang releases accept differently on the command line.

twinbolt renders one command line for every SGLang from ``serving.min_sglang_version``
(0.5.9) to the newest release the conformance tests pin (``requirements-sglang-*.lock``).
Every flag it renders parses in all of them (``tests/conformance``); some values do
not: SGLang 0.5.23's parser refuses ``--quantization marlin``, which 0.5.9's accepts,
and a server whose parser refuses its argv exits 2 ("invalid choice") at its start,
production already stopped. So the site accepts any value some supported release
accepts (:data:`QUANTIZATIONS`), and the serving layer's preflight refuses, before
any change, a value the SGLang installed on the workstation refuses.

Each value's releases were read from the ``QUANTIZATION_CHOICES`` of the releases
themselves, 0.5.9 to 0.5.23, each boundary between two consecutive releases. The
conformance tests check the table against the parser of each release the locks pin,
so it cannot drift from them unseen.

Nothing here imports pyinfra: the site model reads it when the inventory loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

QUANTIZATION = "--quantization"


@dataclass(frozen=True)
class Releases:
    """
    The SGLang releases that accept a value: from ``since`` (``None``: every
    supported one) up to, not including, ``until`` (``None``: the newest known too).
    """

    since: str | None = None
    until: str | None = None

    def accept(self, version: str) -> bool:
        found = Version(version)
        return ((self.since is None or found >= Version(self.since))
                and (self.until is None or found < Version(self.until)))

    def __str__(self) -> str:
        if self.since and self.until:
            return f"SGLang {self.since} and later, before {self.until}"
        if self.since:
            return f"SGLang {self.since} and later"
        if self.until:
            return f"SGLang before {self.until}"
        return "every supported SGLang"


EVERY = Releases()

# Every value some supported release accepts, in SGLang's own order, with the
# releases that accept it.
CHOICES: dict[str, dict[str, Releases]] = {
    QUANTIZATION: {
        "awq": EVERY,
        "fp8": EVERY,
        "mxfp8": EVERY,
        "gptq": EVERY,
        "marlin": Releases(until="0.5.20"),
        "gptq_marlin": EVERY,
        "awq_marlin": EVERY,
        "bitsandbytes": EVERY,
        "gguf": EVERY,
        "modelopt": EVERY,
        "modelopt_fp8": EVERY,
        # NVFP4 checkpoints; there is no plain "nvfp4".
        "modelopt_fp4": EVERY,
        "nvfp4_online": Releases(since="0.5.14"),
        "modelopt_mixed": Releases(since="0.5.10"),
        "petit_nvfp4": EVERY,
        "w8a8_int8": EVERY,
        "w8a8_fp8": EVERY,
        "moe_wna16": EVERY,
        "qoq": Releases(until="0.5.16"),
        "w4afp8": EVERY,
        "mxfp4": EVERY,
        "auto-round": EVERY,
        "auto-round-int8": Releases(since="0.5.15"),
        "compressed-tensors": EVERY,
        "modelslim": EVERY,
        "mxfp_w4a8": Releases(since="0.5.15"),
        "quark": Releases(since="0.5.12"),
        "quark_int4fp8_moe": EVERY,
        "quark_mxfp4": Releases(since="0.5.13"),
        "mlx_q4": Releases(since="0.5.12"),
        "mlx_q8": Releases(since="0.5.12"),
        "unquant": Releases(since="0.5.11"),
        "humming": Releases(since="0.5.16"),
    },
}

QUANTIZATIONS: tuple[str, ...] = tuple(CHOICES[QUANTIZATION])


def accepted(flag: str, version: str) -> list[str]:
    """The values of ``flag`` that SGLang ``version`` accepts, in SGLang's order."""
    return [value for value, releases in CHOICES[flag].items() if releases.accept(version)]
