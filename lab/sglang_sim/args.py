"""The command line of ``python -m sglang.launch_server``, as far as twinbolt uses it.

The parser is as strict as SGLang's (``parse_args``, prefixes allowed): a typo in
a rendered service fails here the way it would on a real workstation.
"""

import argparse

from lab.sglang_sim import __version__
from lab.sglang_sim.gpu import GPU_MEMORY_MIB
from operations.site.releases import QUANTIZATION, accepted

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
# The release the simulator is (its __version__): its choices, as twinbolt knows them.
QUANTIZATIONS = tuple(accepted(QUANTIZATION, __version__))
KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")

# What SGLang chooses when the flags are left out.
DEFAULT_SPECULATIVE = {
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}
DEFAULT_CONTEXT_LENGTH = 262144
# The default --chunked-prefill-size by the GPU's memory in MiB, below each
# bound (SGLang 0.5.9, python/sglang/srt/server_args.py,
# ServerArgs._handle_gpu_memory_settings): 2048 for the "A10, 4090, 5090"
# class. SGLang 0.5.23 raises that class to 4096
# (python/sglang/srt/arg_groups/memory_hook.py); the simulator is 0.5.9.
CHUNKED_PREFILL_BY_GPU_MIB = ((20 * 1024, 2048), (35 * 1024, 2048), (60 * 1024, 4096),
                              (90 * 1024, 8192), (160 * 1024, 8192))
CHUNKED_PREFILL_LARGEST_GPUS = 16384
DEFAULT_MEM_FRACTION = {"single": 0.85, "tp": 0.80}


def build_parser() -> argparse.ArgumentParser:
    """The flags twinbolt renders into its services, with SGLang's names and defaults."""
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    add = parser.add_argument
    add("--model-path", required=True)
    add("--served-model-name")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--tp-size", "--tp", type=int, default=1, dest="tp_size")
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", metavar="HOST:PORT")
    add("--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS)
    add("--speculative-num-steps", type=int)
    add("--speculative-eagle-topk", type=int)
    add("--speculative-num-draft-tokens", type=int)
    add("--speculative-draft-model-path")
    add("--context-length", type=int)
    add("--chunked-prefill-size", type=int)
    add("--mem-fraction-static", type=float)
    add("--quantization", choices=QUANTIZATIONS)
    add("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    add("--enable-metrics", action="store_true")
    add("--enable-cache-report", action="store_true")
    add("--api-key")
    add("--trust-remote-code", action="store_true")
    add("--log-level", default="info")
    # How many decode batches between the decode log lines, which is also how
    # often avg_spec_accept_length in /server_info is brought up to date.
    add("--decode-log-interval", type=int, default=40)
    return parser


def parse_server_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and complete the server args the way SGLang's ``ServerArgs`` does."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.nnodes not in (1, 2):
        parser.error("the simulator runs one or two nodes (--nnodes 1 or 2)")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be below --nnodes {args.nnodes}")
    if args.nnodes > 1:
        if args.dist_init_addr is None:
            parser.error("--dist-init-addr HOST:PORT is required with --nnodes 2")
        try:
            split_host_port(args.dist_init_addr)
        except ValueError as error:
            parser.error(f"--dist-init-addr: {error}")
    complete(args)
    return args


def complete(args: argparse.Namespace) -> None:
    """Fill in what SGLang derives, so ``/server_info`` reports what actually runs."""
    args.served_model_name = args.served_model_name or args.model_path
    args.tokenizer_path = args.model_path
    if args.chunked_prefill_size is None:
        args.chunked_prefill_size = default_chunked_prefill_size(GPU_MEMORY_MIB)
    if args.mem_fraction_static is None:
        args.mem_fraction_static = DEFAULT_MEM_FRACTION["tp" if args.tp_size > 1 else "single"]
    if args.speculative_algorithm == "NEXTN":
        # SGLang runs NEXTN (the model's own MTP head) with the EAGLE worker.
        args.speculative_algorithm = "EAGLE"
    if args.speculative_algorithm:
        for name, default in DEFAULT_SPECULATIVE.items():
            if getattr(args, name) is None:
                setattr(args, name, default)


def default_chunked_prefill_size(gpu_memory_mib: int) -> int:
    """SGLang's chunk for a GPU of ``gpu_memory_mib``: more memory, longer chunks."""
    for bound, size in CHUNKED_PREFILL_BY_GPU_MIB:
        if gpu_memory_mib < bound:
            return size
    return CHUNKED_PREFILL_LARGEST_GPUS


def context_length(args: argparse.Namespace) -> int:
    """The model's window: the flag, or the simulated model's native length."""
    return args.context_length or DEFAULT_CONTEXT_LENGTH


def split_host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` as a host and a port number."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)

