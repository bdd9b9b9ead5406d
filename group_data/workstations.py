"""
Defaults for the workstations.

Each value is read from the site model (``operations/site/model.py``), where it is
written once; a site file's own values reach the hosts as host data and win over
these, so in practice these defaults serve the embedded lab. Published as host
data, as a site's are, so that ``--data`` overrides them alike: one name a line,
each the site model's key of that name (tests/unit/test_inventory.py holds the
names to the model's).
"""

from operations.site.model import WORKSTATION_DEFAULTS as DEFAULTS
from operations.site.model import Workstation, site_default

link_interface = DEFAULTS["link_interface"]
link_expected_rate_gbps = DEFAULTS["link_expected_rate_gbps"]
link_expected_lanes = DEFAULTS["link_expected_lanes"]
link_address_owner = DEFAULTS["link_address_owner"]
link_prefix_length = DEFAULTS["link_prefix_length"]
link_wait_seconds = DEFAULTS["link_wait_seconds"]

candidate_module_name = DEFAULTS["candidate_module_name"]
candidate_guard_stall_seconds = DEFAULTS["candidate_guard_stall_seconds"]

serving_quantization = DEFAULTS["serving_quantization"]
serving_context_length = DEFAULTS["serving_context_length"]
serving_mem_fraction_static = DEFAULTS["serving_mem_fraction_static"]
serving_draft_model_path = DEFAULTS["serving_draft_model_path"]
serving_port = DEFAULTS["serving_port"]
serving_dist_init_port = DEFAULTS["serving_dist_init_port"]
serving_sglang_module = DEFAULTS["serving_sglang_module"]
serving_min_sglang_version = DEFAULTS["serving_min_sglang_version"]
serving_init_system = DEFAULTS["serving_init_system"]
serving_working_directory = DEFAULTS["serving_working_directory"]
serving_start_timeout_seconds = DEFAULTS["serving_start_timeout_seconds"]
serving_foreign_gpu_memory_mib = DEFAULTS["serving_foreign_gpu_memory_mib"]
serving_gpu_memory_bandwidth_gb_s = DEFAULTS["serving_gpu_memory_bandwidth_gb_s"]
serving_api_key_file = DEFAULTS["serving_api_key_file"]
serving_admin_api_key_file = DEFAULTS["serving_admin_api_key_file"]
serving_keys_file = DEFAULTS["serving_keys_file"]

ledger_path = DEFAULTS["ledger_path"]

# A workstation's own key in a site; every address, the default, in the lab.
serving_listen_address = str(site_default(Workstation, "listen_address"))
