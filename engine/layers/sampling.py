"""A sampled continuation, as transformers' `generate(do_sample=True, temperature=, top_k=, top_p=)`
draws one: each step's scores through the greedy rules' processors (generation.GreedyState, where a
tool applies them), then the sampling warpers in generate's order
(GenerationMixin._get_logits_processor, transformers 5.25 generation/utils.py l.1607-1633:
temperature, top-k, top-p), then softmax and `torch.multinomial(probs, 1)` (l.3277-3280).

generate draws every row of every call from one global generator, so its draws depend on which
questions ran before and beside each one. Here each row draws from a generator of its own, seeded by
the run's seed and the question (its image's key and its prompt's token ids): a question gets the
same tokens in any batch, on any rank, after any resume. Seeding torch's global generator with
`row_seed`'s value and calling generate on that question alone draws the same uniforms
(tests/engine/test_sampling.py)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..utils.settings import check_sampling
from .generation import GreedyState


@dataclass(frozen=True)
class Warpers:
    """The sampling warpers of generate(do_sample=True): each changes nothing at its default, where
    generate builds no processor for it (temperature 1.0, top_k 0, top_p 1.0)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p)

    def warp(self, scores: torch.Tensor) -> torch.Tensor:
        """scores [B, V] (fp32) as the warpers leave them; min_tokens_to_keep is 1 without beams
        (l.1616)."""
        if self.temperature != 1.0:
            # logits_process.py TemperatureLogitsWarper: scores / temperature
            scores = scores / self.temperature
        if self.top_k:  # TopKLogitsWarper: below the k-th largest score, -inf (ties with it kept)
            kth = torch.topk(scores, min(self.top_k, scores.shape[-1]))[0][..., -1, None]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            # TopPLogitsWarper: ascending, the tokens whose cumulative mass is <= 1 - top_p go
            ordered, order = torch.sort(scores, descending=False)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            removed = cumulative <= (1 - self.top_p)
            removed[..., -1:] = False  # the most likely token always stays
            scores = scores.masked_fill(removed.scatter(1, order, removed), float("-inf"))
        return scores


def row_seed(seed: int, key: str, ids) -> int:
    """A question's own seed: the run's seed, its image's key ("" without an image) and its prompt's
    token ids hashed, as a non-negative 63-bit integer (torch.Generator.manual_seed takes it)."""
    h = hashlib.sha256(f"{seed}|{key}|{','.join(map(str, ids))}".encode())
    return int.from_bytes(h.digest()[:8], "little") >> 1


class SampledState:
    """A batch's rows drawing their continuation: the greedy rules' state where they apply
    (penalties, lengths, suppressed tokens), the warpers, and one generator per row. It stands where
    a GreedyState stands in the decode loop: every step's choice is drawn (`bites`), from the whole
    vocabulary's logits."""

    def __init__(self, warpers: Warpers, seeds: list[int], device,
                 rules: GreedyState | None = None):
        self.warpers, self.rules = warpers, rules
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def bites(self) -> bool:
        return True

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] (fp32, as generate's scores before the processors) → each row's drawn token
        [B]. Each row is its own softmax and draw, as generate computes a batch of one."""
        scores = self.warpers.warp(logits if self.rules is None else self.rules.process(logits))
        drawn = [torch.multinomial(torch.softmax(scores[r:r + 1], dim=-1), num_samples=1,
                                   generator=g)[0, 0] for r, g in enumerate(self.generators)]
        return torch.stack(drawn)

    def push(self, tokens: torch.Tensor) -> None:
        if self.rules is not None:
            self.rules.push(tokens)
