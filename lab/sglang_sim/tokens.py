"""Tokens and the prefix cache.

A token is a whitespace-separated word. That is crude, but it is deterministic
and lets a client build an exact-length prompt cheaply (``"x " * 120_000`` is
120,000 tokens). A chat prompt is rendered one ``role: content`` line per
message, so each message adds one token for its role.

The prefix cache keeps chained hashes of 64-token blocks, the granularity of a
paged radix cache: a prompt reuses the longest run of leading blocks an earlier
prompt already computed.
"""

import hashlib
from collections import OrderedDict
from collections.abc import Iterable

BLOCK_TOKENS = 64
# KV pool of the simulated GPU, in tokens; least recently used blocks go first.
CACHE_CAPACITY_TOKENS = 1 << 20


def tokenize(text: str) -> list[str]:
    return text.split()


def render_chat(messages: Iterable[dict]) -> str:
    """The prompt a chat template would build, one line per message."""
    return "\n".join(f"{message['role']}: {message_text(message)}" for message in messages)


def message_text(message: dict) -> str:
    """A message's text, whether content is a string or a list of text parts."""
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return " ".join(part.get("text", "") for part in content)


def block_hashes(tokens: list[str]) -> list[bytes]:
    """Chained hashes of the prompt's full blocks, each naming its whole prefix.

    The last prompt token is always computed (it yields the first output token),
    so it never counts as cached, as in SGLang's radix cache.
    """
    hashes = []
    digest = b""
    for start in range(0, (len(tokens) - 1) // BLOCK_TOKENS * BLOCK_TOKENS, BLOCK_TOKENS):
        block = "\0".join(tokens[start:start + BLOCK_TOKENS]).encode()
        digest = hashlib.blake2b(digest + block, digest_size=16).digest()
        hashes.append(digest)
    return hashes


class PrefixCache:
    """Which prompt blocks the simulated KV pool still holds."""

    def __init__(self, capacity_tokens: int = CACHE_CAPACITY_TOKENS) -> None:
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._capacity = capacity_tokens // BLOCK_TOKENS

    def match_and_insert(self, hashes: list[bytes]) -> int:
        """Cached tokens for this prompt; its blocks are cached from now on."""
        matched = 0
        while matched < len(hashes) and hashes[matched] in self._blocks:
            matched += 1
        for digest in hashes:
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
        return matched * BLOCK_TOKENS
