"""
Every systemd unit twinbolt renders, read by systemd itself (``systemd-analyze
verify``): a key or a value systemd does not know, a quote it splits otherwise, a
target that does not exist fails here, not in a workstation's journal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance_helpers import systemd_complaints


@pytest.mark.parametrize("hosts", ["rendered", "lab_rendered"], ids=["site", "lab"])
def test_every_rendered_unit_passes_systemd_analyze_verify(request: pytest.FixtureRequest,
                                                           hosts: str, tmp_path: Path) -> None:
    units = request.getfixturevalue(hosts).services()
    # The replica, both ranks with and without NEXTN, the router and the proxy.
    assert len(units) == 7
    complaints = {service.description: found for service in units
                  if (found := systemd_complaints(service, tmp_path / service.name))}
    assert complaints == {}
