"""Thinking checkpoints: those whose chat template opens a reasoning block (`<think>`) for the
answer to follow, or lets the caller switch it off (`enable_thinking`). A one-prefill readout needs
a defined answer position, so such a checkpoint runs under a named mode (`--thinking`):

- off: thinking switched off as the template allows: `enable_thinking=False` where the template
  reads it, else an empty block `<think>\\n\\n</think>\\n\\n` in the place the template opens one;
  the answer position follows it;
- decode[:max_tokens=N]: the reasoning decoded greedily from the template's own prompt, at most N
  tokens, and the answer position read right after its `</think>` and what the template puts after
  one; a reasoning that does not close within N answers unknown under every readout (`NOT_CLOSED`),
  never an answer made up for it.

A checkpoint whose template does neither has nothing to switch: `decode` is refused for it, `off`
changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"
AFTER_CLOSE = "\n\n"  # what Qwen3's templates write after a reasoning block's close
EMPTY_BLOCK = OPEN + "\n\n" + CLOSE + AFTER_CLOSE  # Qwen3's enable_thinking=False block
MODES = ("off", "decode")
DEFAULT_MAX_TOKENS = 4096
THINKING_HELP = ("a thinking checkpoint (its chat template opens <think>): off, thinking switched "
                 "off as its template allows; decode (its default), the reasoning decoded "
                 f"greedily (at most N tokens, {DEFAULT_MAX_TOKENS} unless given), then the answer "
                 "position after </think>")
NOT_CLOSED = "reasoning not closed"  # why an answer is unknown whose reasoning ran past its cap


@dataclass(frozen=True)
class ThinkingMode:
    mode: str  # off | decode
    max_tokens: int | None = None  # decode's cap on the reasoning's tokens

    @classmethod
    def parse(cls, spec: str) -> "ThinkingMode":
        """`off`, `decode` or `decode:max_tokens=N`; ValueError naming the parameter."""
        mode, colon, options = spec.partition(":")
        if mode not in MODES or (colon and mode == "off"):
            raise ValueError(f"thinking must be off, decode or decode:max_tokens=N, not {spec!r}")
        if mode == "off":
            return cls("off")
        key, _, value = options.partition("=")
        if colon and (key != "max_tokens" or not value.isdigit() or int(value) < 1):
            raise ValueError(f"thinking {spec!r}: decode takes max_tokens=N, a positive number of "
                             "reasoning tokens")
        return cls("decode", int(value) if colon else DEFAULT_MAX_TOKENS)

    def to_json(self) -> dict:
        return {"mode": self.mode,
                **({"max_tokens": self.max_tokens} if self.mode == "decode" else {})}


def opens_block(prompt: str) -> bool:
    """Whether a rendered prompt ends inside an open reasoning block (its last <think> unclosed)."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def closed(prompt: str) -> str:
    """A prompt whose template opened a reasoning block, with that block empty and closed, as
    Qwen3's template writes one under enable_thinking=False."""
    return prompt[:prompt.rfind(OPEN)] + EMPTY_BLOCK if opens_block(prompt) else prompt


def after_close(off_prompt: str) -> str:
    """What the template puts after a reasoning block's `</think>`, read from its thinking-off
    prompt (where it closes an empty block)."""
    return off_prompt[off_prompt.rfind(CLOSE) + len(CLOSE):] if CLOSE in off_prompt else AFTER_CLOSE


def is_thinking(prompt: str, off_prompt: str) -> bool:
    """Whether a chat template's prompt and its thinking-off prompt say the checkpoint thinks: it
    opens a reasoning block, or it reads enable_thinking (Qwen3's hybrid template opens none, and
    the model opens one itself)."""
    return opens_block(prompt) or off_prompt != prompt
