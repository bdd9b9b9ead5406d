"""Request fields and response bodies of the generation endpoints.

The shapes are SGLang's: OpenAI-compatible chat and text completions (plain or
streamed as server-sent events) and the native ``/generate``.
"""

import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass

from lab.sglang_sim.engine import Sequence
from lab.sglang_sim.httpd import BadRequest
from lab.sglang_sim.tokens import render_chat

# SGLang's SamplingParams default when the client sets no limit.
DEFAULT_MAX_NEW_TOKENS = 128


def chat_prompt(body: dict) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    try:
        return render_chat(messages)
    except (KeyError, TypeError, AttributeError):
        raise BadRequest("each message needs a role and text content") from None


def text_prompt(value: object, field_name: str) -> str:
    """A prompt given as text or as token ids (one token each)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(token, int) for token in value):
        return " ".join(map(str, value))
    raise BadRequest(f"{field_name} must be a string or a list of token ids")


def requested_tokens(*values: object) -> int | None:
    """The first output limit the client set, if any."""
    for value in values:
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"max tokens must be a non-negative integer, got {value!r}")
        return value
    return None


def check_admitted(prompt_tokens: int, max_req_input_len: int) -> None:
    """
    Refuse an input the KV cache pool cannot hold, with 0.5.9's message
    (``managers/utils.py``, ``validate_input_length``, without
    ``--allow-auto-truncate``).
    """
    if prompt_tokens >= max_req_input_len:
        raise BadRequest(
            f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
            f"({max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
        )


def check_context(prompt_tokens: int, requested: int | None, context_length: int) -> None:
    """Refuse what does not fit the window, with SGLang's messages."""
    if prompt_tokens >= context_length:
        raise BadRequest(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context_length} tokens)."
        )
    if requested is not None and prompt_tokens + requested >= context_length:
        raise BadRequest(
            "Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {prompt_tokens + requested} "
            f"tokens: {prompt_tokens} tokens from the input messages and {requested} tokens "
            "for the completion. Please reduce the number of tokens in the input messages or "
            "the completion to fit within the limit."
        )


def usage(seq: Sequence, cache_report: bool) -> dict:
    """Token counts; cached tokens only with ``--enable-cache-report`` and only when some hit."""
    details = None
    if cache_report and seq.cached_tokens:
        details = {"cached_tokens": seq.cached_tokens}
    return {
        "prompt_tokens": seq.prompt_tokens,
        "completion_tokens": seq.completion_tokens,
        "total_tokens": seq.prompt_tokens + seq.completion_tokens,
        "prompt_tokens_details": details,
    }


@dataclass(frozen=True)
class Endpoint:
    """What differs between ``/v1/chat/completions`` and ``/v1/completions``."""

    object: str
    chunk_object: str
    id_prefix: str
    chat: bool

    def choice(self, text: str) -> dict:
        if self.chat:
            content = {"message": {"role": "assistant", "content": text}}
        else:
            content = {"text": text}
        return {"index": 0, **content, "logprobs": None, "finish_reason": "length"}

    def chunk_choice(self, piece: str, first: bool, finish_reason: str | None) -> dict:
        if self.chat:
            delta = {"role": "assistant"} if first else {}
            content = {"delta": {**delta, "content": piece} if piece else delta}
        else:
            content = {"text": piece}
        return {"index": 0, **content, "logprobs": None, "finish_reason": finish_reason}

    def body(self, seq: Sequence, model: str, cache_report: bool) -> dict:
        """The whole response, once the request has finished."""
        words = [word for step in seq.stream() for word in step]
        return {
            "id": self.id_prefix + uuid.uuid4().hex,
            "object": self.object,
            "created": int(time.time()),
            "model": model,
            "choices": [self.choice(" ".join(words))],
            "usage": usage(seq, cache_report),
        }

    def events(self, seq: Sequence, model: str, cache_report: bool,
               include_usage: bool) -> Generator[dict, None, None]:
        """One chunk per decode step; closing the stream early aborts the request."""
        head = {"id": self.id_prefix + uuid.uuid4().hex, "object": self.chunk_object,
                "created": int(time.time()), "model": model}
        try:
            for index, words in enumerate(seq.stream()):
                piece = " ".join(words) if index == 0 else " " + " ".join(words)
                yield {**head, "choices": [self.chunk_choice(piece, index == 0, None)]}
        except GeneratorExit:
            seq.abort()
            raise
        yield {**head, "choices": [self.chunk_choice("", False, "length")]}
        if include_usage:
            yield {**head, "choices": [], "usage": usage(seq, cache_report)}


CHAT = Endpoint("chat.completion", "chat.completion.chunk", "chatcmpl-", chat=True)
TEXT = Endpoint("text_completion", "text_completion", "cmpl-", chat=False)


def generate_body(seq: Sequence, num_draft_tokens: int | None) -> dict:
    """
    The native ``/generate`` answer, with SGLang's ``meta_info``;
    ``num_draft_tokens`` is ``--speculative-num-draft-tokens``, ``None`` without speculation.
    """
    words = [word for step in seq.stream() for word in step]
    return {"text": " ".join(words), "meta_info": generate_meta(seq, uuid.uuid4().hex,
                                                                num_draft_tokens, True)}


def generate_events(seq: Sequence, num_draft_tokens: int | None,
                    ) -> Generator[dict, None, None]:
    """
    ``/generate`` streamed: the text so far and the ``meta_info`` after each
    decode step, then a last event with the finished request's ``meta_info``.
    Closing the stream early aborts the request.
    """
    rid, text, delivered = uuid.uuid4().hex, "", 0
    try:
        for words in seq.stream():
            text = " ".join([text, *words]) if text else " ".join(words)
            delivered += len(words)
            # The tokens this event delivers, not the scheduler's count, a step ahead.
            meta = {**generate_meta(seq, rid, num_draft_tokens, False),
                    "completion_tokens": delivered}
            yield {"text": text, "meta_info": meta}
    except GeneratorExit:
        seq.abort()
        raise
    yield {"text": text, "meta_info": generate_meta(seq, rid, num_draft_tokens, True)}


def generate_meta(seq: Sequence, rid: str, num_draft_tokens: int | None,
                  finished: bool) -> dict:
    """
    ``meta_info`` as SGLang 0.5.9's tokenizer manager builds it: the token
    counts always; once finished, the latency and, with speculation, the
    request's own verify steps and what they accepted
    (``_calculate_spec_decoding_metrics``). These are per request and never lag,
    unlike ``/server_info``'s ``avg_spec_accept_length``.
    """
    meta = {
        "id": rid,
        "finish_reason": ({"type": "length", "length": seq.completion_tokens} if finished
                          else None),
        "prompt_tokens": seq.prompt_tokens,
        "completion_tokens": seq.completion_tokens,
        "cached_tokens": seq.cached_tokens,
    }
    if not finished:
        return meta
    meta["e2e_latency"] = seq.e2e_latency()
    if num_draft_tokens is None or not seq.verify_ct:
        return meta
    # Each verify step yields one token of the target's own beside the drafts it accepted.
    guessed = seq.verify_ct * (num_draft_tokens - 1)
    accepted = seq.completion_tokens - seq.verify_ct
    if guessed > 0:
        meta.update({
            "spec_accept_rate": accepted / guessed,
            "spec_accept_length": seq.completion_tokens / seq.verify_ct,
            "spec_accept_token_num": accepted,
            "spec_draft_token_num": guessed,
            "spec_verify_ct": seq.verify_ct,
        })
    if any(seq.accept_histogram):
        meta["spec_accept_histogram"] = list(seq.accept_histogram)
    return meta
