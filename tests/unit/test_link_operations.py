"""The link layer's operation: wait when waiting can help, fail with the rates when not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from operation_harness import run_operation
from pyinfra.api import OperationError

from operations import link
from operations.link import InterfaceState, PeerAnswers, XDomainLink

LINK = dict(interface="thunderbolt0", address="169.254.77.1", peer_address="169.254.77.2")


def facts(carrier: bool = True, speed: float = 20.0, lanes: int = 1, answers: bool = True):
    values = {
        XDomainLink: {"device": "0-1", "peer": "wsb", "rx_speed_gbps": speed,
                      "tx_speed_gbps": speed, "rx_lanes": lanes, "tx_lanes": lanes},
        InterfaceState: {"exists": True, "carrier": carrier, "addresses": ["169.254.77.1"]},
        PeerAnswers: answers,
    }
    return lambda cls, kwargs: values[cls]


def test_xdomain_fact_reads_speed_and_lanes() -> None:
    assert XDomainLink().process(["0-1|wsb|20.0 Gb/s|10.0 Gb/s|2|1"]) == {
        "device": "0-1", "peer": "wsb", "rx_speed_gbps": 20.0, "tx_speed_gbps": 10.0,
        "rx_lanes": 2, "tx_lanes": 1}
    assert XDomainLink().process([]) is None


def test_interface_fact_reads_carrier_and_addresses() -> None:
    assert InterfaceState().process(["carrier 1", "address 169.254.77.1/24"]) == {
        "exists": True, "carrier": True, "addresses": ["169.254.77.1"]}
    assert InterfaceState().process([])["exists"] is False


def test_a_trained_link_is_a_noop() -> None:
    assert run_operation(link.trained, facts(), **LINK) == []


def test_a_link_coming_back_is_waited_for() -> None:
    assert run_operation(link.trained, facts(carrier=False), **LINK) == ["call wait_until"]
    assert run_operation(link.trained, facts(answers=False), **LINK) == ["call wait_until"]


def test_preflight_does_not_wait() -> None:
    with pytest.raises(OperationError, match="wsa: link layer: thunderbolt0 has no carrier"):
        run_operation(link.trained, facts(carrier=False), wait=False, **LINK)


def test_a_link_at_the_wrong_rate_names_the_rate_seen_and_expected() -> None:
    [failure] = run_operation(link.trained, facts(speed=10.0), **LINK)
    assert failure.startswith("fail: link layer: the link to wsb trained at 10 Gb/s over 1 ")
    assert "expected 20 Gb/s over 1" in failure
    [failure] = run_operation(link.trained, facts(lanes=2), **LINK)
    assert "trained at 40 Gb/s over 2 lane" in failure


def test_while_predicting_a_wrong_rate_is_expected_to_retrain() -> None:
    assert run_operation(link.trained, facts(speed=10.0), executing=False, **LINK) == [
        "call wait_until"]


def test_a_link_the_target_does_not_use_is_a_warning_not_a_failure() -> None:
    assert run_operation(link.trained, facts(speed=10.0), needed=False, **LINK) == ["call warn"]
    assert run_operation(link.trained, facts(carrier=False), needed=False, **LINK) == [
        "call wait_until"]


def test_the_warning_runs_as_pyinfra_runs_it_and_names_host_and_evidence() -> None:
    logged = []
    wsa = SimpleNamespace(name="wsa", log_styled=lambda message, **_: logged.append(message))
    command = link.shortfall(["the link to wsb trained at 10 Gb/s"], needed=False)
    assert command.execute(None, wsa, {}) is True
    assert logged == ["wsa: link layer: the link to wsb trained at 10 Gb/s (the target state "
                      "does not use the link; fix it before the next experiment)"]
