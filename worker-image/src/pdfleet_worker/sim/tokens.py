"""Synthetic tokenisation and output text for the simulator.

Where it fits: the simulator has no real tokenizer, so prompt lengths are counted with a
stable rule that tests and load generators can target exactly: one token per word or
punctuation mark (so `"hi " * n` is n tokens). Token id lists are taken as they are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
# Chat templates wrap each message in role markers; Llama 3's costs about this many tokens.
CHAT_TOKENS_PER_MESSAGE = 4
_WORDS = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", " and")


def count_text_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


def count_prompt_tokens(prompt: Any) -> int:
    """Tokens in a /v1/completions `prompt`: a string, a token id list, or a 1-element batch."""
    if isinstance(prompt, str):
        return count_text_tokens(prompt)
    if isinstance(prompt, list):
        if all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if len(prompt) == 1:
            return count_prompt_tokens(prompt[0])
        raise ValueError("batched prompts are not supported by the simulator (send one)")
    raise ValueError("prompt must be a string or a list of token ids")


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def count_chat_tokens(messages: Sequence[Any]) -> int:
    """Tokens of a chat prompt after templating (message text plus per-message markers)."""
    total = 0
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError("each message must be an object")
        total += CHAT_TOKENS_PER_MESSAGE + count_text_tokens(_content_text(m.get("content")))
    return total


def token_text(index: int) -> str:
    """The text of the index-th generated token: one space-led word per token."""
    return _WORDS[index % len(_WORDS)]
