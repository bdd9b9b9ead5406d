"""
The named states of the experiment, each a value of four layers.

One registry, so that ``deploy.py``, the testinfra checks and the campaign all
mean the same thing by a state's name, and so that "change one layer at a time"
(the field report's third lesson) is something code can check: two states differ
exactly in the layers :func:`layers_changed` returns.
"""

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict
from pyinfra.api.exceptions import PyinfraError


class _Value(BaseModel):
    # Frozen: a state is a value; nothing downstream may edit the registry's copy.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Driver(StrEnum):
    """
    What ``thunderbolt_net`` runs: the distribution's build, the same build with
    receive-side E2E off (``e2e=0``), or the pinned candidate with ``tx_e2e=1``.

    The one place a build is spelled: code compares members and asks their
    properties, never the strings, which are only what the reports, the ledger
    and the status show.
    """

    STOCK = "stock"
    STOCK_E2E_OFF = "stock_e2e_off"
    CANDIDATE = "candidate"

    @property
    def is_candidate(self) -> bool:
        """The pinned out-of-tree build, never persistent, that a stall is recorded against."""
        return self is Driver.CANDIDATE

    @property
    def tx_e2e(self) -> bool:
        """Whether it is loaded with transmit-side E2E (``tx_e2e=1``): only the candidate."""
        return self is Driver.CANDIDATE

    @property
    def rx_e2e(self) -> bool:
        """Whether it is loaded with receive-side E2E on (``parameters/e2e`` reads ``Y``)."""
        return self is not Driver.STOCK_E2E_OFF

    @property
    def modprobe_options(self) -> tuple[str, ...]:
        """What ``modprobe`` is given for a stock build."""
        return ("e2e=0",) if self is Driver.STOCK_E2E_OFF else ()


STOCK_BUILDS = tuple(driver for driver in Driver if not driver.is_candidate)


class Speculative(_Value):
    """
    The speculative decoder's settings, passed to SGLang as
    ``--speculative-algorithm``, ``--speculative-num-steps``,
    ``--speculative-eagle-topk`` and ``--speculative-num-draft-tokens``.
    """

    # NEXTN uses the model's own MTP head; SGLang reports it back as EAGLE.
    algorithm: Literal["NEXTN"]
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int


class ServingMode(StrEnum):
    """
    What a state serves: one replica per workstation behind the router, or one
    server split across every workstation (a TP group of one rank each).

    The one place a mode is spelled: code compares members, never the strings,
    which are only what the reports and the status show. ``tp2`` names the mode
    as the field report does; the group's size is the site's to say.
    """

    REPLICAS = "replicas"
    TENSOR_PARALLEL = "tp2"

# The field report's setting, written "NEXTN 3/1/4" in the README's states table.
NEXTN_3_1_4 = Speculative(algorithm="NEXTN", num_steps=3, eagle_topk=1, num_draft_tokens=4)


class State(_Value):
    """
    One named state: what each layer must be for the hosts to be in it.

    + driver: ``stock`` (the distribution's ``thunderbolt_net``), ``stock_e2e_off``
      (the same build loaded with ``e2e=0``: receive-side E2E off, the field
      report's control) or ``candidate`` (the pinned out-of-tree module, loaded
      with ``tx_e2e=1``)
    + serving: ``replicas`` (one single-GPU server per workstation, behind the
      router) or ``tp2`` (one server split across the workstations)
    + speculative: the speculative decoder's settings, or ``None`` for none

    Everything else is derived from these three, never declared beside them:
    a TP state is the one whose replicas are down, so the gateway's temporary
    fallback follows from ``serving``; the link must hold wherever a TP group
    crosses it or a driver other than the plain stock build is on trial.
    """

    name: str
    driver: Driver
    serving: ServingMode
    speculative: Speculative | None

    @property
    def tensor_parallel(self) -> bool:
        """Whether the state serves one TP group rather than the replicas."""
        return self.serving == ServingMode.TENSOR_PARALLEL

    @property
    def uses_link(self) -> bool:
        """
        Whether the link must be up and proven, a stall of it a failure: a TP
        group talks across it, and a driver other than the plain stock build is
        itself the experiment, even under the replicas, which never use it.
        """
        return self.tensor_parallel or self.driver != Driver.STOCK

    @property
    def gateway_fallback(self) -> bool:
        """
        Whether the gateway carries the temporary general fallback ``small ->
        large``: exactly while the replicas that serve ``small`` are down.
        """
        return self.tensor_parallel


# The axes a state is declared by, in the README's order, which is also the order
# a transition changes them in; and what it declares of its four layers (what a
# status compares), the gateway's fallback following from the serving layer.
# ("Layer" alone is a step's: operations.step.Layer.)
AXES = ("driver", "serving", "speculative")
DECLARED = (*AXES, "gateway_fallback")

STATES: dict[str, State] = {
    state.name: state
    for state in (
        State(
            name="production",
            driver=Driver.STOCK,
            serving=ServingMode.REPLICAS,
            speculative=None,
        ),
        # The transport A/B: production's replicas, which never use the link, under
        # another driver, so that the network-only window borrows no GPU and the
        # user's route never falls back. The candidate, and the report's control,
        # the stock build with receive-side E2E off.
        State(
            name="production_tx_e2e",
            driver=Driver.CANDIDATE,
            serving=ServingMode.REPLICAS,
            speculative=None,
        ),
        State(
            name="production_e2e_off",
            driver=Driver.STOCK_E2E_OFF,
            serving=ServingMode.REPLICAS,
            speculative=None,
        ),
        State(
            name="tp2_stock",
            driver=Driver.STOCK,
            serving=ServingMode.TENSOR_PARALLEL,
            speculative=NEXTN_3_1_4,
        ),
        State(
            name="tp2_e2e",
            driver=Driver.CANDIDATE,
            serving=ServingMode.TENSOR_PARALLEL,
            speculative=NEXTN_3_1_4,
        ),
        # The two _nospec states are the matched controls the field report lacked:
        # they separate the driver's effect from the speculative decoder's.
        State(
            name="tp2_stock_nospec",
            driver=Driver.STOCK,
            serving=ServingMode.TENSOR_PARALLEL,
            speculative=None,
        ),
        State(
            name="tp2_e2e_nospec",
            driver=Driver.CANDIDATE,
            serving=ServingMode.TENSOR_PARALLEL,
            speculative=None,
        ),
    )
}


class UnknownState(PyinfraError, ValueError):
    """
    A state name that is not in the registry, or no name at all.

    A ``PyinfraError`` so that, raised anywhere in a pyinfra run, the CLI prints
    the message and exits non-zero instead of dumping a traceback.
    """


def resolve_state(name: str | None) -> State:
    """
    The state called ``name``; :class:`UnknownState` listing the valid names if
    there is none, so a typo is answered with the list to pick from.
    """

    if isinstance(name, str) and name in STATES:
        return STATES[name]
    choices = ", ".join(STATES)
    if name is None:
        raise UnknownState(f"no state given (--data state=NAME); the states are: {choices}")
    raise UnknownState(f"unknown state {name!r}; the states are: {choices}")


def layers_changed(a: State, b: State) -> list[str]:
    """
    The declared layers that differ between two states, in :data:`AXES` order.

    The campaign refuses a step that changes more than one, so that every
    measured difference has a single cause; the gateway's fallback is no cause
    of its own, it follows the serving layer.
    """

    return [axis for axis in AXES if getattr(a, axis) != getattr(b, axis)]
