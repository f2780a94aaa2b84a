"""mPLUG-Owl2's networks (engine/models/mplug_owl2.py is the family): its ViT, its visual abstractor
and its modality-adaptive decoder layer, with their config dims and checkpoint shapes. transformers
has no class for any of them, so every module here is ours, checked against the upstream code's
outputs (tests/families/test_mplug_owl2.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import rms_norm
from ..layers.ops import apply_rotary
from ..layers.decoder import DecoderDims, DecoderLayer
from ..utils.loader import CheckpointError

MULTIWAY = ("input_layernorm", "post_attention_layernorm", "self_attn.k_proj", "self_attn.v_proj")


@dataclass(frozen=True)
class VisionDims:
    """visual_config.visual_model, with upstream's MplugOwlVisionConfig defaults."""

    hidden_size: int = 1024
    intermediate_size: int = 4096
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 448
    patch_size: int = 14
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-6

    @property
    def tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + 1  # patches + CLS

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        d, m = self.hidden_size, self.intermediate_size
        shapes = {"embeddings.cls_token": (1, 1, d),
                  "embeddings.position_embedding": (1, self.tokens, d),
                  "embeddings.patch_embed.weight": (d, self.num_channels, self.patch_size,
                                                    self.patch_size),
                  **_norm_shapes("embeddings.pre_layernorm", d),
                  **_norm_shapes("post_layernorm", d)}
        for i in range(self.num_hidden_layers):
            p = f"encoder.layers.{i}."
            shapes.update({**_linear_shapes(p + "self_attn.query_key_value", d, 3 * d),
                           **_linear_shapes(p + "self_attn.dense", d, d),
                           **_linear_shapes(p + "mlp.fc1", d, m),
                           **_linear_shapes(p + "mlp.fc2", m, d),
                           **_norm_shapes(p + "input_layernorm", d),
                           **_norm_shapes(p + "post_attention_layernorm", d)})
        return shapes


@dataclass(frozen=True)
class AbstractorDims:
    """visual_config.visual_abstractor, with upstream's MplugOwlVisualAbstractorConfig defaults."""

    num_learnable_queries: int = 64
    hidden_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 16
    intermediate_size: int = 2816
    layer_norm_eps: float = 1e-6
    encoder_hidden_size: int = 1024
    grid_size: int = 32

    def expected_shapes(self, lm_hidden: int) -> dict[str, tuple[int, ...]]:
        d, e, m = self.hidden_size, self.encoder_hidden_size, self.intermediate_size
        q = self.num_learnable_queries
        shapes = {"query_embeds": (1, q, d), "vit_eos": (1, 1, lm_hidden),
                  **_linear_shapes("visual_fc", d, lm_hidden)}
        for i in range(self.num_hidden_layers):
            p = f"encoder.layers.{i}.crossattention."
            shapes.update({
                p + "attention.q_pos_embed": (q, d),
                p + "attention.k_pos_embed": (self.grid_size ** 2 + 1, d),
                **_linear_shapes(p + "attention.query", d, d),
                **_linear_shapes(p + "attention.key", e, d),
                **_linear_shapes(p + "attention.value", e, d),
                **_linear_shapes(p + "output.out_proj", e, e),
                **_linear_shapes(p + "output.mlp.w1", d, m),
                **_linear_shapes(p + "output.mlp.w3", d, m),
                **_linear_shapes(p + "output.mlp.w2", m, d),
                **_norm_shapes(p + "output.mlp.ffn_ln", m), **_norm_shapes(p + "output.norm2", e),
                **_norm_shapes(p + "norm1", e), **_norm_shapes(p + "normk", e)})
        return shapes


def _linear_shapes(name: str, fan_in: int, fan_out: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (fan_out, fan_in), f"{name}.bias": (fan_out,)}


def _norm_shapes(name: str, dim: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (dim,), f"{name}.bias": (dim,)}


def config_dims(cls, values: dict | None, where: str):
    """A dims dataclass from a config section (unknown keys ignored, the upstream defaults
    filling gaps)."""
    values = values or {}
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in values.items() if k in known})
    except TypeError as err:
        raise CheckpointError(f"{where}: {err}") from None


def lm_expected_shapes(dims: DecoderDims) -> dict[str, tuple[int, ...]]:
    """The language model's tensors (names as DecoderLayer/DecoderLM see them, after `lm.`):
    LLaMA's, except that each layer's k_proj, v_proj and both norms come as multiway.0 (text) and
    .1 (image)."""
    shapes = {}
    for name, shape in dims.expected_shapes().items():
        if name.startswith("layers.") and any(f".{m}." in name for m in MULTIWAY):
            stem, _, leaf = name.rpartition(".")
            shapes.update({f"{stem}.multiway.{w}.{leaf}": shape for w in (0, 1)})
        else:
            shapes[name] = shape
    return shapes


ACTIVATIONS = {"quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "gelu": F.gelu, "silu": F.silu}


def _layer_norm(x: torch.Tensor, w: dict[str, torch.Tensor], name: str, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], eps)


class VisionTower(nn.Module):
    """The mPLUG-Owl2 ViT: pixels [N, 3, 448, 448] → every token after post_layernorm [N, 1025,
    D]. Attention is computed as upstream writes it (scores scaled by head_dim**-0.5, softmax in
    the model dtype), not by SDPA, so fp16 rounds as it does there."""

    def __init__(self, dims: VisionDims, weights: dict[str, torch.Tensor], linear, dtype, device):
        super().__init__()
        self.dims = dims
        self.act = ACTIVATIONS[dims.hidden_act]
        self.dense = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()
                      if not k.startswith("encoder.") or "layernorm" in k}
        self.layers = []
        for i in range(dims.num_hidden_layers):
            p = f"encoder.layers.{i}."
            self.layers.append({n: linear(weights[f"{p}{n}.weight"], weights[f"{p}{n}.bias"])
                                for n in ("self_attn.query_key_value", "self_attn.dense",
                                          "mlp.fc1", "mlp.fc2")})
        # registered Linears
        self.linears = nn.ModuleList(m for layer in self.layers for m in layer.values())

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        d, w = self.dims, self.dense
        x = F.conv2d(pixels, w["embeddings.patch_embed.weight"], stride=d.patch_size)
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat([w["embeddings.cls_token"].expand(x.shape[0], 1, -1), x], dim=1)
        x = _layer_norm(x + w["embeddings.position_embedding"][:, :x.shape[1]], w,
                        "embeddings.pre_layernorm", d.layer_norm_eps)
        n, s, h = x.shape
        heads = d.num_attention_heads
        for i, layer in enumerate(self.layers):
            p = f"encoder.layers.{i}."
            normed = _layer_norm(x, w, p + "input_layernorm", d.layer_norm_eps)
            qkv = layer["self_attn.query_key_value"](normed)
            # fused per head: q, k, v
            q, k, v = qkv.reshape(n, s, heads, 3, h // heads).permute(3, 0, 2, 1, 4)
            probs = torch.softmax((q @ k.transpose(-1, -2)) * (h // heads) ** -0.5, dim=-1)
            x = layer["self_attn.dense"]((probs @ v).transpose(1, 2).reshape(n, s, h)) + x
            y = _layer_norm(x, w, p + "post_attention_layernorm", d.layer_norm_eps)
            x = x + layer["mlp.fc2"](self.act(layer["mlp.fc1"](y)))
        return _layer_norm(x, w, "post_layernorm", d.layer_norm_eps)


class VisualAbstractor(nn.Module):
    """ViT tokens [N, 1025, D] → image features [N, 65, lm hidden]: the 64 learnable queries
    through cross-attention layers, visual_fc, then vit_eos appended.

    Per layer, the queries are normed (norm1) and the ViT tokens (normk); keys and values are read
    from [normed queries; normed ViT tokens], keys with the stored sin-cos tables added (q_pos_embed
    over the queries, k_pos_embed over the CLS + 32 x 32 grid), queries with q_pos_embed; the
    residual starts from the normed queries; then a SwiGLU MLP with a LayerNorm (ffn_ln) before w2.
    norm1, normk and norm2 use LayerNorm's default eps (1e-5), ffn_ln the config's."""

    def __init__(self, dims: AbstractorDims, weights: dict[str, torch.Tensor], linear, dtype,
                 device):
        super().__init__()
        self.dims = dims
        names = ("attention.query", "attention.key", "attention.value", "output.out_proj",
                 "output.mlp.w1", "output.mlp.w2", "output.mlp.w3")
        self.dense = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()
                      if k.endswith(("_embed", "vit_eos", "query_embeds"))
                      or "norm" in k or "ffn_ln" in k}
        self.layers = []
        for i in range(dims.num_hidden_layers):
            p = f"encoder.layers.{i}.crossattention."
            self.layers.append({n: linear(weights[f"{p}{n}.weight"], weights[f"{p}{n}.bias"])
                                for n in names})
        self.visual_fc = linear(weights["visual_fc.weight"], weights["visual_fc.bias"])
        self.linears = nn.ModuleList([m for layer in self.layers for m in layer.values()]
                                     + [self.visual_fc])

    def forward(self, vit: torch.Tensor) -> torch.Tensor:
        d, w = self.dims, self.dense
        n = vit.shape[0]
        x = w["query_embeds"].expand(n, -1, -1)
        heads, head_dim = d.num_attention_heads, d.hidden_size // d.num_attention_heads
        for i, layer in enumerate(self.layers):
            p = f"encoder.layers.{i}.crossattention."
            q_pos, k_pos = w[p + "attention.q_pos_embed"], w[p + "attention.k_pos_embed"]
            h = _layer_norm(x, w, p + "norm1", 1e-5)
            kv = torch.cat([h, _layer_norm(vit, w, p + "normk", 1e-5)], dim=1)  # [N, 64 + 1025, D]
            q = _heads(layer["attention.query"](h + q_pos), heads, head_dim)
            k = _heads(layer["attention.key"](kv + torch.cat([q_pos, k_pos])), heads, head_dim)
            v = _heads(layer["attention.value"](kv), heads, head_dim)
            probs = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(head_dim), dim=-1)
            attended = (probs @ v).transpose(1, 2).reshape(n, -1, heads * head_dim)
            x = h + layer["output.out_proj"](attended)
            y = _layer_norm(x, w, p + "output.norm2", 1e-5)
            y = F.silu(layer["output.mlp.w1"](y)) * layer["output.mlp.w3"](y)
            x = x + layer["output.mlp.w2"](_layer_norm(y, w, p + "output.mlp.ffn_ln",
                                                       d.layer_norm_eps))
        return torch.cat([self.visual_fc(x), w["vit_eos"].expand(n, 1, -1)], dim=1)


def _heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """[N, S, heads * head_dim] → [N, heads, S, head_dim]."""
    return x.view(*x.shape[:2], heads, head_dim).transpose(1, 2)


class MultiwayDecoderLayer(DecoderLayer):
    """A modality-adaptive LLaMA-2 layer. `image` is a bool mask [B, S] (True at image tokens) or
    None (all text); image positions use multiway.1 of k_proj, v_proj and both norms, text positions
    multiway.0, as upstream's MultiwayNetwork routes them. Each projection runs on its own rows
    only, as upstream gathers them, so no row pays for both copies."""

    def __init__(self, dims: DecoderDims, weights: dict[str, torch.Tensor], linear):
        text, image = {}, {}
        for name, tensor in weights.items():
            stem, way, leaf = name.partition(".multiway.")
            if not way:
                text[name] = tensor
            else:
                index, _, leaf = leaf.partition(".")
                (text if index == "0" else image)[f"{stem}.{leaf}"] = tensor
        super().__init__(dims, text, linear)
        self.input_norm_image = nn.Parameter(image["input_layernorm.weight"], requires_grad=False)
        self.post_norm_image = nn.Parameter(image["post_attention_layernorm.weight"],
                                            requires_grad=False)
        self.k_proj_image, self.v_proj_image = (
            linear(image[f"self_attn.{n}_proj.weight"], image.get(f"self_attn.{n}_proj.bias"))
            for n in "kv")

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, need_q: bool = True,
            image: torch.Tensor | None = None):
        if image is None:
            return super().qkv(x, cos, sin, need_q)
        b, s, _ = x.shape
        d = self.dims
        h = rms_norm(x, _per_position(image, self.input_norm, self.input_norm_image), d.rms_eps)
        k = _multiway(h, image, self.k_proj, self.k_proj_image)
        k = k.view(b, s, d.num_kv_heads, d.head_dim).transpose(1, 2)
        v = _multiway(h, image, self.v_proj, self.v_proj_image)
        v = v.view(b, s, d.num_kv_heads, d.head_dim).transpose(1, 2)
        k = apply_rotary(k, cos, sin)
        if not need_q:
            return None, k, v
        q = self.q_proj(h).view(b, s, d.num_heads, d.head_dim).transpose(1, 2)
        return apply_rotary(q, cos, sin), k, v

    def finish(self, x: torch.Tensor, attn: torch.Tensor, image: torch.Tensor | None = None,
               mlp=None) -> torch.Tensor:
        if image is None:
            return super().finish(x, attn, mlp=mlp)
        b, _, s, _ = attn.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        h = rms_norm(x, _per_position(image, self.post_norm, self.post_norm_image),
                     self.dims.rms_eps)
        out = self.down_proj(F.silu(self.gate_proj(h), inplace=True).mul_(self.up_proj(h)))
        return x + (out if mlp is None else mlp(out))


def _per_position(image: torch.Tensor, text_weight: torch.Tensor,
                  image_weight: torch.Tensor) -> torch.Tensor:

    """The norm weight of each position [B, S, H]: RMSNorm scales elementwise, so choosing the
    weight per position equals running each modality's norm on its own rows."""
    return torch.where(image[..., None], image_weight, text_weight)


def _multiway(h: torch.Tensor, image: torch.Tensor, text_proj, image_proj) -> torch.Tensor:
    """h [B, S, H] → each row through its modality's projection [B, S, out]."""
    out = None
    for rows, proj in ((~image, text_proj), (image, image_proj)):
        if bool(rows.any()):
            y = proj(h[rows])
            out = y.new_empty(*image.shape, y.shape[-1]) if out is None else out
            out[rows] = y
    return out
