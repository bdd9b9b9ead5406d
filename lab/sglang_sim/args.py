"""The command line of ``python -m sglang.launch_server``, as far as twinbolt uses it.

The parser is as strict as SGLang's (``parse_args``, prefixes allowed): a typo in
a rendered service fails here the way it would on a real workstation. So is
``--config FILE`` (SGLang 0.5.9's ``prepare_server_args`` and its
``ConfigArgumentMerger``, the same in 0.5.23): the YAML's keys become flags
put before the command line's own, which therefore wins. A key is a flag's
name as written after ``--``: ``api-key`` is ``--api-key``, and ``api_key``
is ``--api_key``, which argparse refuses (exit 2) in SGLang as here. A file
SGLang cannot take (not ``.yaml``/``.yml``, missing, not a mapping) raises
the ``ValueError`` SGLang raises, uncaught: a traceback and exit code 1.
"""

import argparse
import logging
import sys
from pathlib import Path

import yaml

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

CONFIG_FLAG = "--config"
CONFIG_SUFFIXES = (".yaml", ".yml")

logger = logging.getLogger(__name__)


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
    # When set, the admin endpoints ask for it, and no longer for --api-key.
    add("--admin-api-key")
    add("--trust-remote-code", action="store_true")
    add("--log-level", default="info")
    # How many decode batches between the decode log lines, which is also how
    # often avg_spec_accept_length in /server_info is brought up to date.
    add("--decode-log-interval", type=int, default=40)
    # Read by merge_config before parsing; a flag here so that argparse knows it.
    add(CONFIG_FLAG)
    return parser


def parse_server_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and complete the server args the way SGLang's ``ServerArgs`` does."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(merge_config(parser, argv))
    # ServerArgs has no field for it, so neither its log line nor /server_info shows it.
    del args.config
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


def merge_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """
    ``argv`` with ``--config FILE`` replaced by the file's flags, put first so
    that the command line's own win (argparse keeps a flag's last value). Only
    a ``--config`` word of its own reads the file, as in SGLang: argparse takes
    ``--config=FILE`` too, and the file is then silently not read.
    """
    if CONFIG_FLAG not in argv:
        return argv
    path = config_path(argv)
    at = argv.index(CONFIG_FLAG)
    return config_flags(read_config(path), store_true_dests(parser)) + argv[:at] + argv[at + 2:]


def config_path(argv: list[str]) -> str:
    """The word after the one ``--config``; SGLang refuses a second one, or none after it."""
    found = [index for index, word in enumerate(argv) if word == CONFIG_FLAG]
    if len(found) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if found[0] == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    return argv[found[0] + 1]


def read_config(path: str) -> dict:
    """The YAML mapping at ``path``, refused by suffix, absence or shape as SGLang refuses it."""
    suffix = Path(path).suffix
    if suffix.lower() not in CONFIG_SUFFIXES:
        raise ValueError(f"Config file must be YAML format, got: {suffix}")
    if not Path(path).exists():
        raise ValueError(f"Config file not found: {path}")
    try:
        with open(path) as file:
            config = yaml.safe_load(file)
    except Exception as error:
        # An unreadable file (its mode, its owner) or bad YAML: logged, then raised as is.
        logger.error("Failed to read config file %s: %s", path, error)
        raise
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    return config


def store_true_dests(parser: argparse.ArgumentParser) -> set[str]:
    """The flags a YAML ``true`` switches on rather than spells out."""
    return {action.dest for action in parser._actions
            if isinstance(action, argparse._StoreTrueAction)}


def config_flags(config: dict, store_true: set[str]) -> list[str]:
    """Each key as ``--key`` and its value, the key as written (dashes and underscores kept)."""
    flags: list[str] = []
    for key, value in config.items():
        flags += config_flag(f"--{key}", value, key.replace("-", "_") in store_true)
    return flags


def config_flag(flag: str, value: object, store_true: bool) -> list[str]:
    """
    One key's words: a store_true flag alone when true (nothing when false),
    another boolean as ``true``/``false``, a list's items after the flag (an
    empty one not at all), anything else as ``str`` makes it (``null`` is
    ``None``, a word SGLang then takes as the value).
    """
    if isinstance(value, bool):
        if store_true:
            return [flag] if value else []
        return [flag, str(value).lower()]
    if isinstance(value, list):
        return [flag, *map(str, value)] if value else []
    return [flag, str(value)]


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

