"""The decoder of a hybrid language model (Qwen3.5's: Gated DeltaNet layers among full-attention
ones, deltanet.py): DecoderLM's prefix reuse and one-step answer, with what each layer carries past
a token in place of its KV.

A prefix pass keeps, per layer, the prefix's K and V (attention layers) or its recurrent state and
conv tail (DeltaNet layers); each question's suffix starts from its prefix's, and a whole prompt
from zeros. Right-padded suffix rows keep the state at their own last token (deltanet.delta_chunks),
so a continuation starts from each row's own. The continuation's attention layers use DecodeCache as
DecoderLM's do; its DeltaNet layers step their state and tail one token at a time (beams reorder
both with the rest).

The engine's interventions and the image-attention probe act on attention over every layer: they are
refused here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...kernels import PrefixRuns, resolve_backend
from .attention import causal_attention, masked_attention, suffix_attention
from .caches import DecodeCache, PrefixKV, SuffixKV, SuffixOut
from .decoder import DecoderLM
from .deltanet import DeltaNetLayer, HybridDims, hybrid_layer
from .interventions import Intervention
from ..inputs.plan import TokenBatch, to_device


@dataclass
class HybridPrefix(PrefixKV):
    """PrefixKV whose DeltaNet layers hold, in place of K and V (None there), the state
    [G, Hv, Dk, Dv] and the conv tail [G, C, K - 1] after the prefix (None at attention layers)."""

    states: list = field(default_factory=list)
    tails: list = field(default_factory=list)


@dataclass
class HybridSuffix(SuffixKV):
    """SuffixKV with each row's state and conv tail after its last token, per DeltaNet layer (as
    HybridPrefix)."""

    states: list = field(default_factory=list)
    tails: list = field(default_factory=list)

    def repeat_rows(self, k: int) -> "HybridSuffix":
        def rows(x):
            return None if x is None else x.repeat_interleave(k, dim=0)

        kv = super().repeat_rows(k)
        return HybridSuffix(kv.keys, kv.values, kv.lengths, kv.next_position, kv.image_mask,
                            [rows(s) for s in self.states], [rows(t) for t in self.tails])


class HybridDecodeCache(DecodeCache):
    """DecodeCache over the attention layers alone, with the DeltaNet layers' states and tails
    beside it."""

    def __init__(self, *args, states: list, tails: list):
        super().__init__(*args)
        self.states, self.tails = states, tails

    def reorder(self, rows: torch.Tensor) -> None:
        super().reorder(rows)
        self.states = [None if s is None else s.index_select(0, rows) for s in self.states]
        self.tails = [None if t is None else t.index_select(0, rows) for t in self.tails]


def refuse(intervention: Intervention | None, probe: bool = False) -> None:
    if intervention is not None:
        raise NotImplementedError(f"{type(intervention).__name__} edits attention on every layer; "
                                  "a hybrid decoder's Gated DeltaNet layers have none (Qwen3.5): "
                                  "run it without a method that edits")
    if probe:
        raise NotImplementedError("probe image-attention reads attention on every layer; a hybrid "
                                  "decoder's Gated DeltaNet layers have none (Qwen3.5)")


class HybridLM(DecoderLM):
    def __init__(self, dims: HybridDims, weights: dict[str, torch.Tensor], **kwargs):
        super().__init__(dims, weights, layer_class=hybrid_layer, **kwargs)
        self.attention_layers = [i for i, linear in enumerate(dims.linear_layers) if not linear]

    @torch.inference_mode()
    def prefill_prefix(self, batch: TokenBatch,
                       intervention: Intervention | None = None) -> HybridPrefix:
        """G image prefixes of one length P → what every layer carries past them (the last layer's
        MLP is skipped: no prefix position is read out)."""
        refuse(intervention)
        x = self.embed(batch.ids, batch.image_index, batch.features)
        ropes = self.rotary_of(batch)
        keys, values, states, tails = [], [], [], []
        for i, layer in enumerate(self.layers):
            k = v = state = tail = None
            if isinstance(layer, DeltaNetLayer):
                mixed, state, tail = layer.mix(x, *layer.empty_carry(x.shape[0]))
                x = layer.finish(x, mixed) if i < len(self.layers) - 1 else x
            else:
                q, k, v, gate = layer.qkv_gate(x, *ropes[i])
                x = layer.finish(x, causal_attention(q, k, v), gate) \
                    if i < len(self.layers) - 1 else x
            keys.append(k), values.append(v), states.append(state), tails.append(tail)
        return HybridPrefix(keys, values, batch.ids.shape[1], batch.image_spans, batch.image_mask,
                            states, tails)

    @torch.inference_mode()
    def prefill_suffix(self, prefix: HybridPrefix | None, prefix_index: list[int] | None,
                       batch: TokenBatch, intervention: Intervention | None = None,
                       probe: bool = False, residuals: bool = False) -> SuffixOut:
        """DecoderLM.prefill_suffix's rows, each DeltaNet layer starting from its prefix's state and
        tail (zeros for whole prompts)."""
        refuse(intervention, probe)
        if residuals:
            raise NotImplementedError("a method that reads every layer's output at the answer "
                                      "position (VISTA's residual streams) is not built for a "
                                      "hybrid decoder (Qwen3.5)")
        x = self.embed(batch.ids, batch.image_index, batch.features)
        ropes = self.rotary_of(batch)
        backend = resolve_backend(self.kernels, self.device)
        runs = index = None
        if prefix is not None:
            runs = PrefixRuns(prefix_index, self.device)
            index = to_device(torch.tensor(prefix_index, dtype=torch.long), self.device)
        keys, values, states, tails = [], [], [], []
        for i, layer in enumerate(self.layers):
            k = v = state = tail = None
            if isinstance(layer, DeltaNetLayer):
                carry = layer.empty_carry(x.shape[0]) if prefix is None \
                    else (prefix.states[i][index], prefix.tails[i][index])
                mixed, state, tail = layer.mix(x, *carry, batch.lengths)
                x = layer.finish(x, mixed)
            else:
                q, k, v, gate = layer.qkv_gate(x, *ropes[i])
                attn = suffix_attention(q, k, v, batch, prefix, runs, i, None, backend)
                x = layer.finish(x, attn, gate)
            keys.append(k), values.append(v), states.append(state), tails.append(tail)
        last = x[torch.arange(x.shape[0], device=self.device), batch.lengths - 1]
        kv = HybridSuffix(keys, values, batch.lengths, batch.next_position, batch.image_mask,
                          states, tails)
        return SuffixOut(last, kv, None)

    def _decode_cache(self, prefix, prefix_index, suffix, steps, chunk, intervention):
        refuse(intervention)
        d, att = self.dims, self.attention_layers
        if prefix is not None:
            prefix = PrefixKV([prefix.keys[i] for i in att], [prefix.values[i] for i in att],
                              prefix.length, prefix.image_spans, prefix.image_mask)
        own = SuffixKV([suffix.keys[i] for i in att], [suffix.values[i] for i in att],
                       suffix.lengths, suffix.next_position, suffix.image_mask)
        empty = torch.zeros(d.num_kv_heads, 0, d.head_dim, device=self.device, dtype=self.dtype)
        cache = HybridDecodeCache(prefix, prefix_index, own, steps, chunk, None, empty,
                                  states=list(suffix.states), tails=list(suffix.tails))
        return cache, [None] * len(self.layers)

    def _decode_step(self, cache: HybridDecodeCache, token: torch.Tensor, t: int, edits,
                     intervention) -> torch.Tensor:
        """Generated token t of every row [B] through every layer → its last hidden states
        [B, 1, H]."""
        x = self.embed(token)[:, None]
        slot, valid, _ = cache.next_slot(t, False)
        positions = (cache.suffix.next_position + t)[:, None]
        ropes = self._per_layer(lambda rotary: rotary.cos_sin(positions, self.dtype))
        for i, layer in enumerate(self.layers):
            if isinstance(layer, DeltaNetLayer):
                mixed, cache.states[i], cache.tails[i] = layer.step(x, cache.states[i],
                                                                    cache.tails[i])
                x = layer.finish(x, mixed)
                continue
            j = self.attention_layers.index(i)
            q, k, v, gate = layer.qkv_gate(x, *ropes[i])
            cache.own_k[j][:, :, slot] = k[:, :, 0]
            cache.own_v[j][:, :, slot] = v[:, :, 0]
            attn = [masked_attention(q[a:e], *cache.prefix_kv(j, g), cache.own_k[j][a:e],
                                     cache.own_v[j][a:e], valid[a:e]) for g, a, e in cache.runs]
            x = layer.finish(x, attn[0] if len(attn) == 1 else torch.cat(attn), gate)
        return x
