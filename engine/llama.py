"""The LLaMA-family language model (LLaMA-2 / Vicuna, Mistral), with POPE's two shortcuts built in.

1. Prefix reuse: every question of an image shares the prompt up to and including the image tokens
   (not so for InstructBLIP, whose image tokens depend on the question: there each prompt runs whole).
   That prefix is prefilled once (`prefill_prefix`) and its KV kept; the question suffixes of the image
   are then prefilled as one right-padded batch against it (`prefill_suffix`), each suffix attending to
   the whole prefix and causally to itself. Right padding needs no extra mask: a valid query never
   sees a later (padded) key under the causal rule, and rows are read only at their own last token.
2. One step: only the answer position matters, so the final norm and the lm_head run on one hidden
   state per question, for the candidate ids only, plus a full-vocabulary argmax at that position
   (`answer`); no [sequence, vocabulary] logits tensor is ever formed.

A greedy continuation (`decode`) exists only for string readouts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import PrefixRuns, gather_logits, prefix_attention, prefix_runs, resolve_backend, vocab_argmax
from .layers import Rotary, apply_rotary, make_linear, rms_norm
from .plan import TokenBatch
from .probe import answer_image_attention


@dataclass(frozen=True)
class LlamaDims:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    sliding_window: int | None = None  # Mistral: keys further back than this are not attended
    qkv_bias: bool = False  # LLaMA configs with attention_bias; Qwen2 always (its family sets it)
    mrope_section: tuple[int, ...] | None = None  # Qwen2-VL's M-RoPE: frequencies per position stream
    max_positions: int = 4096  # max_position_embeddings: how long a prompt and its continuation may be

    @classmethod
    def from_config(cls, cfg) -> "LlamaDims":
        """From a transformers text config (LlamaConfig, MistralConfig, Qwen2-VL's), whose defaults fill the gaps
        that llava-hf's abbreviated `text_config` leaves."""
        rope = getattr(cfg, "rope_parameters", None) or {}
        if not isinstance(rope, dict):
            rope = {}
        rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
        legacy = getattr(cfg, "rope_scaling", None)
        if rope_type != "default" or (isinstance(legacy, dict) and legacy.get("rope_type", legacy.get("type"))
                                      not in (None, "default")):
            raise NotImplementedError(f"rope type {rope_type or legacy} is not supported (default RoPE only)")
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        heads = cfg.num_attention_heads
        return cls(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                   num_layers=cfg.num_hidden_layers, num_heads=heads,
                   num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                   rms_eps=cfg.rms_norm_eps, rope_theta=float(theta or getattr(cfg, "rope_theta", 10000.0)),
                   sliding_window=getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True)
                   else None,
                   qkv_bias=bool(getattr(cfg, "attention_bias", False)),
                   mrope_section=tuple(section) if (section := rope.get("mrope_section")) else None,
                   max_positions=getattr(cfg, "max_position_embeddings", None) or 4096)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        h, d = self.hidden_size, self.head_dim
        shapes = {"embed_tokens.weight": (self.vocab_size, h), "norm.weight": (h,),
                  "lm_head.weight": (self.vocab_size, h)}
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (self.num_heads * d, h),
                p + "self_attn.k_proj.weight": (self.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (self.num_kv_heads * d, h),
                p + "self_attn.o_proj.weight": (h, self.num_heads * d),
                p + "mlp.gate_proj.weight": (self.intermediate_size, h),
                p + "mlp.up_proj.weight": (self.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, self.intermediate_size),
            })
            if self.qkv_bias:
                shapes.update({p + "self_attn.q_proj.bias": (self.num_heads * d,),
                               p + "self_attn.k_proj.bias": (self.num_kv_heads * d,),
                               p + "self_attn.v_proj.bias": (self.num_kv_heads * d,)})
        return shapes


@dataclass
class PrefixKV:
    """The caches of G image prefixes of one length P: per layer K and V [G, Hkv, P, D], RoPE
    applied, and where each prefix's image tokens are (spans, and a [G, P] mask; None without any)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int
    image_spans: list[tuple[tuple[int, int], ...]]
    image_mask: torch.Tensor | None


@dataclass
class SuffixKV:
    """The question suffixes' own cache, per layer [B, Hkv, S, D], valid up to `lengths`."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor
    next_position: torch.Tensor  # [B]: the position of each row's first generated token
    image_mask: torch.Tensor | None = None  # [B, S]: own keys that hold image tokens (whole prompts)


@dataclass(frozen=True)
class AttentionEdit:
    """An edit of the image keys' attention logits s in one layer: s becomes scale * s + magnitude * |s|
    + bias (each a number, or one per query head [Hq]). Seen from every query after the image
    (question, answer and generated positions), or with answer_only from the answer position only
    (the last prompt token, and each generated token in turn): PAI's own edit is s + alpha * |s| there.
    An edit with a magnitude term must be answer_only: the fused prefix kernel applies affine edits."""

    scale: float | torch.Tensor = 1.0
    bias: float | torch.Tensor = 0.0
    magnitude: float | torch.Tensor = 0.0
    answer_only: bool = False


@dataclass
class HeadEdit:
    """An AttentionEdit as fp32 [Hq] tensors on the model's device (LlamaLM._edit)."""

    scale: torch.Tensor
    bias: torch.Tensor
    magnitude: torch.Tensor
    answer_only: bool

    def apply(self, scores: torch.Tensor, heads: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """scores with every entry edited; `heads` shapes an [Hq] tensor to broadcast against them."""
        edited = scores * heads(self.scale) + heads(self.bias)
        if self.has_magnitude:
            edited = edited + heads(self.magnitude) * scores.abs()
        return edited

    @property
    def has_magnitude(self) -> bool:
        return bool((self.magnitude != 0).any())


class Intervention:
    """The one place an experiment adjusts the forward pass (subclass and override either method).

    `hidden` sees each decoder layer's output: part "prefix" is the image prefixes [G, P, H] of the
    images run together (computed once per image; layers 0 .. L-2, since the last layer's prefix
    output feeds nothing), part "suffix" a batch of question suffixes [B, S, H] (right-padded; rows
    grouped by image, and a batch may span images; for InstructBLIP, whose image tokens depend on the
    question, whole prompts and no "prefix" part), part "decode" one generated token per row [B, 1, H]
    (string readouts only); return a tensor of the same shape to replace it, or None to leave it.
    `image_attention` edits the attention logits of the image keys per layer and head (see there).
    `logits` sees the candidate logits [B, n] (fp32, columns in `ids` order) before the logit readouts
    decide; return the adjusted tensor or None. The first token and any
    continuation come from the model's own logits (hidden-state changes reach them, logit
    adjustments do not), so first_token and the text readouts ignore `logits`. Engine.score runs one
    image at a time, so there G = 1 and every suffix row is that image's.
    """

    def hidden(self, layer: int, hidden: torch.Tensor, part: str) -> torch.Tensor | None:
        return None

    def logits(self, logits: torch.Tensor, ids: list[int]) -> torch.Tensor | None:
        return None

    def image_attention(self, layer: int) -> AttentionEdit | tuple | None:
        """An AttentionEdit, or (scale, bias), each a number or one per query head [Hq]: in this layer
        the attention logit s (q.k / sqrt(d)) of every image key becomes scale * s + bias, as seen from
        the question and answer positions (every query after the image, generated tokens included);
        the image's own positions attend as before. bias log(alpha) multiplies the image's attention
        weights by alpha before the softmax renormalizes, scale 1/T is a temperature on them
        (AdaptVis), bias -inf masks them. None (the default) leaves the layer alone."""
        return None


class DecoderLayer(nn.Module):
    def __init__(self, dims: LlamaDims, weights: dict[str, torch.Tensor], linear):
        super().__init__()
        self.dims = dims
        self.input_norm = nn.Parameter(weights["input_layernorm.weight"], requires_grad=False)
        self.post_norm = nn.Parameter(weights["post_attention_layernorm.weight"], requires_grad=False)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            linear(weights[f"self_attn.{n}_proj.weight"], weights.get(f"self_attn.{n}_proj.bias")) for n in "qkvo")
        self.gate_proj, self.up_proj, self.down_proj = (
            linear(weights[f"mlp.{n}_proj.weight"]) for n in ("gate", "up", "down"))

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, need_q: bool = True,
            image: torch.Tensor | None = None):
        """x [B, S, H] → q [B, Hq, S, D] (None without need_q), k, v [B, Hkv, S, D] with RoPE applied
        to q and k. image [B, S] marks image positions, for layers that treat them apart (mPLUG-Owl2's);
        a plain LLaMA layer does not."""
        b, s, _ = x.shape
        d = self.dims
        h = rms_norm(x, self.input_norm, d.rms_eps)
        k = self.k_proj(h).view(b, s, d.num_kv_heads, d.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, d.num_kv_heads, d.head_dim).transpose(1, 2)
        if not need_q:
            return None, apply_rotary(k, cos, sin), v
        q = self.q_proj(h).view(b, s, d.num_heads, d.head_dim).transpose(1, 2)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
        """Residual + o_proj, then the MLP block. attn [B, Hq, S, D]."""
        b, _, s, _ = attn.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        h = rms_norm(x, self.post_norm, self.dims.rms_eps)
        return x + self.down_proj(F.silu(self.gate_proj(h), inplace=True).mul_(self.up_proj(h)))


def masked_attention(q, k_prefix, v_prefix, k_own, v_own, valid, edit=None):
    """Attention over each row's prefix plus its own keys, in fp32 (the decode step).

    q [B, Hq, T, D]; k/v_prefix [Hkv, P, D], shared by the rows and broadcast, never copied per row
    (P may be 0); k/v_own [B, Hkv, K, D]; valid [B, T, K] marks which own keys each query may see: the
    new token sits after each row's padded suffix. edit (prefix image keys [P], own image keys [B, K],
    HeadEdit): its edit of those keys' logits (Intervention.image_attention).
    """
    b, hq, t, d = q.shape
    k_prefix, v_prefix = k_prefix[None], v_prefix[None]
    hkv = k_own.shape[1]
    g = hq // hkv
    qf = q.float().reshape(b, hkv, g * t, d) / math.sqrt(d)
    scores_p = qf @ k_prefix.float().transpose(-1, -2)  # [B, Hkv, gT, P]
    scores_o = qf @ k_own.float().transpose(-1, -2)  # [B, Hkv, gT, K]
    if edit is not None:
        prefix_image, own_image, head = edit

        def heads(x):  # [Hq] → [1, Hkv, g * T, 1], as the queries are laid out
            return x.view(hkv, g, 1).expand(hkv, g, t).reshape(1, hkv, g * t, 1)

        scores_p = torch.where(prefix_image[None, None, None], head.apply(scores_p, heads), scores_p)
        scores_o = torch.where(own_image[:, None, None], head.apply(scores_o, heads), scores_o)
    mask = valid[:, None, None].expand(b, 1, g, t, valid.shape[-1]).reshape(b, 1, g * t, -1)
    scores_o = scores_o.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(torch.cat([scores_p, scores_o], dim=-1), dim=-1)
    p = k_prefix.shape[2]
    out = probs[..., :p] @ v_prefix.float() + probs[..., p:] @ v_own.float()
    return out.reshape(b, hq, t, d).to(q.dtype)


class LlamaLM(nn.Module):
    def __init__(self, dims: LlamaDims, weights: dict[str, torch.Tensor], *, dtype: torch.dtype,
                 device: torch.device, quantize: bool, keep_packed: bool, quantize_lm_head: bool, kernels: str,
                 layer_class: type[DecoderLayer] = DecoderLayer):
        super().__init__()
        self.dims, self.dtype, self.device, self.kernels = dims, dtype, device, kernels

        def linear(w, b=None, quant=quantize):
            return make_linear(w, b, dtype=dtype, device=device, quantize=quant, keep_packed=keep_packed,
                               kernels=kernels)

        def dense(name):
            return nn.Parameter(weights.pop(name).to(device=device, dtype=dtype), requires_grad=False)

        self.embed_tokens = dense("embed_tokens.weight")
        self.norm = dense("norm.weight")
        self.lm_head = linear(weights.pop("lm_head.weight"), quant=quantize and quantize_lm_head)
        layers = []
        for i in range(dims.num_layers):
            prefix = f"layers.{i}."
            own = {k[len(prefix):]: weights.pop(k) for k in [k for k in weights if k.startswith(prefix)]}
            norms = {k: v.to(device=device, dtype=dtype) for k, v in own.items() if "layernorm" in k}
            layers.append(layer_class(dims, {**own, **norms}, linear))
        self.layers = nn.ModuleList(layers)
        self.rotary = Rotary(dims.head_dim, dims.rope_theta, device, dims.mrope_section)

    def embed(self, ids: torch.Tensor, image_mask: torch.Tensor | None = None,
              features: torch.Tensor | None = None) -> torch.Tensor:
        """ids [...] → input embeddings [..., H]; where image_mask is True the rows of features
        [N, H] (one per image slot, in order) stand instead."""
        x = F.embedding(ids, self.embed_tokens)
        if image_mask is None:
            return x
        if int(image_mask.sum()) != features.shape[0]:
            raise ValueError(f"{int(image_mask.sum())} image tokens in the prompt but {features.shape[0]} "
                             "image features")
        x[image_mask] = features.to(x.dtype)
        return x

    def rotary_of(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [S, D] (positions shared by every row) or [B, S, D]."""
        if batch.positions.dim() == 3:
            return self.rotary.cos_sin_3d(batch.positions, self.dtype)
        return self.rotary.cos_sin(batch.positions, self.dtype)

    @torch.inference_mode()
    def prefill_prefix(self, batch: TokenBatch, intervention: Intervention | None = None) -> PrefixKV:
        """G image prefixes of one length P → their KV for every layer. The last layer's queries,
        attention output and MLP are never needed (no prefix position is read out), so the pass stops
        at its K and V; prefix hooks therefore see layers 0 .. L-2."""
        x = self.embed(batch.ids, batch.image_mask, batch.features)
        cos, sin = self.rotary_of(batch)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            q, k, v = layer.qkv(x, cos, sin, need_q=not last, image=batch.image_mask)
            keys.append(k)
            values.append(v)
            if last:
                break
            x = layer.finish(x, causal_attention(q, k, v), image=batch.image_mask)
            x = _hook(intervention, i, x, "prefix")
        return PrefixKV(keys, values, batch.ids.shape[1], batch.image_spans, batch.image_mask)

    @torch.inference_mode()
    def prefill_suffix(self, prefix: PrefixKV | None, prefix_index: list[int] | None, batch: TokenBatch,
                       intervention: Intervention | None = None, probe: bool = False
                       ) -> tuple[torch.Tensor, SuffixKV, torch.Tensor | None]:
        """Right-padded question suffixes, row b continuing prefix slot prefix_index[b] (rows grouped
        by slot) → the hidden state of each row's last token [B, H] (before the final norm), the
        suffixes' own KV, and with probe the attention mass on image tokens at that token [B, L, Hq]
        (fp32; see engine.probe). With prefix None every row is a whole prompt (InstructBLIP's, or the
        no-reuse reference path)."""
        x = self.embed(batch.ids, batch.image_mask, batch.features)
        b = x.shape[0]
        cos, sin = self.rotary_of(batch)
        backend = resolve_backend(self.kernels, self.device)
        grouped = PrefixRuns(prefix_index, self.device) if prefix is not None else None  # once, for every layer
        keys, values, probes = [], [], []
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(x, cos, sin, image=batch.image_mask)
            keys.append(k)
            values.append(v)
            edit = self._edit(intervention, i)
            if probe:
                probes.append(self._image_attention(q, k, batch, prefix, grouped, i, edit))
            every = edit if edit is not None and not edit.answer_only else None  # else the answer row alone
            if prefix is not None:  # one call for every image's rows: each run reads its prefix once
                key_edit = None if every is None or prefix.image_mask is None else \
                    (prefix.image_mask, every.scale, every.bias)
                attn = prefix_attention(q, prefix.keys[i], prefix.values[i], k, v, batch.lengths, backend=backend,
                                        prefix_index=grouped, key_edit=key_edit)
            elif every is not None and batch.image_mask is not None:
                attn = edited_causal_attention(q, k, v, batch.image_mask, every)
            else:
                attn = causal_attention(q, k, v)
            if edit is not None and edit.answer_only:
                attn = self._answer_row(attn, q, k, v, batch, prefix, grouped, i, edit)
            x = layer.finish(x, attn, image=batch.image_mask)
            x = _hook(intervention, i, x, "suffix")
        last = x[torch.arange(b, device=self.device), batch.lengths - 1]
        return last, SuffixKV(keys, values, batch.lengths, batch.next_position, batch.image_mask), \
            torch.stack(probes, dim=1) if probe else None

    def _edit(self, intervention: Intervention | None, layer: int) -> HeadEdit | None:
        """The intervention's edit of this layer's image-key logits, as fp32 [Hq] tensors."""
        edit = None if intervention is None else intervention.image_attention(layer)
        if edit is None:
            return None
        if not isinstance(edit, AttentionEdit):
            edit = AttentionEdit(*edit)
        heads = self.dims.num_heads
        scale, bias, magnitude = (torch.as_tensor(t, dtype=torch.float32, device=self.device).expand(heads).contiguous()
                                  for t in (edit.scale, edit.bias, edit.magnitude))
        head = HeadEdit(scale, bias, magnitude, edit.answer_only)
        if bool((scale == 1).all()) and bool((bias == 0).all()) and not head.has_magnitude:
            return None  # the identity: the unedited path, bit for bit
        if head.has_magnitude and not edit.answer_only:
            raise ValueError(f"layer {layer}: an attention edit with a magnitude term (s + m|s|) must be answer_only; "
                             "the fused prefix attention applies affine edits to every query")
        return head

    def _answer_row(self, attn, q, k, v, batch: TokenBatch, prefix: PrefixKV | None, grouped: PrefixRuns | None,
                    layer: int, edit: HeadEdit) -> torch.Tensor:
        """attn [B, Hq, S, D] with each row's answer position (its last token) recomputed under an
        answer-only edit: one query per row against its prefix and own keys, as a decode step is."""
        b, s = batch.ids.shape
        rows = torch.arange(b, device=self.device)
        last = batch.lengths - 1
        valid = (torch.arange(s, device=self.device)[None] < batch.lengths[:, None])[:, None]  # [B, 1, S]
        own_image = batch.image_mask if batch.image_mask is not None else \
            torch.zeros(b, s, dtype=torch.bool, device=self.device)
        query = q[rows, :, last][:, :, None]  # [B, Hq, 1, D]
        empty = k.new_zeros(k.shape[1], 0, k.shape[3])
        runs = grouped.runs if prefix is not None else [(None, 0, b)]
        out = []
        for g, a, e in runs:
            kp, vp = (prefix.keys[layer][g], prefix.values[layer][g]) if g is not None else (empty, empty)
            image = prefix.image_mask[g] if g is not None and prefix.image_mask is not None else \
                torch.zeros(kp.shape[1], dtype=torch.bool, device=self.device)
            out.append(masked_attention(query[a:e], kp, vp, k[a:e], v[a:e], valid[a:e], (image, own_image[a:e], edit)))
        attn = attn.clone()
        attn[rows, :, last] = torch.cat(out)[:, :, 0]
        return attn

    def _image_attention(self, q, k, batch: TokenBatch, prefix: PrefixKV | None, grouped: PrefixRuns | None,
                         layer: int, edit: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        if prefix is None:
            return answer_image_attention(q, batch.lengths, k, batch.image_mask, edit=edit)
        image = prefix.image_mask if prefix.image_mask is not None else \
            torch.zeros(prefix.keys[layer].shape[0], prefix.length, dtype=torch.bool, device=self.device)
        return answer_image_attention(q, batch.lengths, k, batch.image_mask, prefix.keys[layer], image, grouped.runs,
                                      edit=edit)

    @torch.inference_mode()
    def answer(self, last_hidden: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """last_hidden [B, H] → candidate logits [B, n] (fp32) and the full-vocabulary argmax [B].

        Both are taken from logits rounded to the model dtype, as transformers' lm_head output is, so
        near-ties (ties, once rounded to fp16/bf16) resolve as in the reference pipeline.
        """
        backend = resolve_backend(self.kernels, self.device)
        index = torch.tensor(ids, dtype=torch.long, device=self.device)
        norm = dict(norm_weight=self.norm, eps=self.dims.rms_eps, backend=backend)  # the final norm, fused
        logits = gather_logits(last_hidden, self.lm_head.matrix, index, **norm).to(self.dtype).float()
        return logits, vocab_argmax(last_hidden, self.lm_head.matrix, **norm, logits_dtype=self.dtype)

    @torch.inference_mode()
    def vocab_logits(self, last_hidden: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        """last_hidden [B, H] → the logits of the whole vocabulary [B, V] (fp32, rounded to the model
        dtype as `answer`'s are), for methods that combine passes over every token. One answer
        position per row: [B, V], never [B, S, V]; the lm_head rows go `chunk` at a time."""
        backend = resolve_backend(self.kernels, self.device)
        norm = dict(norm_weight=self.norm, eps=self.dims.rms_eps, backend=backend)
        vocab = self.lm_head.matrix.shape[0]
        out = torch.empty(last_hidden.shape[0], vocab, dtype=torch.float32, device=self.device)
        for start in range(0, vocab, chunk):
            ids = torch.arange(start, min(start + chunk, vocab), device=self.device)
            out[:, start:start + len(ids)] = gather_logits(last_hidden, self.lm_head.matrix, ids, **norm)
        return out.to(self.dtype).float()

    @torch.inference_mode()
    def decode(self, prefix: PrefixKV | None, prefix_index: list[int] | None, suffix: SuffixKV,
               first: torch.Tensor, steps: int, stop_ids: set[int], intervention: Intervention | None = None,
               finished: Callable[[list[list[int]]], bool] | None = None, chunk: int = 64) -> torch.Tensor:
        """Greedy tokens after each row's prompt: [B, <= steps], starting with `first` [B] (the argmax at
        the answer position). Rows that emitted a stop id keep going but are cut by the caller, as
        transformers' generate pads them; the loop ends early once every row has stopped, or once
        `finished` says the tokens so far are all any reader needs. The rows' own KV grows `chunk`
        slots at a time, so a long allowance costs only what is generated."""
        b = first.shape[0]
        d = self.dims
        s = suffix.keys[0].shape[2]
        empty = torch.zeros(d.num_kv_heads, 0, d.head_dim, device=self.device, dtype=self.dtype)
        runs = prefix_runs(prefix_index) if prefix is not None else [(None, 0, b)]

        def grow(x):  # [B, Hkv, slots, D]: the suffix slots, then slots for generated tokens
            return torch.cat([x, x.new_zeros(b, d.num_kv_heads, min(chunk, steps), d.head_dim)], dim=2)

        own_k, own_v = [grow(k) for k in suffix.keys], [grow(v) for v in suffix.values]

        def prefix_image(g):  # [P] image keys of prefix g (none for whole prompts)
            if g is None or prefix.image_mask is None:
                return torch.zeros(0 if g is None else prefix.length, dtype=torch.bool, device=self.device)
            return prefix.image_mask[g]

        edits = [self._edit(intervention, i) for i in range(len(self.layers))]  # once, not per step
        tokens = [first]
        stops = torch.tensor(sorted(stop_ids), device=self.device, dtype=first.dtype)
        backend = resolve_backend(self.kernels, self.device)
        done = torch.isin(first, stops)
        for t in range(steps - 1):
            if bool(done.all()) or (finished is not None and finished(torch.stack(tokens, dim=1).tolist())):
                break
            x = self.embed(tokens[-1])[:, None]
            # The new token's slot: after the padded suffix region, so rows of any length line up.
            slot = s + t
            if slot >= own_k[0].shape[2]:
                own_k, own_v = [grow(k) for k in own_k], [grow(v) for v in own_v]
            slots = torch.arange(own_k[0].shape[2], device=self.device)
            if any(e is not None for e in edits):  # the own keys an edit reaches (whole prompts hold the image)
                own_image = torch.zeros(b, own_k[0].shape[2], dtype=torch.bool, device=self.device)
                if suffix.image_mask is not None:
                    own_image[:, :s] = suffix.image_mask
            positions = suffix.next_position + t  # [B]
            cos, sin = self.rotary.cos_sin(positions[:, None], self.dtype)
            valid = ((slots[None] < suffix.lengths[:, None]) | ((slots[None] >= s) & (slots[None] <= slot)))[:, None]
            for i, layer in enumerate(self.layers):
                q, k, v = layer.qkv(x, cos, sin)
                own_k[i][:, :, slot] = k[:, :, 0]
                own_v[i][:, :, slot] = v[:, :, 0]
                edit = edits[i]
                attn = [masked_attention(q[a:e], prefix.keys[i][g] if g is not None else empty,
                                         prefix.values[i][g] if g is not None else empty,
                                         own_k[i][a:e], own_v[i][a:e], valid[a:e],
                                         None if edit is None else (prefix_image(g), own_image[a:e], edit))
                        for g, a, e in runs]
                x = layer.finish(x, attn[0] if len(attn) == 1 else torch.cat(attn))
                x = _hook(intervention, i, x, "decode")
            nxt = vocab_argmax(x[:, 0], self.lm_head.matrix, self.norm, d.rms_eps, backend=backend,
                               logits_dtype=self.dtype)
            tokens.append(nxt)
            done |= torch.isin(nxt, stops)
        return torch.stack(tokens, dim=1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, S, D], k and v [B, Hkv, S, D] → causal SDPA in the model dtype, as transformers' sdpa
    attention runs it; grouped heads are read in place, not repeated into copies."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def edited_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, image: torch.Tensor,
                            edit: HeadEdit) -> torch.Tensor:
    """Causal attention of whole prompts with the image keys' logits edited (per query head) as seen
    from every query after the row's last image token; explicit, in fp32 (the softmax's dtype in
    transformers' eager attention). q [B, Hq, S, D], k/v [B, Hkv, S, D], image [B, S]."""
    b, hq, length, d = q.shape
    group = hq // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.float() @ kf.transpose(-1, -2) / math.sqrt(d)  # [B, Hq, S, S]
    columns = torch.arange(length, device=q.device)
    last_image = torch.where(image, columns, -1).amax(dim=1)  # [B]
    after = (columns[None] > last_image[:, None])[:, None, :, None]  # queries after the image
    edited = edit.apply(scores, lambda x: x.view(1, hq, 1, 1))
    scores = torch.where(after & image[:, None, None, :], edited, scores)
    causal = columns[None, :] <= columns[:, None]
    scores = scores.masked_fill(~causal, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).to(q.dtype)


def _hook(intervention: Intervention | None, layer: int, x: torch.Tensor, part: str) -> torch.Tensor:
    if intervention is None:
        return x
    out = intervention.hidden(layer, x, part)
    if out is None:
        return x
    if out.shape != x.shape:
        raise ValueError(f"Intervention.hidden returned shape {tuple(out.shape)} for layer {layer} {part}, "
                         f"expected {tuple(x.shape)}")
    return out
