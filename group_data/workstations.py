"""
Defaults for the workstations.

Each value is read from the site model (``operations/site.py``), where it is
written once; a site file's own values reach the hosts as host data and win over
these, so in practice these defaults serve the embedded lab. Every name exists
even when its default is ``None``, because pyinfra raises on a missing
``host.data`` key.
"""

from operations.site import Candidate, Ledger, Link, Serving, Workstation, site_default

link_interface = site_default(Link, "interface")
link_expected_rate_gbps = site_default(Link, "expected_rate_gbps")
link_expected_lanes = site_default(Link, "expected_lanes")
link_address_owner = site_default(Link, "address_owner")
link_prefix_length = site_default(Link, "prefix_length")
link_wait_seconds = site_default(Link, "wait_seconds")

candidate_module_name = site_default(Candidate, "module_name")

serving_quantization = site_default(Serving, "quantization")
serving_context_length = site_default(Serving, "context_length")
serving_mem_fraction_static = site_default(Serving, "mem_fraction_static")
serving_draft_model_path = site_default(Serving, "draft_model_path")
serving_port = site_default(Serving, "port")
serving_dist_init_port = site_default(Serving, "dist_init_port")
serving_sglang_module = site_default(Serving, "sglang_module")
serving_min_sglang_version = site_default(Serving, "min_sglang_version")
serving_init_system = site_default(Serving, "init_system")
serving_working_directory = site_default(Serving, "working_directory")
serving_start_timeout_seconds = site_default(Serving, "start_timeout_seconds")
serving_foreign_gpu_memory_mib = site_default(Serving, "foreign_gpu_memory_mib")
serving_gpu_memory_bandwidth_gb_s = site_default(Serving, "gpu_memory_bandwidth_gb_s")

ledger_path = str(site_default(Ledger, "path"))
# A workstation's own key in a site; every address, the default, in the lab.
serving_listen_address = str(site_default(Workstation, "listen_address"))
