"""
Data every host shares that no site may change, and the defaults of what it may
that no section of the site model publishes.

Site-specific defaults live on the models in ``operations/site/model.py``; the group
files for ``workstations`` and ``gateway`` publish them.
"""

from operations.site.model import Ssh, site_default

# tmpfs: whatever twinbolt stages here, the candidate module above all, is gone
# on reboot (the field report's sixth lesson).
run_dir = "/run/twinbolt"

# pyinfra's _timeout (model.COMMAND_TIMEOUT), every remote command's bound; a
# site's [ssh] value is host data, which wins over this.
_timeout = site_default(Ssh, "command_timeout_seconds")
