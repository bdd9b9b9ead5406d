"""
Defaults for the gateway, read from the site model (see ``workstations.py``).
"""

from operations.site.model import GATEWAY_SECTIONS, sections_defaults

globals().update(sections_defaults(GATEWAY_SECTIONS))
