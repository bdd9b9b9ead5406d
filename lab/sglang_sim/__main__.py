"""``python -m lab.sglang_sim``: start one rank the way ``sglang.launch_server`` does.

Rank 0 serves HTTP at once (``/health`` 503 while starting), starts its
scheduler process, which meets rank 1 in torch's store and NCCL
(:mod:`lab.sglang_sim.group`), loads, waits for rank 1 to load, and only then
reports ready. Rank 1 serves its dummy health server, starts its scheduler
process, joins, loads, and then answers rank 0's all-reduces until the link
breaks. Any failure on either rank ends the process with exit code 1, as a
crashed SGLang scheduler takes its server down.
"""

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

from lab.sglang_sim.api import Leader, dummy_health_app
from lab.sglang_sim.args import parse_server_args, split_host_port
from lab.sglang_sim.engine import Scheduler, Speculation
from lab.sglang_sim.gpu import GPU_MEMORY_MIB, GpuMemory
from lab.sglang_sim.group import SchedulerProcess
from lab.sglang_sim.httpd import serve
from lab.sglang_sim.knobs import Knobs
from lab.sglang_sim.link import READY, socket_ifname
from lab.sglang_sim.model import ModelShape
from lab.sglang_sim.stats import Stats

logger = logging.getLogger("lab.sglang_sim")


class Shutdown:
    """How the process ends: the first reason wins, and the main thread waits for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._code = 0

    def request(self, code: int) -> None:
        with self._lock:
            if not self._event.is_set():
                self._code = code
                self._event.set()

    def wait(self) -> int:
        self._event.wait()
        return self._code

    def spawn(self, target: Callable[..., None], *args: object) -> None:
        """Run ``target`` on a thread whose exception ends the process, as in SGLang."""

        def run() -> None:
            try:
                target(*args)
            except Exception:
                logger.error("Scheduler hit an exception: %s", traceback.format_exc().rstrip())
                self.request(1)

        threading.Thread(target=run, name=target.__name__, daemon=True).start()


def log_format(args: argparse.Namespace) -> str:
    rank = f" TP{args.node_rank}" if args.nnodes > 1 else ""
    return f"[%(asctime)s{rank}] %(message)s"


def configure_logging(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=log_format(args), datefmt="%Y-%m-%d %H:%M:%S")


def load_model(args: argparse.Namespace, knobs: Knobs, gpu: GpuMemory) -> None:
    """Load the target weights, then the draft model if speculation is on."""
    logger.info("Load weight begin. model_path=%s, quantization=%s, tp_size=%d",
                args.model_path, args.quantization, args.tp_size)
    time.sleep(knobs.load_seconds)
    gpu.claim()
    logger.info("Load weight end. mem usage=%.2f GB", gpu.mib / 1024)
    if args.speculative_algorithm:
        logger.info("Initializing draft model ... (%s, steps=%d, topk=%d, draft tokens=%d)",
                    args.speculative_algorithm, args.speculative_num_steps,
                    args.speculative_eagle_topk, args.speculative_num_draft_tokens)
        if knobs.fault_on("draft_init_crash"):
            raise RuntimeError("Lab fault draft_init_crash: the draft worker failed to start")


def nccl_ifname(knobs: Knobs, ifname: str | None) -> str | None:
    """``NCCL_SOCKET_IFNAME``'s interface, unless the lab's ``wrong_interface`` fault hides it."""
    if knobs.fault_on("wrong_interface"):
        logger.warning("Lab fault wrong_interface: NCCL_SOCKET_IFNAME does not reach NCCL")
        return None
    return ifname


def scheduler_process(args: argparse.Namespace, knobs: Knobs,
                      ifname: str | None) -> SchedulerProcess:
    """The rank's scheduler process, which joins the TP group at ``--dist-init-addr``."""
    host, port = split_host_port(args.dist_init_addr)
    return SchedulerProcess(args.node_rank, host, port, nccl_ifname(knobs, ifname),
                            log_format(args), args.log_level)


def boot_rank0(args: argparse.Namespace, knobs: Knobs, gpu: GpuMemory, leader: Leader,
               scheduler: Scheduler, link: SchedulerProcess | None, shutdown: Shutdown) -> None:
    if link:
        link.formed()
    load_model(args, knobs, gpu)
    if link:
        link.expect(READY)
        logger.info("Rank 1 has loaded; the TP group is complete")
        link.set_timeout(knobs.peer_timeout_seconds)
    shutdown.spawn(scheduler.run, link)
    leader.ready.set()
    logger.info("The server is fired up and ready to roll!")


def boot_rank1(args: argparse.Namespace, knobs: Knobs, gpu: GpuMemory,
               link: SchedulerProcess) -> None:
    link.formed()
    load_model(args, knobs, gpu)
    link.send(READY)
    logger.info("Loaded; serving rank 0's all-reduces")
    link.echo_forever()


def start(args: argparse.Namespace, knobs: Knobs, shape: ModelShape, ifname: str | None,
          gpu: GpuMemory, shutdown: Shutdown) -> None:
    """
    Serve HTTP on this rank and boot it in the background. The scheduler
    process starts from the main thread: it is to die with its parent, and
    Linux's parent-death signal follows the thread that started it.
    """
    if args.node_rank > 0:
        serve(dummy_health_app(), args.host, args.port)
        shutdown.spawn(boot_rank1, args, knobs, gpu, scheduler_process(args, knobs, ifname))
        return
    stats = Stats(args.decode_log_interval)
    speculation = None
    if args.speculative_algorithm:
        speculation = Speculation(args.speculative_num_steps,
                                  args.speculative_num_draft_tokens, knobs.spec_accept_rate)
    scheduler = Scheduler(knobs, shape, args.tp_size, stats, speculation,
                          args.chunked_prefill_size)
    capacity = shape.kv_cache_tokens(GPU_MEMORY_MIB << 20, args.mem_fraction_static,
                                     args.tp_size)
    leader = Leader(args, knobs, stats, scheduler, capacity)
    serve(leader.app(), args.host, args.port)
    link = scheduler_process(args, knobs, ifname) if args.nnodes > 1 else None
    shutdown.spawn(boot_rank0, args, knobs, gpu, leader, scheduler, link, shutdown)


def main(argv: list[str] | None = None) -> int:
    args = parse_server_args(argv)
    configure_logging(args)
    # SGLang's first line: everything a log reader needs to tell one start from the last.
    logger.info("server_args=ServerArgs(%s)",
                ", ".join(f"{name}={value!r}" for name, value in vars(args).items()))
    try:
        knobs = Knobs.from_env()
        ifname = socket_ifname(os.environ.get("NCCL_SOCKET_IFNAME")) if args.nnodes > 1 else None
        shape = ModelShape.read(args.model_path)
    except (ValueError, OSError) as error:
        logger.error("%s: %s", type(error).__name__, error)
        return 1
    shutdown = Shutdown()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: shutdown.request(0))
    gpu = GpuMemory(knobs.gpu_dir, args.mem_fraction_static)
    try:
        start(args, knobs, shape, ifname, gpu, shutdown)
    except OSError as error:
        logger.error("Cannot serve on %s:%d: %s", args.host, args.port, error)
        return 1
    code = shutdown.wait()
    gpu.release()
    logger.info("Shutting down (exit code %d)", code)
    return code


if __name__ == "__main__":
    sys.exit(main())
