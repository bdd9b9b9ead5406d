"""No run is in progress: a converged state holds no host lock, an interrupted run's
included (its next run takes the stale lock over and releases it)."""

from __future__ import annotations

from operations.safety.lock import lock_path


def test_no_run_holds_the_hosts(workstations, gateway) -> None:
    for inventory_host in (*workstations, gateway):
        path = lock_path(inventory_host.settings.run_dir)
        lock = inventory_host.host.file(path)
        assert not lock.exists, (
            f"{inventory_host.name}: {path} is held ({lock.content_string.strip()}): a run is "
            f"in progress or was killed; a new deploy takes over a stale lock")
