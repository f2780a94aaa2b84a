"""One greedy continuation shared by every text readout, each reading its own prefix of it.

Each text readout generates as its reference does (`Generation` in readouts.py): the engine decodes
once, to the longest length any requested readout needs, and stops early once every row is complete
for every readout (a stop token, or the readout's own end: its length, or the first sentence). Each
readout's text is then cut from the shared tokens, so it is exactly what a separate run of that
length would have decoded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from .readouts import GENERATING, READOUTS, Generation

# token ids → text (the tokenizer's decode, special tokens skipped)
Decode = Callable[[Sequence[int]], str]


def generation_plan(names: Iterable[str], max_new_tokens: int | None, positions_limit: int,
                    lengths: Mapping[str, int] | None = None) -> dict[str, Generation]:
    """The resolved generation of each requested text readout: its reference's length (or the one
    `lengths` gives it: a protocol's tool's), within the model's positions; `max_new_tokens`
    overrides every length (and the first-sentence end, so that an override reproduces a
    fixed-length run exactly)."""
    plan = {}
    for name in names:
        readout = READOUTS[name]
        if readout.kind not in GENERATING:
            continue
        if max_new_tokens is not None:
            plan[name] = Generation(max_new_tokens)
        else:
            g = readout.generation
            length = (lengths or {}).get(name, g.new_tokens)
            plan[name] = Generation(min(length, positions_limit), g.first_sentence)
    return plan


def _stop_index(ids: Sequence[int], stop_ids: set[int]) -> int:
    return next((k for k, t in enumerate(ids) if t in stop_ids), len(ids))


def text_end(ids: Sequence[int], stop_ids: set[int], generation: Generation, decode: Decode) -> int:
    """How many of the shared new tokens one readout reads: up to its length and the first stop id
    (excluded), and with first_sentence up to the token that brings the first '.'."""
    end = min(_stop_index(ids, stop_ids), generation.new_tokens)
    if generation.first_sentence and "." in decode(ids[:end]):
        end = next(k for k in range(1, end + 1) if "." in decode(ids[:k]))
    return end


def finished(ids: Sequence[int], stop_ids: set[int], generation: Generation,
             decode: Decode) -> bool:
    """True once more tokens cannot change this readout's text (the loop may stop for this row)."""
    if _stop_index(ids, stop_ids) < len(ids) or len(ids) >= generation.new_tokens:
        return True
    return generation.first_sentence and "." in decode(ids)


def all_finished(rows: Sequence[Sequence[int]], stop_ids: set[int], plan: Mapping[str, Generation],
                 decode: Decode) -> bool:
    """The decode loop's early stop: every row is finished for every requested readout."""
    return all(finished(ids, stop_ids, g, decode) for ids in rows for g in plan.values())


@dataclass(frozen=True)
class Continuation:
    """One row's greedy new tokens and what each text readout reads of them."""

    ids: tuple[int, ...]  # the new tokens up to (not including) the first stop id
    text: str  # all of them decoded
    ends: dict[str, int]  # readout → how many of `ids` it reads
    texts: dict[str, str]  # readout → its own prefix decoded
    # the readouts whose text its length cut, not a stop token or its sentence's end
    capped: tuple[str, ...] = ()


def cut(tokens: Sequence[int], stop_ids: set[int], plan: Mapping[str, Generation],
        decode: Decode) -> Continuation:
    """Each readout's prefix of one row's shared continuation, decoded, and which its length cut."""
    stop = _stop_index(tokens, stop_ids)
    ids = tuple(tokens[:stop])
    text = decode(ids)
    ends = {name: text_end(ids, stop_ids, g, decode) for name, g in plan.items()}
    texts = {name: text if end == len(ids) else decode(ids[:end]) for name, end in ends.items()}
    # cut by its length: it ends before the stop token, or no stop token came at all (the model's
    # positions ran out), and not where a first-sentence readout's sentence ends
    capped = tuple(name for name, g in plan.items() if not (g.first_sentence and "." in texts[name])
                   and (ends[name] < len(ids) or stop == len(tokens)))
    return Continuation(ids, text, ends, texts, capped)
