"""
Defaults for the workstations.

Each value is read from the site model (``operations/site/model.py``), where it is
written once; a site file's own values reach the hosts as host data and win over
these, so in practice these defaults serve the embedded lab. Published as host
data, as a site's are, so that ``--data`` overrides them alike.
"""

from operations.site.model import WORKSTATION_SECTIONS, Workstation, sections_defaults, site_default

globals().update(sections_defaults(WORKSTATION_SECTIONS))
# A workstation's own key in a site; every address, the default, in the lab.
serving_listen_address = str(site_default(Workstation, "listen_address"))
