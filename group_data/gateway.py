"""
Defaults for the gateway, read from the site model (see ``workstations.py``).
"""

from operations.site.model import GatewayRoles, section_defaults

globals().update(section_defaults(GatewayRoles, "gateway_roles"))
