"""The seam between model families and the language model: what a prompt looks like to the model
(`PromptLayout`), how a call's prompts are batched (`make_plan`), the token rows the language model
takes (`TokenBatch`) and what comes back per prompt (`PromptResult`).

From image to record:

    image ──family.preprocess/encode_images──▶ features (cached per image content)
    (features, prompt text) ──family.layout──▶ PromptLayout: ids with image slots marked, M-RoPE
        positions where the family has them, the image-token spans, the prefix cut (the tokens every
        prompt of the image shares: up to its last image token)
    (no image, prompt text) ──family.text_layout──▶ PromptLayout without image slots or a prefix cut
        (a text-only prompt runs whole, batched with the other whole prompts)
    Rows of layouts ──make_plan──▶ Stages: one PrefixGroup (distinct prefixes of one length,
        prefilled together) and the SuffixBatches that continue it (or whole-prompt batches where
        nothing is shared)
    PrefixGroup / SuffixBatch ──TokenBatch.of──▶ ids, features, positions, image mask and spans
        ──DecoderLM.prefill_prefix / prefill_suffix──▶ the hidden state at each answer position
    ──DecoderLM.answer (+ decode for string readouts)──▶ PromptResult
    ──Engine.decide──▶ predictions ──▶ record
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...readout.records import AnswerFields


@dataclass(frozen=True)
class PromptLayout:
    """One prompt as the language model reads it.

    ids: token ids with every image slot holding `image_token_id` (a family may use a sentinel
    outside the vocabulary, as mPLUG-Owl2's -200; the slot's embedding comes from the image features
    either way). image_spans: [start, end) of each run of image slots. prefix_cut: how many leading
    tokens are shared by every prompt of the same image (0: none; those prompts run whole).
    positions: M-RoPE streams [3, L] where the family has them; None means 0 .. L-1.
    """

    ids: tuple[int, ...]
    image_token_id: int
    image_spans: tuple[tuple[int, int], ...]
    prefix_cut: int
    positions: torch.Tensor | None = None

    @classmethod
    def of(cls, ids: list[int], image_token_id: int, *, share_prefix: bool = True,
           positions: torch.Tensor | None = None) -> "PromptLayout":
        """The layout of `ids`; with share_prefix, the prefix runs up to and including the last
        image token, leaving at least one token to read the answer from."""
        spans = image_runs(ids, image_token_id)
        cut = min(spans[-1][1], len(ids) - 1) if spans and share_prefix else 0
        return cls(tuple(ids), image_token_id, spans, cut, positions)

    def __len__(self) -> int:
        return len(self.ids)

    def image_tokens_before(self, column: int) -> int:
        """Image slots in ids[:column]: where the features of a span starting there begin."""
        return sum(max(0, min(end, column) - start) for start, end in self.image_spans)


def image_runs(ids: list[int] | tuple[int, ...],
               image_token_id: int) -> tuple[tuple[int, int], ...]:
    """[start, end) of each maximal run of image_token_id in ids."""
    ids = tuple(ids)
    count = ids.count(image_token_id)
    if not count:
        return ()
    first = ids.index(image_token_id)
    if ids[first:first + count] == (image_token_id,) * count:
        # one run, as every family lays it out: no loop
        return ((first, first + count),)
    runs, start = [], None
    for i, t in enumerate(ids):
        if t == image_token_id and start is None:
            start = i
        elif t != image_token_id and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(ids)))
    return tuple(runs)


@dataclass
class Row:
    """One (image, prompt) pair of a call: where its result goes, its layout and the features its
    image slots take (one row per slot, in order; None for a text-only prompt)."""

    item: int
    prompt: int
    layout: PromptLayout
    features: torch.Tensor | None
    # its image's key ("": none), which with its prompt seeds a sampled continuation's draws
    key: str = ""
    # a thinking checkpoint's decoded reasoning (its text, its token count) that the layout holds
    # before its answer position, where one ran (engine/thinking.py)
    reasoning: tuple[str, int] | None = None


@dataclass
class PrefixGroup:
    """Distinct prefixes of one length, prefilled in one pass: one representative row each (the
    first to ask it), in slot order."""

    length: int
    rows: list[Row]


@dataclass
class SuffixBatch:
    """Rows prefilled together: each continues prefix `slots[b]` of its stage's group, or (slots
    None) runs whole. Rows come grouped by slot, as prefix_attention wants them."""

    rows: list[Row]
    slots: list[int] | None


@dataclass
class Stage:
    prefix: PrefixGroup | None
    batches: list[SuffixBatch]


def make_plan(rows: list[Row], batch_size: int, prefix_reuse: bool) -> list[Stage]:
    """The batching policy. Rows whose layouts share a prefix (with prefix_reuse) are grouped by
    prefix length, in order of first appearance; a prefix is one per (image, prefix ids), so two
    prompts of one image whose text before the image differs get two. Within a group, rows are
    ordered by their prefix (stably) and cut into batches of batch_size. Rows with no shared prefix
    form one more stage of whole-prompt batches, in the order given."""
    by_length: dict[int, list[Row]] = {}
    for row in rows:
        cut = row.layout.prefix_cut if prefix_reuse else 0
        by_length.setdefault(cut or -1, []).append(row)
    stages = []
    for length, group in by_length.items():
        if length < 0:
            stages.append(Stage(None, [SuffixBatch(group[a:a + batch_size], None)
                                       for a in range(0, len(group), batch_size)]))
            continue
        slot_of: dict[tuple, int] = {}
        firsts: list[Row] = []
        for row in group:
            key = (row.item, row.layout.ids[:length])
            if key not in slot_of:
                slot_of[key] = len(slot_of)
                firsts.append(row)
        slots = [slot_of[row.item, row.layout.ids[:length]] for row in group]
        order = sorted(range(len(group)), key=slots.__getitem__)
        cuts = [order[a:a + batch_size] for a in range(0, len(order), batch_size)]
        batches = [SuffixBatch([group[i] for i in cut], [slots[i] for i in cut]) for cut in cuts]
        stages.append(Stage(PrefixGroup(length, firsts), batches))
    return stages


@dataclass
class TokenBatch:
    """Token rows right-padded to one width: what the language model takes.

    ids [B, S] (image slots and padding hold 0: their ids are never looked up); lengths [B];
    image_mask [B, S] (True at image slots) and features [N, H] (the slots' rows, in row-major
    order), both None when no row holds an image slot; positions [B, S], [S] when every row shares
    them, or M-RoPE streams [3, B, S]; next_position [B], the position of each row's next token;
    image_spans per row, in this batch's columns; image_index [N], the image slots' places in ids
    flattened (b * S + column, row-major: where features' rows go, found with no read back of the
    mask)."""

    ids: torch.Tensor
    lengths: torch.Tensor
    image_mask: torch.Tensor | None
    features: torch.Tensor | None
    positions: torch.Tensor
    next_position: torch.Tensor
    image_spans: list[tuple[tuple[int, int], ...]]
    image_index: torch.Tensor | None = None

    @classmethod
    def of(cls, rows: list[Row], start: int, end: int | None, device: torch.device,
           mrope: bool) -> "TokenBatch":
        """Columns [start, end) of each row's layout (end None: to the row's end)."""
        ids = [r.layout.ids[start:end] for r in rows]
        lengths = [len(i) for i in ids]
        width = max(lengths)
        # one host tensor, image slots (a sentinel id such as mPLUG-Owl2's -200) and padding 0:
        # never looked up
        padded = [list(row_ids) + [0] * (width - len(row_ids)) for row_ids in ids]
        spans, pieces, index = [], [], []
        for b, (row, row_ids) in enumerate(zip(rows, ids)):
            stop = start + len(row_ids)
            row_spans = tuple((max(a, start) - start, min(e, stop) - start)
                              for a, e in row.layout.image_spans if e > start and a < stop)
            spans.append(row_spans)
            for a, e in row_spans:
                padded[b][a:e] = [0] * (e - a)
                index += range(b * width + a, b * width + e)
            if row_spans:
                first = row.layout.image_tokens_before(start)
                count = sum(e - a for a, e in row_spans)
                pieces.append(row.features.reshape(-1, row.features.shape[-1])[first:first + count])
                if pieces[-1].shape[0] != count:
                    raise ValueError(f"{count} image tokens in the prompt but "
                                     f"{pieces[-1].shape[0]} image features")
        positions, next_position = _positions(rows, start, width, lengths, mrope)
        image = bool(pieces)
        mask = torch.zeros(len(rows) * width, dtype=torch.bool)
        if image:
            mask[index] = True
        return cls(to_device(torch.tensor(padded, dtype=torch.long), device),
                   to_device(torch.tensor(lengths), device),
                   to_device(mask.view(len(rows), width), device) if image else None,
                   torch.cat(pieces).to(device) if image else None, to_device(positions, device),
                   to_device(next_position, device), spans,
                   to_device(torch.tensor(index), device) if image else None)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on the device without the host waiting: on CUDA copied from pinned memory,
    non-blocking (the copy is ordered before every later kernel of the stream, and the pinned block
    is kept until it is done)."""
    return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)


def _positions(rows: list[Row], start: int, width: int, lengths: list[int], mrope: bool):
    """Rotary positions of columns [start, start + width) and each row's next position. Without
    M-RoPE a token's position is its column in the prompt, the same for every row; with it, each
    layout's own streams (padding repeats a row's last position: it is never read)."""
    if not mrope:
        return torch.arange(start, start + width), torch.tensor(lengths) + start
    streams = []
    for row in rows:
        p = row.layout.positions[:, start:start + width]
        streams.append(torch.cat([p, p[:, -1:].expand(3, width - p.shape[1])], dim=1))
    positions = torch.stack(streams, dim=1)  # [3, B, S]
    last = positions[:, torch.arange(len(rows)), torch.tensor(lengths) - 1]  # [3, B]
    return positions, last.amax(dim=0) + 1


@dataclass(kw_only=True)
class PromptResult(AnswerFields):
    """What one prompt's answer position gives: the fields its record keeps (AnswerFields: the
    argmax token, the candidate logits, the continuation a text readout asked for, ...), and what
    the engine alone reads: the whole vocabulary's logits and each layer's output there where a
    method asks, and the attention probe's raw values."""

    probe: dict | None = None
    # [V] fp32, for methods
    vocab_logits: torch.Tensor | None = field(default=None, repr=False, compare=False)
    # [L, H], where a method asks
    residuals: torch.Tensor | None = field(default=None, repr=False, compare=False)
    # [V], a lens_layers pass's
    lens_logits: torch.Tensor | None = field(default=None, repr=False, compare=False)


def extended(layout: PromptLayout, ids: list[int]) -> PromptLayout:
    """The layout with text tokens after it (a reasoning and what follows it): M-RoPE's three
    streams go on from its last token's, a text token's, whose streams are equal."""
    positions = layout.positions
    if positions is not None:
        positions = torch.cat([positions, positions[:, -1:] + torch.arange(1, len(ids) + 1)], dim=1)
    return PromptLayout(layout.ids + tuple(ids), layout.image_token_id, layout.image_spans,
                        layout.prefix_cut, positions)


def without_image(layout: PromptLayout, mrope) -> PromptLayout:
    """The layout's own tokens with its image slots removed: a text-only prompt, run whole (M-RoPE's
    three streams are then the plain positions, as for any text)."""
    ids = [t for t in layout.ids if t != layout.image_token_id]
    positions = torch.arange(len(ids)).expand(3, -1) if mrope is not None else None
    return PromptLayout(tuple(ids), layout.image_token_id, (), 0, positions)
