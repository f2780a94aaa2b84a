"""The decoder every family's language model is: LLaMA's pre-norm transformer (RMSNorm, RoPE,
grouped-query attention, a gated MLP), with the switches below selecting the variants families
declare in their `text_dims`, and POPE's two shortcuts built in.

1. Prefix reuse: every question of an image shares the prompt up to and including the image tokens
   (not so for InstructBLIP, whose image tokens depend on the question: there each prompt runs
   whole). That prefix is prefilled once (`prefill_prefix`) and its KV kept; the question suffixes
   of the image are then prefilled as one right-padded batch against it (`prefill_suffix`), each
   suffix attending to the whole prefix and causally to itself. Right padding needs no extra mask: a
   valid query never sees a later (padded) key under the causal rule, and rows are read only at
   their own last token.
2. One step: only the answer position matters, so the final norm and the lm_head run on one hidden
   state per question, for the candidate ids only, plus a full-vocabulary argmax at that position
   (`answer`, engine/layers/head.py); no [sequence, vocabulary] logits tensor is ever formed.

A greedy continuation (`decode`) exists only for string readouts.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import PrefixRuns, resolve_backend, vocab_argmax
from .attention import (answer_key_attention, kept_causal_attention, key_scaled_causal_attention,
                        masked_attention, probe_attention, prompt_attention, suffix_attention)
from .beam import BeamSearch
from .caches import DecodeCache, PrefixKV, SuffixKV, SuffixOut
from .dims import DecoderDims
from .generation import GreedyState
from .head import AnswerHead
from .decoder_layer import DecoderLayer
from .interventions import (AttentionEdit, ImageTokenDrop, Intervention, hidden_hook, key_scaling,
                            layer_edit, mlp_hook, overrides)
from .ops import Rotary, make_linear
from ..inputs.plan import TokenBatch, to_device


class DecoderLM(AnswerHead, nn.Module):
    def __init__(self, dims: DecoderDims, weights: dict[str, torch.Tensor], *, dtype: torch.dtype,
                 device: torch.device, quantize: bool, keep_packed: bool, quantize_lm_head: bool,
                 kernels: str, layer_class: type[DecoderLayer] = DecoderLayer):
        super().__init__()
        self.dims, self.dtype, self.device, self.kernels = dims, dtype, device, kernels

        def linear(w, b=None, quant=quantize):
            return make_linear(w, b, dtype=dtype, device=device, quantize=quant,
                               keep_packed=keep_packed, kernels=kernels)

        def dense(name):
            return nn.Parameter(weights.pop(name).to(device=device, dtype=dtype),
                                requires_grad=False)

        self.embed_tokens = dense("embed_tokens.weight")
        self.norm = dense("norm.weight")
        self.lm_head = linear(weights.pop("lm_head.weight"), quant=quantize and quantize_lm_head)
        layers = []
        for i in range(dims.num_layers):
            prefix = f"layers.{i}."
            own = {k[len(prefix):]: weights.pop(k)
                   for k in [k for k in weights if k.startswith(prefix)]}
            # the tensors no Linear holds, never quantized (transformers' bitsandbytes replaces
            # Linears only): the norms, and a mixture of experts' router and fused experts
            norms = {k: v.to(device=device, dtype=dtype) for k, v in own.items()
                     if "layernorm" in k or k.endswith(("q_norm.weight", "k_norm.weight",
                                                        "mlp.gate.weight"))
                     or ".experts." in k}
            layers.append(layer_class(dims, {**own, **norms}, linear))
            layers[-1].kernels = kernels  # its norms' and RoPE's; its Linears' came with `linear`
        self.layers = nn.ModuleList(layers)
        specs = dims.layer_rope or ((dims.rope_theta, 1.0),) * dims.num_layers
        rotaries = {spec: Rotary(dims.rotary_dim, spec[0], device, dims.mrope_section,
                                 dims.mrope_interleaved, factor=spec[1], llama3=dims.rope_llama3)
                    for spec in dict.fromkeys(specs)}
        # one object per distinct RoPE, shared by its layers
        self.layer_rotary = [rotaries[spec] for spec in specs]
        self.rotary = self.layer_rotary[0]  # every layer's, where they share one
        # a family's side input of every layer (Gemma 4's per-layer embeddings), None for none:
        # (ids, input embeddings [..., H]) → [..., L, P], layer i's finish taking [..., i, :] as
        # `side`
        self.layer_inputs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def embed(self, ids: torch.Tensor, image_index: torch.Tensor | None = None,
              features: torch.Tensor | None = None) -> torch.Tensor:
        """ids [...] → input embeddings [..., H]; at the image slots, image_index [N] (their places
        in ids flattened, TokenBatch.image_index: no mask read back), the rows of features [N, H]
        stand instead."""
        x = F.embedding(ids, self.embed_tokens)
        if self.dims.embed_scale is not None:
            # the scale cast to the weights' dtype, as transformers scales
            x = x * to_device(torch.tensor(self.dims.embed_scale), x.device).to(x.dtype)
        if image_index is None:
            return x
        # block 0 (DeepStack's further blocks: deepstack())
        x.view(-1, x.shape[-1])[image_index] = features[:, :x.shape[-1]].to(x.dtype)
        return x

    def deepstack(self, x: torch.Tensor, layer: int, batch: TokenBatch) -> torch.Tensor:
        """x after layer `layer` with DeepStack's block layer + 1 of the image features added at the
        image positions (the first `deepstack` layers); x unchanged for any other model, layer or
        batch."""
        if layer >= self.dims.deepstack or batch.image_mask is None:
            return x
        h = x.shape[-1]
        x = x.clone()
        features = batch.features[:, (layer + 1) * h:(layer + 2) * h]
        x[batch.image_mask] = x[batch.image_mask] + features.to(x.dtype)
        return x

    def rotary_of(self, batch: TokenBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer cos, sin [S, D] (positions shared by every row) or [B, S, D]."""
        if batch.positions.dim() == 3:
            return self._per_layer(lambda rotary: rotary.cos_sin_3d(batch.positions, self.dtype))
        return self._per_layer(lambda rotary: rotary.cos_sin(batch.positions, self.dtype))

    def _per_layer(self, cos_sin) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """cos_sin(rotary) for each layer's RoPE, computed once per distinct one."""
        done = {id(rotary): cos_sin(rotary) for rotary in dict.fromkeys(self.layer_rotary)}
        return [done[id(rotary)] for rotary in self.layer_rotary]

    def _side(self, ids: torch.Tensor, x: torch.Tensor) -> Callable[[int], dict]:
        """Layer i → the keyword arguments its finish takes besides the hidden states
        (layer_inputs')."""
        if self.layer_inputs is None:
            return lambda i: {}
        side = self.layer_inputs(ids, x)
        return lambda i: {"side": side[..., i, :]}

    @torch.inference_mode()
    def prefill_prefix(self, batch: TokenBatch,
                       intervention: Intervention | None = None) -> PrefixKV:
        """G image prefixes of one length P → their KV for every layer. The last layer's queries,
        attention output and MLP are never needed (no prefix position is read out), so the pass
        stops at its K and V; prefix hooks therefore see layers 0 .. L-2."""
        x = self.embed(batch.ids, batch.image_index, batch.features)
        ropes, side, d = self.rotary_of(batch), self._side(batch.ids, x), self.dims
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            last, source = i == len(self.layers) - 1, d.kv_of(i)
            if last and source != i:
                keys.append(keys[source])
                values.append(values[source])
                break
            q, k, v = layer.qkv(x, *ropes[i], need_q=not last, image=batch.image_mask)
            keys.append(k if source == i else keys[source])
            values.append(v if source == i else values[source])
            if last:
                break
            image = batch.image_mask if d.bidirectional(i) else None
            attn = prompt_attention(q, keys[i], values[i], image, d.window(i))
            x = layer.finish(x, attn, image=batch.image_mask,
                             mlp=mlp_hook(intervention, i, "prefix"), **side(i))
            x = self.deepstack(hidden_hook(intervention, i, x, "prefix"), i, batch)
        return PrefixKV(keys, values, batch.ids.shape[1], batch.image_spans, batch.image_mask)

    @torch.inference_mode()
    def prefill_suffix(self, prefix: PrefixKV | None, prefix_index: list[int] | None,
                       batch: TokenBatch, intervention: Intervention | None = None,
                       probe: bool = False, residuals: bool = False) -> "SuffixOut":
        """Right-padded question suffixes, row b continuing prefix slot prefix_index[b] (rows
        grouped by slot), or with prefix None whole prompts (InstructBLIP's, or the no-reuse
        reference path): the hidden state of each row's last token, the suffixes' own KV and, with
        probe, the image attention at that token (SuffixOut); with residuals, every layer's output
        at that token (VISTA's)."""
        x = self.embed(batch.ids, batch.image_index, batch.features)
        ropes, side, d = self.rotary_of(batch), self._side(batch.ids, x), self.dims
        backend = resolve_backend(self.kernels, self.device)
        # once, for every layer
        runs = PrefixRuns(prefix_index, self.device) if prefix is not None else None
        drop = intervention if isinstance(intervention, ImageTokenDrop) else None
        stream = None if intervention is None else intervention.prompt_stream(self, batch)
        whole = [h for h in ("embedded", "attended") if overrides(intervention, h)] \
            + (["drop"] if drop else []) + (["prompt_stream"] if stream is not None else [])
        if whole and prefix is not None:
            raise ValueError(f"{type(intervention).__name__} acts per question "
                             f"({', '.join(whole)}): run its prompts whole (no prefix)")
        if overrides(intervention, "embedded"):
            new = intervention.embedded(x, batch.image_mask)
            x = x if new is None else new
        attended = overrides(intervention, "attended")
        keys, values, probes, kept, streams = [], [], [], None, []
        rows = torch.arange(batch.ids.shape[0], device=self.device)
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(x, *ropes[i], image=batch.image_mask)
            if d.kv_of(i) != i:
                k, v = keys[d.kv_of(i)], values[d.kv_of(i)]
            keys.append(k)
            values.append(v)
            edit = layer_edit(intervention, i, self.dims.num_heads, self.device)
            if (probe or drop is not None) and d.window(i) is not None and \
                    x.shape[1] + (prefix.length if prefix is not None else 0) > d.window(i):
                raise NotImplementedError("the image-attention probe and token drops read prompts "
                                          f"within the sliding window of {d.window(i)} tokens only")
            if probe:
                probes.append(probe_attention(q, k, batch, prefix, runs, i, edit))
            attn = self._suffix_attention(i, q, k, v, batch, prefix, runs, intervention, edit,
                                          backend, kept)
            if drop is not None and i == drop.layer - 1 and batch.image_mask is not None:
                kept = drop.kept(answer_key_attention(q, batch.lengths, k), batch.image_mask)
            if attended:
                intervention.attended(i, answer_key_attention(q, batch.lengths, k).mean(dim=1),
                                      batch.image_mask)
            x = layer.finish(x, attn, image=batch.image_mask,
                             mlp=mlp_hook(intervention, i, "suffix"), **side(i)) \
                if stream is None else stream.layer(i, layer, x, (q, k, v), attn)
            x = hidden_hook(intervention, i, x, "suffix")
            if residuals:
                # the layer's own output, as a hook on transformers' decoder layer sees it
                streams.append(x[rows, batch.lengths - 1])
            x = self.deepstack(x, i, batch)
        return SuffixOut(x[rows, batch.lengths - 1],
                         SuffixKV(keys, values, batch.lengths, batch.next_position,
                                  batch.image_mask),
                         torch.stack(probes, dim=1) if probe else None,
                         torch.stack(streams, 1) if residuals else None)

    def _suffix_attention(self, i, q, k, v, batch: TokenBatch, prefix: PrefixKV | None,
                          runs: PrefixRuns | None, intervention: Intervention | None,
                          edit: AttentionEdit | None, backend: str, kept: torch.Tensor | None):
        """Layer i's attention in prefill_suffix: over the tokens a drop kept (after its layer),
        with the intervention's image keys scaled, or against the prefixes (edited by `edit`)."""
        d = self.dims
        scaled = key_scaling(intervention, i, batch.image_mask, prefix is None,
                             d.image_bidirectional)
        if kept is not None:
            return kept_causal_attention(q, k, v, kept,
                                         batch.image_mask if d.bidirectional(i) else None)
        if scaled is not None:
            return key_scaled_causal_attention(q, k, v, *scaled)
        return suffix_attention(q, k, v, batch, prefix, runs, i, edit, backend,
                                image_bidirectional=d.bidirectional(i), window=d.window(i))

    @torch.inference_mode()
    def decode(self, prefix: PrefixKV | None, prefix_index: list[int] | None, suffix: SuffixKV,
               first: torch.Tensor, steps: int, stop_ids: set[int],
               intervention: Intervention | None = None,
               finished: Callable[[list[list[int]]], bool] | None = None, chunk: int = 64,
               greedy: GreedyState | None = None,
               tick: Callable[[int], None] | None = None) -> torch.Tensor:
        """Greedy tokens after each row's prompt: [B, <= steps], starting with `first` [B] (the
        argmax at the answer position, or what `greedy` chose there). Each next token is the argmax,
        or with `greedy`, what its rules choose from the whole vocabulary's logits. Rows that
        emitted a stop id keep going but are cut by the caller, as transformers' generate pads them;
        the loop ends early once every row has stopped, or once `finished` says the tokens so far
        are all any reader needs. `tick` hears each step's token count."""
        cache, edits = self._decode_cache(prefix, prefix_index, suffix, steps, chunk, intervention)
        backend = resolve_backend(self.kernels, self.device)
        tokens = [first]
        stops = to_device(torch.tensor(sorted(stop_ids), dtype=first.dtype), self.device)
        done = torch.isin(first, stops)
        for t in range(steps - 1):
            if bool(done.all()) or (finished is not None
                                    and finished(torch.stack(tokens, dim=1).tolist())):
                break
            x = self._decode_step(cache, tokens[-1], t, edits, intervention)
            if greedy is not None:
                greedy.push(tokens[-1])
            if greedy is not None and greedy.bites():
                nxt = greedy.choose(self.vocab_logits(x[:, 0])).to(first.dtype)
            else:  # the fused argmax, with no [B, V] logits
                hidden, weight = self.final_norm(x[:, 0])
                nxt = vocab_argmax(hidden, self.lm_head.matrix, weight, self.dims.rms_eps,
                                   backend=backend, logits_dtype=self.dtype)
            tokens.append(nxt)
            done |= torch.isin(nxt, stops)
            if tick is not None:
                tick(len(tokens))
        return torch.stack(tokens, dim=1)

    @torch.inference_mode()
    def beam_decode(self, prefix: PrefixKV | None, prefix_index: list[int] | None, suffix: SuffixKV,
                    first_logits: torch.Tensor, search: BeamSearch, rules: GreedyState | None,
                    intervention: Intervention | None = None, chunk: int = 64) -> list[list[int]]:
        """Beam search after each row's prompt (engine/layers/beam.py) from first_logits [B, V], the
        answer position's: each step the running beams' log-probabilities through the rules'
        processors, then each surviving beam takes the cache and history of the beam it continues. →
        each row's best finished beam's new tokens."""
        k = search.beams
        index = None if prefix_index is None else [g for g in prefix_index for _ in range(k)]
        cache, edits = self._decode_cache(prefix, index, suffix.repeat_rows(k),
                                          int(search.max_new.max()), chunk, intervention)
        logits, t = first_logits.repeat_interleave(k, dim=0), 0
        while True:
            scores = F.log_softmax(logits, dim=-1)  # in float32, as generate takes them
            found = search.step(scores if rules is None else rules.process(scores))
            if found is None:
                return search.best()
            tokens, rows = found
            cache.reorder(rows)
            if rules is not None:
                rules.reorder(rows)
                rules.push(tokens)
            hidden = self._decode_step(cache, tokens, t, edits, intervention)
            logits = self.vocab_logits(hidden[:, 0])
            t += 1

    def _decode_cache(self, prefix, prefix_index, suffix, steps, chunk, intervention):
        """The decode cache of these rows, and each layer's attention edit (made once, not per
        step)."""
        if isinstance(intervention, ImageTokenDrop):
            raise ValueError("ImageTokenDrop acts on the prompt pass only: a continuation would "
                             "see every image token")
        if intervention is not None \
                and type(intervention).prompt_stream is not Intervention.prompt_stream:
            raise ValueError(f"{type(intervention).__name__} acts on the prompt pass only: no "
                             "continuation runs it")
        if intervention is not None and type(intervention).key_scale is not Intervention.key_scale:
            raise ValueError(f"{type(intervention).__name__} scales keys on the prompt pass only: "
                             "a continuation's steps would attend as the model does")
        d = self.dims
        empty = torch.zeros(d.num_kv_heads, 0, d.head_dim, device=self.device, dtype=self.dtype)
        return (DecodeCache(prefix, prefix_index, suffix, steps, chunk, d.sliding_window, empty),
                [layer_edit(intervention, i, d.num_heads, self.device)
                 for i in range(len(self.layers))])

    def _decode_step(self, cache: DecodeCache, token: torch.Tensor, t: int,
                     edits: list[AttentionEdit | None],
                     intervention: Intervention | None) -> torch.Tensor:
        """Generated token t of every row [B] through every layer → its last hidden states
        [B, 1, H]."""
        x = self.embed(token)[:, None]
        side = self._side(token[:, None], x)
        slot, valid, own_image = cache.next_slot(t, any(e is not None for e in edits))
        # None while every row's keys all lie within the window
        windowed = cache.window_masks(t, valid)
        positions = (cache.suffix.next_position + t)[:, None]
        ropes = self._per_layer(lambda rotary: rotary.cos_sin(positions, self.dtype))
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(x, *ropes[i])
            source = self.dims.kv_of(i)  # an earlier layer's, written this step already
            own_k, own_v = cache.own_k, cache.own_v
            own_k[i][:, :, slot] = k[:, :, 0] if source == i else own_k[source][:, :, slot]
            own_v[i][:, :, slot] = v[:, :, 0] if source == i else own_v[source][:, :, slot]
            own, seen = (valid, None) if windowed is None or not self.dims.slides(i) else windowed
            attn = [masked_attention(q[a:e], *cache.prefix_kv(i, g), cache.own_k[i][a:e],
                                     cache.own_v[i][a:e], own[a:e], edits[i], cache.prefix_image(g),
                                     None if own_image is None else own_image[a:e],
                                     None if seen is None else seen[a:e])
                    for g, a, e in cache.runs]
            x = layer.finish(x, attn[0] if len(attn) == 1 else torch.cat(attn),
                             mlp=mlp_hook(intervention, i, "decode"), **side(i))
            x = hidden_hook(intervention, i, x, "decode")
        return x

