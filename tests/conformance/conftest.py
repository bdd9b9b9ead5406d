"""What the conformance tests render: the hosts of a site, and the lab's, as pyinfra loads them."""

from pathlib import Path

import pytest
from conformance_helpers import Rendered, lab_inventory, site_inventory


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """The services and configs twinbolt renders for ``tests/conformance/site.toml``."""
    directory: Path = tmp_path_factory.mktemp("site")
    return Rendered.of(site_inventory(directory))


@pytest.fixture(scope="session")
def lab_rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """What twinbolt renders for the embedded lab's hosts (no site file)."""
    return Rendered.of(lab_inventory(tmp_path_factory.mktemp("lab")))
