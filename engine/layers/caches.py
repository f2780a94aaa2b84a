"""The KV caches the language model's attention reads (attention.py): the image prefixes'
(`PrefixKV`), the question suffixes' own (`SuffixKV`, within `SuffixOut`, what a suffix prefill
gives), and a continuation's (`DecodeCache`: prefix shared, own keys growing with the tokens)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...kernels import prefix_runs


@dataclass
class PrefixKV:
    """The caches of G image prefixes of one length P: per layer K and V [G, Hkv, P, D], RoPE
    applied, and where each prefix's image tokens are (spans, and a [G, P] mask; None without
    any)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int
    image_spans: list[tuple[tuple[int, int], ...]]
    image_mask: torch.Tensor | None

    def image_keys(self, g: int | None) -> torch.Tensor:
        """[P] bool: prefix g's image keys ([0] for no prefix, g None: whole prompts)."""
        device = self.keys[0].device
        if g is None:
            return torch.zeros(0, dtype=torch.bool, device=device)
        if self.image_mask is None:
            return torch.zeros(self.length, dtype=torch.bool, device=device)
        return self.image_mask[g]


@dataclass
class SuffixKV:
    """The question suffixes' own cache, per layer [B, Hkv, S, D], valid up to `lengths`."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor
    next_position: torch.Tensor  # [B]: the position of each row's first generated token
    # [B, S]: own keys that hold image tokens (whole prompts)
    image_mask: torch.Tensor | None = None

    def repeat_rows(self, k: int) -> "SuffixKV":
        """Each row k times over, in place of it (a beam search's beams of one row, side by
        side)."""
        def rows(x):
            return None if x is None else x.repeat_interleave(k, dim=0)

        return SuffixKV([rows(x) for x in self.keys], [rows(x) for x in self.values],
                        rows(self.lengths), rows(self.next_position), rows(self.image_mask))


@dataclass
class SuffixOut:
    """What DecoderLM.prefill_suffix gives: each row's last hidden state [B, H] (before the final
    norm), the suffixes' own KV, and with the probe the attention mass on image tokens at that token
    [B, L, Hq] (fp32; see answer_image_attention)."""

    last_hidden: torch.Tensor
    kv: SuffixKV
    image_attention: torch.Tensor | None
    # [B, L, H]: each decoder layer's output at the last token, where asked
    residuals: torch.Tensor | None = None


class DecodeCache:
    """The keys and values a greedy continuation reads: each row's prefix (shared, never copied) and
    its own suffix keys followed by slots for generated tokens, which grow `chunk` at a time, so a
    long allowance costs only what is generated. Generated token t sits in slot S + t, after the
    padded suffix region, so rows of any length line up."""

    def __init__(self, prefix: PrefixKV | None, prefix_index: list[int] | None, suffix: SuffixKV,
                 steps: int, chunk: int, window: int | None, empty: torch.Tensor):
        """`window`: the model's sliding window (None: none); `empty`: [Hkv, 0, D] in the model's
        device and dtype, the prefix of rows that have none."""
        self.prefix, self.suffix, self.window = prefix, suffix, window
        self.steps, self.chunk = steps, chunk
        self.batch, self.width = suffix.keys[0].shape[0], suffix.keys[0].shape[2]
        self.runs = prefix_runs(prefix_index) if prefix is not None else [(None, 0, self.batch)]
        self._empty = empty
        self.own_k = [self._grow(k) for k in suffix.keys]
        self.own_v = [self._grow(v) for v in suffix.values]

    def _grow(self, x: torch.Tensor) -> torch.Tensor:  # [B, Hkv, slots, D] → chunk more slots
        return torch.cat([x, x.new_zeros(*x.shape[:2], min(self.chunk, self.steps), x.shape[3])],
                         dim=2)

    def next_slot(self, t: int, edited: bool):
        """Generated token t's slot, the own keys each row may see then [B, 1, slots], and (when an
        edit reads them) which own keys hold image tokens [B, slots]: whole prompts hold the
        image."""
        slot = self.width + t
        if slot >= self.own_k[0].shape[2]:
            self.own_k = [self._grow(k) for k in self.own_k]
            self.own_v = [self._grow(v) for v in self.own_v]
        slots = torch.arange(self.own_k[0].shape[2], device=self.own_k[0].device)
        lengths = self.suffix.lengths
        generated = (slots[None] >= self.width) & (slots[None] <= slot)
        valid = ((slots[None] < lengths[:, None]) | generated)[:, None]
        own_image = None
        if edited:
            own_image = torch.zeros(self.batch, slots.shape[0], dtype=torch.bool,
                                    device=slots.device)
            if self.suffix.image_mask is not None:
                own_image[:, :self.width] = self.suffix.image_mask
        return slot, valid, own_image

    def reorder(self, rows: torch.Tensor) -> None:
        """The rows' own keys and values carried over [B] (each beam takes the cache of the beam it
        continues, within its row's beams, so the shared prefix and the suffix lengths stay as they
        are)."""
        self.own_k = [k.index_select(0, rows) for k in self.own_k]
        self.own_v = [v.index_select(0, rows) for v in self.own_v]

    def window_masks(self, t: int, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What a sliding layer's generated token t sees (masking_utils.sliding_window_overlay: keys
        fewer than `window` tokens back): `valid` narrowed to its own keys in the window, and which
        prefix keys lie in it [B, 1, P]; None while no row's sequence reaches past the window (then
        every key is in it). Token t sits at sequence index P + length + t, own key j < length at P
        + j and generated slot S + u at P + length + u."""
        prefix = self.prefix.length if self.prefix is not None else 0
        lengths = self.suffix.lengths
        if self.window is None or prefix + int(lengths.max()) + t < self.window:
            return None
        device = valid.device
        slots = torch.arange(valid.shape[-1], device=device)
        index = torch.where(slots[None] < self.width, prefix + slots[None],
                            prefix + lengths[:, None] + slots - self.width)
        query = prefix + lengths[:, None] + t  # [B, 1]
        own = valid & (query - index < self.window)[:, None]
        keys = torch.arange(prefix, device=device)
        return own, (query - keys[None] < self.window)[:, None]

    def prefix_kv(self, layer: int, g: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        if g is None:
            # no prefix: [Hkv, 0, D] of this layer's heads (a family's layers may differ in them)
            own = self.own_k[layer]
            return (self._empty, self._empty) if own.shape[1:4:2] == self._empty.shape[0:3:2] else \
                (own.new_zeros(own.shape[1], 0, own.shape[3]),) * 2
        return self.prefix.keys[layer][g], self.prefix.values[layer][g]

    def prefix_image(self, g: int | None) -> torch.Tensor:
        return self.prefix.image_keys(g) if self.prefix is not None else \
            self._empty.new_zeros(0, dtype=torch.bool)
