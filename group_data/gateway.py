"""
Defaults for the gateway, read from the site model (see ``workstations.py``).
"""

from operations.site.model import GATEWAY_DEFAULTS as DEFAULTS

gateway_roles_router_port = DEFAULTS["gateway_roles_router_port"]
gateway_roles_litellm_port = DEFAULTS["gateway_roles_litellm_port"]
gateway_roles_litellm_backend_port = DEFAULTS["gateway_roles_litellm_backend_port"]
gateway_roles_listen_address = DEFAULTS["gateway_roles_listen_address"]
gateway_roles_master_key_file = DEFAULTS["gateway_roles_master_key_file"]
gateway_roles_litellm_config_file = DEFAULTS["gateway_roles_litellm_config_file"]
gateway_roles_litellm_venv = DEFAULTS["gateway_roles_litellm_venv"]
gateway_roles_litellm_user = DEFAULTS["gateway_roles_litellm_user"]
gateway_roles_litellm_service = DEFAULTS["gateway_roles_litellm_service"]
gateway_roles_init_system = DEFAULTS["gateway_roles_init_system"]
gateway_roles_router_venv = DEFAULTS["gateway_roles_router_venv"]
gateway_roles_pip_options = DEFAULTS["gateway_roles_pip_options"]
gateway_roles_router_user = DEFAULTS["gateway_roles_router_user"]
gateway_roles_router_key_file = DEFAULTS["gateway_roles_router_key_file"]
gateway_roles_router_worker_key_file = DEFAULTS["gateway_roles_router_worker_key_file"]
gateway_roles_litellm_small_key_file = DEFAULTS["gateway_roles_litellm_small_key_file"]
gateway_roles_large_api_key_env = DEFAULTS["gateway_roles_large_api_key_env"]
gateway_roles_large_api_key_file = DEFAULTS["gateway_roles_large_api_key_file"]
