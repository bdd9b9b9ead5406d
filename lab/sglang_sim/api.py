"""The HTTP endpoints: rank 0's full API, and the dummy health server of rank 1.

Rank 1's server answers 200 on ``/health`` and ``/health_generate`` whatever
the group's state, as SGLang's dummy health server does: only rank 0's answers
mean anything. Rank 0's ``/health`` is its ``/health_generate``, as in SGLang
0.5.9 (since sgl-project/sglang#8444, merged 2025-07-28): 503 while starting, then 200 only once the
scheduler has produced output since the request came, and 503 after
``SGLANG_HEALTH_CHECK_TIMEOUT`` seconds (20) when it has not, as a stuck
scheduler never does. (0.5.9 looks once a second; the simulator answers as
soon as the output is there.) Releases before that change answered
``/health`` 200 without generating; the lab's fault ``rank_hang_green_health``
is a rank 0 of such a release whose scheduler stops.
"""

import argparse
import logging
import threading
import time
from datetime import UTC, datetime

from lab.sglang_sim.args import context_length
from lab.sglang_sim.engine import ProfileRequest, Scheduler, Sequence
from lab.sglang_sim.httpd import (
    App,
    Keys,
    Request,
    Response,
    Route,
    error_response,
    json_response,
    sse_response,
)
from lab.sglang_sim.knobs import Knobs
from lab.sglang_sim.openai_api import (
    CHAT,
    DEFAULT_MAX_NEW_TOKENS,
    TEXT,
    Endpoint,
    chat_prompt,
    check_admitted,
    check_context,
    generate_body,
    generate_events,
    requested_tokens,
    text_prompt,
)
from lab.sglang_sim.profiler import LATENESS, NOT_PROFILING, STARTED, STOPPED
from lab.sglang_sim.stats import Stats
from lab.sglang_sim.tokens import block_hashes, tokenize

logger = logging.getLogger(__name__)

# ProfileReqInput's (0.5.9) and ProfileReq's (0.5.23) fields that the simulator
# does not simulate: a step count, stages, merging.
UNSIMULATED = ("start_step", "num_steps", "profile_stages")
UNSIMULATED_FLAGS = ("profile_by_stage", "merge_profiles")

# The lab's fault for a scheduler that stops behind an older release's green /health.
GREEN_HEALTH_FAULT = "rank_hang_green_health"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The routes SGLang marks ADMIN_OPTIONAL (http_server.py, 0.5.9 and 0.5.23):
# --admin-api-key when the server has one, else --api-key. The others the
# simulator serves are NORMAL or open (/health*, /metrics).
ADMIN_OPTIONAL = ("/flush_cache", "/start_profile", "/stop_profile")
# SGLang's answer to a /flush_cache that emptied the cache (http_server.py, 0.5.9 and 0.5.23).
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "
           "(When there are running or waiting requests, the operation will not be performed.)\n")


def dummy_health_app() -> App:
    """Rank 1's server: always healthy, nothing else."""
    routes = {path: {"GET": lambda request: Response(200)}
              for path in ("/health", "/health_generate")}
    return App(routes)


def internal_error(message: str) -> Response:
    """
    What FastAPI answers for the ``RuntimeError`` SGLang's tokenizer manager
    raises: a bare 500; the message goes to the server's log only.
    """
    logger.error("Profile: %s", message)
    return Response(500, b"Internal Server Error", "text/plain; charset=utf-8")


class Leader:
    """Rank 0's endpoints in front of the scheduler; ``ready`` once the group has loaded."""

    def __init__(self, args: argparse.Namespace, knobs: Knobs, stats: Stats,
                 scheduler: Scheduler, kv_cache_tokens: int) -> None:
        self.ready = threading.Event()
        self._args = args
        self._knobs = knobs
        self._stats = stats
        self._scheduler = scheduler
        self._kv_cache_tokens = kv_cache_tokens

    @property
    def max_req_input_len(self) -> int:
        """
        The longest input the server admits, as 0.5.9's ``TpModelWorker`` sets
        it: under both the context length and the KV cache pool, less 5.
        """
        return min(context_length(self._args) - 1, self._kv_cache_tokens - 1) - 5

    def app(self) -> App:
        routes = {
            "/health": {"GET": self.health},
            "/health_generate": {"GET": self.health_generate},
            "/server_info": {"GET": self.server_info},
            "/get_server_info": {"GET": self.server_info},
            "/model_info": {"GET": self.model_info},
            "/get_model_info": {"GET": self.model_info},
            "/v1/models": {"GET": self.models},
            "/v1/loads": {"GET": self.loads},
            "/v1/chat/completions": {"POST": self._when_ready(self.chat_completions)},
            "/v1/completions": {"POST": self._when_ready(self.completions)},
            "/generate": {"POST": self._when_ready(self.generate)},
            "/flush_cache": {"GET": self.flush_cache, "POST": self.flush_cache},
            "/start_profile": {"GET": self.start_profile, "POST": self.start_profile},
            "/stop_profile": {"GET": self.stop_profile, "POST": self.stop_profile},
        }
        if self._args.enable_metrics:
            routes["/metrics"] = {"GET": self.metrics}
        return App(routes, Keys(self._args.api_key, self._args.admin_api_key), ADMIN_OPTIONAL)

    def _when_ready(self, route: Route) -> Route:
        def guarded(request: Request) -> Response:
            if not self.ready.is_set():
                return error_response("The server is still loading.", 503,
                                      "ServiceUnavailableError")
            return route(request)

        return guarded

    def health(self, request: Request) -> Response:
        if self.ready.is_set() and self._knobs.fault_on(GREEN_HEALTH_FAULT):
            return Response(200)
        return self.health_generate(request)

    def health_generate(self, request: Request) -> Response:
        """200 only when a one-token generation really completes."""
        if not self.ready.is_set():
            return Response(503)
        probe = Sequence("health", 1, [], max_new_tokens=1, log_metrics=False)
        self._scheduler.submit(probe)
        return Response(200 if probe.done.wait(self._knobs.health_check_timeout) else 503)

    def flush_cache(self, request: Request) -> Response:
        """
        SGLang's ``/flush_cache`` (0.5.9 and 0.5.23 alike): 200 and its text once
        the radix cache is empty; 400 while requests run or wait, as 0.5.23 words it.
        """
        if self._scheduler.flush_cache():
            return Response(200, FLUSHED.encode(), "text/plain; charset=utf-8")
        return Response(400, b"Flush cache failed.\n", "text/plain; charset=utf-8")

    def start_profile(self, request: Request) -> Response:
        """
        SGLang's ``/start_profile``: every rank records until ``/stop_profile``,
        its traces in ``output_dir`` (SGLang's ``ProfileReqInput``). A start
        that SGLang's scheduler refuses (one already running) is a 500, the
        ``RuntimeError`` its tokenizer manager raises.
        """
        body = request.json()
        unsupported = sorted(key for key in UNSIMULATED if body.get(key) is not None)
        unsupported += sorted(key for key in UNSIMULATED_FLAGS if body.get(key))
        if unsupported:
            return error_response("The lab's simulator profiles from /start_profile to "
                                  f"/stop_profile only: {', '.join(unsupported)} is not "
                                  "simulated", 400)
        try:
            refused = self._scheduler.profile(ProfileRequest(
                start=True, output_dir=body.get("output_dir"), profile_id=str(time.time()),
                activities=body.get("activities")))
        except TimeoutError as error:
            refused = str(error)
        if refused:
            return internal_error(refused)
        return Response(200, STARTED.encode(), "text/plain; charset=utf-8")

    def stop_profile(self, request: Request) -> Response:
        """SGLang's ``/stop_profile``: answered once every rank has written its trace."""
        try:
            written = self._scheduler.profile(ProfileRequest(start=False))
        except TimeoutError as error:
            return internal_error(str(error))
        if not written:
            return internal_error(NOT_PROFILING)
        logger.info("Profiling done. Traces are saved to: %s", ", ".join(written))
        return Response(200, STOPPED.encode(), "text/plain; charset=utf-8")

    def server_info(self, request: Request) -> Response:
        """Every server arg under SGLang's name, the version, and the scheduler's state."""
        state = {}
        # Absent until the first decode log interval has been folded in, as in SGLang.
        if self._args.speculative_algorithm and (
                accept_length := self._stats.avg_accept_length()) is not None:
            state["avg_spec_accept_length"] = accept_length
        if self._args.nnodes > 1:
            state["allreduce_bytes"] = self._stats.allreduce_bytes
        # The scheduler's startup figures, top-level in 0.5.9 and 0.5.23 alike.
        scheduler_info = {"max_total_num_tokens": self._kv_cache_tokens,
                          "max_req_input_len": self.max_req_input_len}
        return json_response({**vars(self._args), **scheduler_info,
                              "version": self._knobs.version, "internal_states": [state]})

    def model_info(self, request: Request) -> Response:
        return json_response({"model_path": self._args.model_path,
                              "tokenizer_path": self._args.tokenizer_path,
                              "is_generation": True})

    def models(self, request: Request) -> Response:
        name = self._args.served_model_name
        return json_response({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": name, "max_model_len": context_length(self._args),
        }]})

    def loads(self, request: Request) -> Response:
        """
        SGLang's ``/v1/loads`` (0.5.9 and 0.5.23), its core figures: the requests
        its one scheduler runs and holds waiting, live, and their aggregate. What
        a drain waits on before the server stops.
        """
        running, waiting = self._scheduler.load()
        load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
                "num_total_reqs": running + waiting}
        return json_response({
            "timestamp": datetime.now(UTC).isoformat(), "version": self._knobs.version,
            "dp_rank_count": 1, "loads": [load],
            "aggregate": {"total_running_reqs": running, "total_waiting_reqs": waiting,
                          "total_reqs": running + waiting},
        })

    def metrics(self, request: Request) -> Response:
        text = self._stats.prometheus(self._args.served_model_name,
                                      bool(self._args.speculative_algorithm))
        text += LATENESS.prometheus()
        return Response(200, text.encode(), METRICS_CONTENT_TYPE)

    def chat_completions(self, request: Request) -> Response:
        body = request.json()
        requested = requested_tokens(body.get("max_completion_tokens"), body.get("max_tokens"))
        return self._complete(CHAT, body, self._submit(chat_prompt(body), requested))

    def completions(self, request: Request) -> Response:
        body = request.json()
        prompt = text_prompt(body.get("prompt"), "prompt")
        return self._complete(TEXT, body, self._submit(prompt, requested_tokens(
            body.get("max_tokens"))))

    def generate(self, request: Request) -> Response:
        """
        SGLang's native endpoint: ``text`` (or ``input_ids``) and
        ``sampling_params``, answered whole or, with ``stream``, as events.
        """
        body = request.json()
        prompt = text_prompt(body.get("text", body.get("input_ids")), "text")
        sampling = body.get("sampling_params") or {}
        seq = self._submit(prompt, requested_tokens(sampling.get("max_new_tokens")))
        drafts = (self._args.speculative_num_draft_tokens if self._args.speculative_algorithm
                  else None)
        if body.get("stream"):
            return sse_response(generate_events(seq, drafts))
        return json_response(generate_body(seq, drafts))

    def _submit(self, prompt: str, requested: int | None) -> Sequence:
        """Tokenize, check the window, and queue the request for the scheduler."""
        tokens = tokenize(prompt)
        check_context(len(tokens), requested, context_length(self._args))
        check_admitted(len(tokens), self.max_req_input_len)
        max_new_tokens = DEFAULT_MAX_NEW_TOKENS if requested is None else requested
        seq = Sequence(prompt, len(tokens), block_hashes(tokens), max_new_tokens)
        self._scheduler.submit(seq)
        return seq

    def _complete(self, endpoint: Endpoint, body: dict, seq: Sequence) -> Response:
        model = body.get("model") or self._args.served_model_name
        cache_report = self._args.enable_cache_report
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return sse_response(endpoint.events(seq, model, cache_report, include_usage))
        return json_response(endpoint.body(seq, model, cache_report))
