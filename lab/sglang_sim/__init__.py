"""SGLang server simulator for the embedded lab.

Started exactly like the real server, with only the module swapped::

    python -m lab.sglang_sim --model-path /var/lib/models/qwen --served-model-name qwen \\
        --port 30000 --tp-size 2 --nnodes 2 --node-rank 0 --dist-init-addr 169.254.77.1:5000 \\
        --speculative-algorithm NEXTN --speculative-num-steps 3 \\
        --speculative-eagle-topk 1 --speculative-num-draft-tokens 4

It accepts the real flag names (strictly: an unknown flag exits 2), serves the
real endpoints with the real shapes, and spends time where the real server does:
a prefill in SGLang's chunks, each taking time proportional to its tokens, then
decode steps whose compute is a roofline (the rank's share of the weights and
the KV cache, read at the GPU's memory bandwidth). In TP2 every pass, prefill
chunk or decode step, makes two all-reduces per layer, one after the other,
each a real NCCL ring all-reduce over TCP: both ranks sending at once, over
every channel's connections, in NCCL's messages and in the protocol NCCL's
tuner picks (:mod:`lab.sglang_sim.nccl`);
sizes come from the model's files (``config.json`` and
``model.safetensors.index.json``, see :mod:`lab.sglang_sim.model`). The TP
link is therefore the lab's real veth, and its drops and retransmissions set
the token rate. SGLang's profiler endpoints write each rank's trace of its
own kernels (:mod:`lab.sglang_sim.profiler`). Keys are SGLang's too: ``--api-key``
and ``--admin-api-key``, on the command line or from ``--config``'s YAML merged in
before it, asked route by route as SGLang's middleware asks them, and printed
with the other arguments at start, as SGLang prints them.

Tokens are whitespace-separated words, so ``"x " * 120_000`` is a 120,000-token
prompt; a chat message adds one token for its role. Output is exactly
``max_tokens`` words (default 128, SGLang's ``max_new_tokens`` default).

Lab knobs (environment; what real hardware would decide):

- ``LAB_SGLANG_LOAD_SECONDS`` (1.0): weight loading time before ``/health`` is 200.
- ``LAB_SGLANG_GPU_BANDWIDTH_GB_S`` (1792, one RTX 5090's): the GPU's memory
  bandwidth, which sets a decode pass's compute time.
- ``LAB_SGLANG_PREFILL_TOKENS_PER_SECOND`` (200000): prefill speed on uncached tokens.
- ``LAB_SGLANG_SPEC_ACCEPT_RATE`` (0.966): chance that each draft token is accepted;
  the default gives a mean accept length of about 3.8 with NEXTN 3/1/4.
- ``LAB_SGLANG_PEER_TIMEOUT_SECONDS`` (600): how long rank 0 waits on a stalled peer
  before aborting, like the NCCL watchdog.
- ``LAB_SGLANG_VERSION`` (the version below): the version ``/server_info`` reports.
- ``LAB_SGLANG_GPU_DIR`` (/run/lab-gpu): where the GPU memory file is written.
- ``LAB_FAULTS_DIR`` (``$TWINBOLT_LAB_STATE/faults``, else ``<repo>/.lab/faults``):
  where lab faults are switched on, one file per fault.

``NCCL_SOCKET_IFNAME`` (``name`` or ``=name``) binds NCCL's connections to that
interface, as NCCL's Socket transport does; unset, NCCL picks the first
interface that is neither loopback nor docker nor virbr (the LAN port, on a
workstation). ``NCCL_SOCKET_NTHREADS``, ``NCCL_NSOCKS_PERTHREAD``,
``NCCL_MIN_NCHANNELS`` and ``NCCL_MAX_NCHANNELS`` change the channels and
sockets as they change NCCL 2.27.5's. ``NCCL_SOCKET_FAMILY`` may be unset or ``AF_INET`` (the
simulator's NCCL speaks IPv4 only). ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20) is how
long rank 0's ``/health`` waits for the scheduler's output.

Processes and sockets (:mod:`lab.sglang_sim.group`): in TP2 each rank's server
process starts a scheduler process, which holds the group's sockets as a real
one does: torch's store (rank 0 hosts it and is its client too), Gloo's pair
(``GLOO_SOCKET_IFNAME``), NCCL's bootstrap ring, its proxy connection and its
data connections.

Files: ``$LAB_SGLANG_GPU_DIR/<pid>`` holds the MiB of GPU memory the process
uses while its model is loaded (read by the lab's nvidia-smi); removed on SIGTERM.

Faults, read when they would bite: ``draft_init_crash`` (a speculative server
crashes while initializing its draft model), ``rank_hang`` (the scheduler
stops; rank 0's ``/health`` answers 503 once ``SGLANG_HEALTH_CHECK_TIMEOUT``
has passed), ``rank_hang_green_health`` (the scheduler stops and ``/health``
stays 200, as releases before sgl-project/sglang#8444 answer it) and
``wrong_interface`` (``NCCL_SOCKET_IFNAME`` does not reach NCCL, which picks an
interface itself).
"""

__version__ = "0.5.9"
