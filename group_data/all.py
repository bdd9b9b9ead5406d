"""
Data every host shares that no site may change.

Site-specific defaults live on the models in ``operations/site.py``; the group
files for ``workstations`` and ``gateway`` publish them.
"""

# tmpfs: whatever twinbolt stages here, the candidate module above all, is gone
# on reboot (the field report's sixth lesson).
run_dir = "/run/twinbolt"
