"""
Defaults for the gateway, read from the site model (see ``workstations.py``).
"""

from operations.site import GatewayRoles, LargeBackend, site_default

gateway_roles_router_port = site_default(GatewayRoles, "router_port")
gateway_roles_litellm_port = site_default(GatewayRoles, "litellm_port")
gateway_roles_listen_address = str(site_default(GatewayRoles, "listen_address"))
gateway_roles_master_key_file = site_default(GatewayRoles, "master_key_file")
gateway_roles_litellm_config_file = site_default(GatewayRoles, "litellm_config_file")
gateway_roles_litellm_venv = site_default(GatewayRoles, "litellm_venv")
gateway_roles_litellm_user = site_default(GatewayRoles, "litellm_user")
gateway_roles_init_system = site_default(GatewayRoles, "init_system")
gateway_roles_router_venv = site_default(GatewayRoles, "router_venv")
gateway_roles_router_user = site_default(GatewayRoles, "router_user")
gateway_roles_pip_options = site_default(GatewayRoles, "pip_options")
gateway_roles_large_api_key_env = site_default(LargeBackend, "api_key_env")
gateway_roles_large_api_key_file = site_default(LargeBackend, "api_key_file")
