"""Gemma 4 (transformers `model_type: gemma4`, Gemma4ForConditionalGeneration; gemma-4-E4B-it), image and text.

The vision side is transformers' own modules: Gemma4VisionModel (patches of an aspect-preserving resize within
max_soft_tokens x pooling_kernel_size² patches, 2-D positions, pooled k x k, its padding stripped) and
Gemma4MultimodalEmbedder (an unscaled RMSNorm and a projection); the cache keeps the projected [n, hidden]
features per image, n the image's own soft-token count. The prompt's `<|image|>` becomes `<|image>` + n x
`<|image|>` + `<image|>` (Gemma4Processor.replace_image_token). The audio tower and its embedder, where a
checkpoint has them (the E2B/E4B), are not loaded: image-text prompts never reach them (Gemma4Model.forward
runs the audio tower only for input_features), and video is not run.

The language model, against transformers models/gemma4/modeling_gemma4.py, differs from Gemma 3's:
- RMSNorm scales by w (not 1 + w) in fp32 and casts once (Gemma4RMSNorm); v is RMS-normed without a weight;
  attention is unscaled (scaling 1.0), folded here into q's norm as sqrt(head_dim) so every attention path
  applies it with its own head_dim**-0.5;
- full-attention layers have their own head_dim (global_head_dim) and, with attention_k_eq_v, their own KV heads
  whose V is the K projection (v_proj absent); their RoPE is "proportional" (the first partial_rotary_factor of
  the frequencies rotate, the rest are zero: cos 1, sin 0), the sliding layers' default RoPE;
- the last num_kv_shared_layers layers compute no K/V: each attends with the K/V of the last earlier layer of
  its kind (config.kv_sharing_modes; DecoderDims.kv_source), and with use_double_wide_mlp their MLP is twice
  as wide;
- per-layer input embeddings (hidden_size_per_layer_input > 0): per token and layer a P-vector, (RMSNorm of the
  input embedding's projection / sqrt(hidden) + the token's own scaled embedding) / sqrt(2), the image slots'
  own embedding the pad token's (Gemma4Model.forward); each layer ends with gelu(gate(x)) * that, projected,
  normed and added (Gemma4TextDecoderLayer), then everything times layer_scalar;
- the sliding window on prompts (AND(q - k < window, OR(causal, image run)) on the sliding layers), and with
  use_bidirectional_attention "vision" an image's tokens see each other both ways on the sliding layers only,
  the full ones causal (create_masks_for_vision_model);
- logits read through final_logit_softcapping (cap * tanh(logits / cap)).
- the 26B-A4B's mixture of experts (enable_moe_block) beside each layer's dense MLP: the router reads the layer's
  input, the experts their own normed copy of it, and the two outputs are normed apart and added before the
  post-feedforward norm (Gemma4TextDecoderLayer; engine/layers/moe.py ScaledRouterExperts).
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from ..layers.moe import ScaledRouterExperts
from ..layers.ops import Rotary, apply_rotary
from ..layers.decoder import DecoderDims, DecoderLayer
from ..utils.loader import CheckpointError, load_module, no_init, rename, tensor_files
from ..inputs.plan import PromptLayout
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import Family

BOI, EOI, IMAGE = "<|image>", "<image|>", "<|image|>"
NAME_RULES = [
    (r"^lm_head\.", "lm.lm_head."),
    (r"^(?:model\.)?language_model\.(?:model\.)?", "lm."),
    (r"^(?:model\.)?vision_tower\.", "vision."),
    (r"^(?:model\.)?embed_vision\.", "embedder."),
]
# the experts' norms: of the dense MLP's output, of the experts' input, of their output
MOE_NORMS = ("post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2")
IGNORED = (r"^(?:model\.)?(?:audio_tower|embed_audio)\.",)  # the audio side: image-text prompts never run it
SIDE_TENSORS = ("embed_tokens_per_layer.weight", "per_layer_model_projection.weight",
                "per_layer_projection_norm.weight")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, scale: float = 1.0) -> torch.Tensor:
    """Gemma4RMSNorm: normalise in fp32, scale by w (none: with_scale False) and `scale` in fp32, cast once."""
    y = x.float()
    y = y * torch.pow(y.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    y = y if weight is None else y * weight.float()
    return (y if scale == 1.0 else y * scale).to(x.dtype)


class Gemma4DecoderLayer(DecoderLayer):
    """Gemma4TextDecoderLayer (see the module docstring)."""

    def __init__(self, dims: DecoderDims, weights: dict[str, torch.Tensor], linear, *, index: int, head_dim: int,
                 kv_heads: int, device: torch.device, dtype: torch.dtype):
        nn.Module.__init__(self)
        self.dims, self.head_dim, self.kv_heads = dims, head_dim, kv_heads
        self.shared = dims.kv_of(index) != index

        def param(name):  # the tensors no Linear holds, never quantized
            return nn.Parameter(weights[name].to(device, dtype), requires_grad=False)

        self.input_norm, self.post_norm, self.pre_ff_norm, self.post_ff_norm = (
            param(f"{n}_layernorm.weight") for n in ("input", "post_attention", "pre_feedforward", "post_feedforward"))
        self.q_norm = param("self_attn.q_norm.weight")
        self.q_proj, self.o_proj = (linear(weights[f"self_attn.{n}_proj.weight"]) for n in "qo")
        if not self.shared:
            self.k_norm = param("self_attn.k_norm.weight")
            self.k_proj = linear(weights["self_attn.k_proj.weight"])
            self.v_proj = linear(weights["self_attn.v_proj.weight"]) if "self_attn.v_proj.weight" in weights else None
        self.gate_proj, self.up_proj, self.down_proj = (linear(weights[f"mlp.{n}_proj.weight"])
                                                         for n in ("gate", "up", "down"))
        self.side = "per_layer_input_gate.weight" in weights
        if self.side:
            self.side_gate, self.side_proj = (linear(weights[f"per_layer_{n}.weight"]) for n in ("input_gate",
                                                                                                 "projection"))
            self.side_norm = param("post_per_layer_input_norm.weight")
        self.register_buffer("layer_scalar", weights["layer_scalar"].to(device, dtype))
        self.moe = None
        if "router.proj.weight" in weights:  # the 26B-A4B's experts beside the dense MLP
            self.moe_norms = nn.ParameterList(param(f"{n}.weight") for n in MOE_NORMS)
            self.moe = ScaledRouterExperts({k: v.to(device, dtype) if not k.startswith("router.proj") else v
                                            for k, v in weights.items() if k.startswith(("router.", "experts."))},
                                           linear, dims.experts_per_token, lambda x, w: rms_norm(x, w, dims.rms_eps))

    def qkv(self, x, cos, sin, need_q: bool = True, image=None):
        """A KV-shared layer computes q only (k, v None: the decoder takes its source layer's)."""
        b, s, _ = x.shape
        eps, d = self.dims.rms_eps, self.head_dim
        h = rms_norm(x, self.input_norm, eps)
        k = v = None
        if not self.shared:
            raw = self.k_proj(h).view(b, s, self.kv_heads, d)
            k = apply_rotary(rms_norm(raw, self.k_norm, eps).transpose(1, 2), cos, sin)
            v = rms_norm(raw if self.v_proj is None else self.v_proj(h).view(b, s, self.kv_heads, d), None, eps)
            v = v.transpose(1, 2)
        if not need_q:
            return None, k, v
        q = rms_norm(self.q_proj(h).view(b, s, -1, d), self.q_norm, eps, math.sqrt(d))  # scaling 1.0, folded in
        return apply_rotary(q.transpose(1, 2), cos, sin), k, v

    def finish(self, x, attn, image=None, mlp=None, side=None):
        b, _, s, _ = attn.shape
        eps = self.dims.rms_eps
        x = x + rms_norm(self.o_proj(attn.transpose(1, 2).reshape(b, s, -1)), self.post_norm, eps)
        h = rms_norm(x, self.pre_ff_norm, eps)
        h = self.down_proj(F.gelu(self.gate_proj(h), approximate="tanh") * self.up_proj(h))
        if self.moe is not None:  # the experts read the residual before the dense MLP's norm
            after, before, out = self.moe_norms
            flat = x.reshape(-1, x.shape[-1])
            experts = self.moe(flat, rms_norm(flat, before, eps)).view(x.shape)
            h = rms_norm(h, after, eps) + rms_norm(experts, out, eps)
        x = x + rms_norm(h if mlp is None else mlp(h), self.post_ff_norm, eps)
        if side is not None:
            g = F.gelu(self.side_gate(x), approximate="tanh") * side
            x = x + rms_norm(self.side_proj(g), self.side_norm, eps)
        return x * self.layer_scalar


class PerLayerInputs(nn.Module):
    """Gemma4TextModel.get_per_layer_inputs + project_per_layer_inputs: (ids, input embeddings [..., H]) →
    [..., L, P], the image slots' token part the pad token's."""

    def __init__(self, weights: dict[str, torch.Tensor], cfg, linear, image_id: int, device, dtype):
        super().__init__()
        self.layers, self.width, self.hidden = cfg.num_hidden_layers, cfg.hidden_size_per_layer_input, cfg.hidden_size
        self.eps, self.pad, self.image_id = cfg.rms_norm_eps, cfg.pad_token_id, image_id
        self.embed = nn.Parameter(weights["embed_tokens_per_layer.weight"].to(device, dtype), requires_grad=False)
        self.norm = nn.Parameter(weights["per_layer_projection_norm.weight"].to(device, dtype), requires_grad=False)
        self.proj = linear(weights["per_layer_model_projection.weight"])
        self.scale = torch.tensor(self.width**0.5).to(dtype)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ids = torch.where(ids == self.image_id, self.pad, ids)
        own = (F.embedding(ids, self.embed) * self.scale.to(x.device)).view(*ids.shape, self.layers, self.width)
        mixed = (self.proj(x) * self.hidden**-0.5).view(*x.shape[:-1], self.layers, self.width)
        return (rms_norm(mixed, self.norm, self.eps) + own) * 2.0**-0.5


def text_dims(cfg, where: Path) -> tuple[DecoderDims, list[tuple[int, int]]]:
    """DecoderDims of a Gemma4TextConfig and each layer's (head_dim, KV heads); a one-line CheckpointError for
    what the engine does not implement."""
    moe = bool(getattr(cfg, "enable_moe_block", False))
    if moe and not 0 < cfg.top_k_experts <= cfg.num_experts:
        raise CheckpointError(f"{where}/config.json: {cfg.top_k_experts} experts per token of {cfg.num_experts}: "
                              "no such routing")
    if cfg.use_bidirectional_attention not in (None, "vision"):
        raise CheckpointError(f"{where}/config.json: use_bidirectional_attention "
                              f"{cfg.use_bidirectional_attention!r} (an encoder) is not supported")
    if cfg.hidden_activation != "gelu_pytorch_tanh":
        raise CheckpointError(f"{where}/config.json: hidden_activation {cfg.hidden_activation!r} is not supported "
                              "(gelu_pytorch_tanh only)")
    kinds = list(cfg.layer_types)
    for kind in set(kinds):
        rope_type = cfg.rope_parameters[kind].get("rope_type", "default")
        if rope_type not in ("default", "proportional"):
            raise CheckpointError(f"{where}/config.json: {kind} rope_type {rope_type!r} is not supported "
                                  "(default and proportional only)")
    modes = cfg.kv_sharing_modes
    first = cfg.num_hidden_layers - cfg.num_kv_shared_layers
    if first <= 0:
        raise CheckpointError(f"{where}/config.json: num_kv_shared_layers {cfg.num_kv_shared_layers} leaves no "
                              "layer computing K/V")
    source = tuple(i if modes[i] != "reuse" else max(j for j in range(first) if kinds[j] == kinds[i])
                   for i in range(cfg.num_hidden_layers))
    heads = [(cfg.per_layer_config[i].head_dim, cfg.per_layer_config[i].num_key_value_heads)
             for i in range(cfg.num_hidden_layers)]
    dims = DecoderDims(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                       num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
                       num_kv_heads=heads[0][1], head_dim=heads[0][0], rms_eps=cfg.rms_norm_eps,  # layer 0's
                       rope_theta=float(cfg.rope_parameters[kinds[0]]["rope_theta"]),
                       sliding_window=cfg.sliding_window if "sliding_attention" in kinds else None,
                       layer_sliding=tuple(kind == "sliding_attention" for kind in kinds),
                       embed_scale=cfg.hidden_size**0.5,
                       image_bidirectional=cfg.use_bidirectional_attention == "vision",
                       image_blocks_full=False, kv_source=source, logit_softcap=cfg.final_logit_softcapping,
                       max_positions=cfg.max_position_embeddings)
    if moe:  # the dense MLP runs beside the experts for every token: FLOPs count it as a shared expert's width
        dims = replace(dims, experts=cfg.num_experts, experts_per_token=cfg.top_k_experts,
                       expert_size=cfg.moe_intermediate_size, shared_expert_size=cfg.intermediate_size)
    return dims, heads


def rotaries(cfg, heads: list[tuple[int, int]], device) -> list[Rotary]:
    """Each layer's RoPE: default on the sliding layers, proportional on the full ones (the first
    partial_rotary_factor x head_dim / 2 frequencies, the rest zero), one object per kind."""
    made = {}
    for kind, (head_dim, _) in zip(cfg.layer_types, heads):
        if kind in made:
            continue
        params = cfg.rope_parameters[kind]
        rotary = Rotary(head_dim, float(params["rope_theta"]), device)
        if params.get("rope_type", "default") == "proportional":
            angles = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
            rotary.inv_freq = torch.cat([rotary.inv_freq[:angles], rotary.inv_freq.new_zeros(head_dim // 2 - angles)])
            rotary.inv_freq = rotary.inv_freq / params.get("factor", 1.0)
        made[kind] = rotary
    return [made[kind] for kind in cfg.layer_types]


class Gemma4Model(Family):
    """Everything the engine needs from one Gemma 4 checkpoint (image and text)."""

    family = "gemma4"
    name = "Gemma 4"
    seed_model = "Gemma-4-E4B-it"
    inner_types = {"text_config": ("gemma4_text",), "vision_config": ("gemma4_vision",)}
    default_template = "gemma4_chat"
    image_marker = IMAGE
    own_aspect = "resizes every image within its patch budget, keeping its aspect"

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoImageProcessor, AutoTokenizer

        super().__init__(folder, settings)
        self.config = cfg = self.auto_config()
        if cfg.vision_config is None:
            raise CheckpointError(f"{folder}/config.json: no vision_config (a text-only Gemma 4)")
        dims, heads = text_dims(cfg.text_config, folder)  # its refusals before anything is read
        self.tokenizer = self.shared(AutoTokenizer, "tokenizer files")
        self.image_token_id = cfg.image_token_id
        for token, wanted in ((BOI, cfg.boi_token_id), (EOI, cfg.eoi_token_id), (IMAGE, cfg.image_token_id)):
            got = self.tokenizer.encode(token, add_special_tokens=False)
            if got != [wanted]:
                raise CheckpointError(f"{folder}: the tokenizer encodes {token} as {got}, config.json says {wanted}")
        self.image_processor = self.pretrained(AutoImageProcessor, "image processor config")
        text = cfg.text_config
        parts = self._load(dims, heads)
        self.feature_fingerprint = self.fingerprint(
            {f"{group}.{k}": v for group in ("vision", "embedder") for k, v in parts.get(group, {}).items()})
        load_module(self.vision, parts.get("vision", {}), folder, "vision tower")
        load_module(self.embedder, parts.get("embedder", {}), folder, "vision embedder")
        self.vision, self.embedder = self.borrowed(self.vision), self.borrowed(self.embedder)
        side = {name: parts["lm"].pop(name) for name in SIDE_TENSORS if name in parts["lm"]}
        order = iter(range(dims.num_layers))  # DecoderLM builds the layers in order

        def layer(d, weights, linear):
            i = next(order)
            return Gemma4DecoderLayer(d, weights, linear, index=i, head_dim=heads[i][0], kv_heads=heads[i][1],
                                      device=self.device, dtype=self.dtype)

        self.lm = self.language_model(dims, parts["lm"], layer_class=layer)
        self.lm.layer_rotary = rotaries(text, heads, self.device)
        self.lm.rotary = self.lm.layer_rotary[0]
        if side:
            self.lm.layer_inputs = PerLayerInputs(side, text, self.linear, cfg.image_token_id, self.device, self.dtype)
        self._ids: dict[str, list[int]] = {}

    def _load(self, dims: DecoderDims, heads: list[tuple[int, int]]) -> dict[str, dict[str, torch.Tensor]]:
        """Every tensor, grouped lm / vision / embedder (tied: the published checkpoints store no lm_head)."""
        from transformers import AutoModel
        from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder

        cfg, text = self.config, self.config.text_config
        with no_init():
            self.vision = AutoModel.from_config(cfg.vision_config)
            self.embedder = Gemma4MultimodalEmbedder(cfg.vision_config, text)
        h, v = dims.hidden_size, dims.vocab_size
        expected = {"lm.embed_tokens.weight": (v, h), "lm.norm.weight": (h,), "lm.lm_head.weight": (v, h)}
        width = text.hidden_size_per_layer_input
        if width:
            expected |= {"lm.embed_tokens_per_layer.weight": (text.vocab_size_per_layer_input, dims.num_layers * width),
                         "lm.per_layer_model_projection.weight": (dims.num_layers * width, h),
                         "lm.per_layer_projection_norm.weight": (width,)}
        for i, (d, kv) in enumerate(heads):
            p = f"lm.layers.{i}."
            wide = dims.intermediate_size * (2 if text.use_double_wide_mlp and dims.kv_of(i) != i else 1)
            expected |= {p + f"{n}_layernorm.weight": (h,) for n in ("input", "post_attention", "pre_feedforward",
                                                                     "post_feedforward")}
            expected |= {p + "self_attn.q_proj.weight": (dims.num_heads * d, h), p + "self_attn.q_norm.weight": (d,),
                         p + "self_attn.o_proj.weight": (h, dims.num_heads * d), p + "layer_scalar": (1,),
                         p + "mlp.gate_proj.weight": (wide, h), p + "mlp.up_proj.weight": (wide, h),
                         p + "mlp.down_proj.weight": (h, wide)}
            if dims.kv_of(i) == i:
                expected |= {p + "self_attn.k_proj.weight": (kv * d, h), p + "self_attn.k_norm.weight": (d,)}
                if not (text.attention_k_eq_v and not dims.slides(i)):
                    expected[p + "self_attn.v_proj.weight"] = (kv * d, h)
            if dims.experts:
                e, w = dims.experts, dims.expert_size
                expected |= {p + f"{n}.weight": (h,) for n in MOE_NORMS}
                expected |= {p + "router.proj.weight": (e, h), p + "router.scale": (h,),
                             p + "router.per_expert_scale": (e,), p + "experts.gate_up_proj": (e, 2 * w, h),
                             p + "experts.down_proj": (e, h, w)}
            if width:
                expected |= {p + "per_layer_input_gate.weight": (width, h),
                             p + "per_layer_projection.weight": (h, width),
                             p + "post_per_layer_input_norm.weight": (h,)}
        expected.update({f"vision.{k}": tuple(t.shape) for k, t in self.vision.state_dict().items()})
        expected.update({f"embedder.{k}": tuple(t.shape) for k, t in self.embedder.state_dict().items()})
        shared = tuple(rf"^(?:model\.)?language_model\.(?:model\.)?layers\.{i}\.self_attn\.[kv]_(?:proj|norm)\."
                       for i in range(dims.num_layers) if dims.kv_of(i) != i)  # stored, never read
        return self.load_parts(NAME_RULES, expected, ignore=IGNORED + shared)

    def tied(self) -> bool:
        """Tied unless an lm_head is stored all the same (as Gemma 3's)."""
        stored = any(rename(name, NAME_RULES) == "lm.lm_head.weight" for name in tensor_files(self.folder))
        return bool(getattr(self.config, "tie_word_embeddings", True)) and not stored

    def preprocess_settings(self) -> dict:
        return {"processor": self.image_processor.to_dict(), "backend": type(self.image_processor).__name__}

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """One image → [max_patches, patch pixels + 2]: Gemma4ImageProcessor's patches (padding rows zero) with
        each patch's (x, y) position beside it (-1, -1 on padding), one array for the cache."""
        out = self.image_processor(images=image, return_tensors="np")
        return np.concatenate([out["pixel_values"][0], out["image_position_ids"][0].astype(np.float32)], axis=1)

    def vision_tokens(self, pixels: np.ndarray) -> int:
        return int((pixels[:, -1] >= 0).sum())

    @torch.inference_mode()
    def encode_images(self, pixels: list[np.ndarray]) -> list[torch.Tensor]:
        """preprocess() outputs → per image its projected soft tokens [n, hidden] (Gemma4Model.get_image_features)."""
        x = torch.from_numpy(np.stack(pixels))
        positions = x[..., -2:].long().to(self.device)
        values = x[..., :-2].to(self.device, self.dtype)
        features = self.embedder(self.vision(pixel_values=values, pixel_position_ids=positions).last_hidden_state)
        pooled = self.config.vision_config.pooling_kernel_size**2
        return list(features.split([self.vision_tokens(p) // pooled for p in pixels]))

    def prompt_ids(self, prompt: str, tokens: int) -> list[int]:
        """The prompt's ids as Gemma4Processor makes them, without added specials (the chat template writes
        <bos>): its `<|image|>` expanded to the image's `tokens` soft tokens between <|image> and <image|>."""
        if prompt.count(IMAGE) != 1:
            raise ValueError(f"prompt must hold exactly one {IMAGE}: {prompt!r}")
        before, after = prompt.split(IMAGE)
        ids = [self._ids.setdefault(part, self.tokenizer.encode(part, add_special_tokens=False))
               for part in (before, after)]
        cfg = self.config
        return ids[0] + [cfg.boi_token_id] + [cfg.image_token_id] * tokens + [cfg.eoi_token_id] + ids[1]

    def text_ids(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        return PromptLayout.of(self.prompt_ids(prompt, features.shape[0]), self.image_token_id)

    def vision_flops(self, counts: Counts) -> float:
        """Per patch the vision layers and patch embedding; per soft token the projection."""
        vc, h = self.config.vision_config, self.lm.dims.hidden_size
        d = vc.hidden_size
        per_patch = 2 * vc.num_hidden_layers * (4 * d * d + 3 * d * vc.intermediate_size) + 2 * 3 * vc.patch_size**2 * d
        return (per_patch + 2 * d * h / vc.pooling_kernel_size**2) * counts.vision_tokens

    @classmethod
    def reference_processor(cls, checkpoint: Path):
        """What Gemma4Processor makes of one image and prompt (transformers cannot build it here: its video half
        needs torchvision): the image processor's patches and positions, the prompt's `<|image|>` expanded
        (replace_image_token), tokenized without added specials, mm_token_type_ids 1 on the soft tokens."""
        from transformers import AutoImageProcessor, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        image_processor = AutoImageProcessor.from_pretrained(str(checkpoint))
        image_id = tokenizer.convert_tokens_to_ids(IMAGE)

        def process(images, text: str, return_tensors: str):
            pixels = image_processor(images=images, return_tensors=return_tensors)
            tokens = int(pixels.pop("num_soft_tokens_per_image")[0])
            encoded = tokenizer(text.replace(IMAGE, BOI + IMAGE * tokens + EOI), return_tensors=return_tensors,
                                add_special_tokens=False)
            return {**encoded, **pixels, "mm_token_type_ids": (encoded["input_ids"] == image_id).int()}

        process.tokenizer = tokenizer
        return process
