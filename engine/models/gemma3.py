"""Gemma 3 (transformers `model_type: gemma3`, Gemma3ForConditionalGeneration; gemma-3-4b-it).

A SigLIP tower (transformers' module) whose patch grid is average-pooled to `mm_tokens_per_image`
tokens, RMS-normed and projected (Gemma3MultiModalProjector, also transformers'); the cache keeps
those projected [256, hidden] features per image. The processor resizes every image to the tower's
square (no pan and scan) and the prompt's `<start_of_image>` becomes "\\n\\n<start_of_image>" + 256
x `<image_soft_token>` + "<end_of_image>\\n\\n" (processing_gemma3.py, full_image_sequence).

The language model differs from LLaMA's in ways the shared DecoderLM takes as DecoderDims flags or
this module's layer (transformers models/gemma3/modeling_gemma3.py):
- RMSNorm scales by (1 + w) in fp32 and casts once (Gemma3RMSNorm); four per layer: input,
  post-attention (on the attention output, before the residual add), pre- and post-feedforward; q
  and k norms of that kind;
- a GeGLU MLP with tanh GELU; text embeddings times sqrt(hidden) in the embedding's dtype, image
  features placed unscaled (Gemma3TextScaledWordEmbedding, Gemma3Model.forward);
- attention scaled by query_pre_attn_scalar**-0.5 (Gemma3Attention.scaling), folded here into q's
  norm as sqrt(head_dim / query_pre_attn_scalar), so every attention path (SDPA, the prefix
  kernel, decode, probe) applies it with its own head_dim**-0.5: a factor of exactly 1 where the
  two are equal (256 and 256 in the published configs), else applied in fp32 before q's one cast
  (q then rounds scaled, where transformers rounds it unscaled: equal in fp32, within a rounding
  step in fp16/bf16);
- local and global RoPE (rope_parameters["sliding_attention"] / ["full_attention"], the 4B's global
  one linearly scaled by 8) per layer_types; the sliding layers (DecoderDims.layer_sliding) attend
  like full ones within their window (masking_utils.sliding_window_overlay keeps keys with q - k <
  window, ANDed with the image mask below): prompts and prefixes past it prefill within it
  (attention.prompt_attention), questions read only their prefix's last keys
  (windowed_suffix_attention), continuations decode within it (window_masks);
- the tokens of one image attend to each other both ways (create_masks_for_vision_model: OR(causal,
  same image run), from token_type_ids = 1 on the image soft tokens only):
  DecoderDims.image_bidirectional; the image lies in the prefix, so the prefix prefill (and a whole
  prompt) runs that mask and the question suffixes, after it, stay causal.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from ..inputs.coded_pixels import CodedPixels, pixels_on_device
from ..inputs.images import checked_fast_path, normalize_table, to_rgb
from ..layers.ops import apply_rotary, offset_rms_norm
from ..layers.decoder import DecoderDims, DecoderLayer
from ..utils.loader import CheckpointError, load_module, no_init
from ..inputs.plan import PromptLayout
from ..inputs.prompts import PromptMemo
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import Family

BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
NAME_RULES = [
    (r"^lm_head\.", "lm.lm_head."),
    (r"^(?:model\.)?language_model\.(?:model\.)?", "lm."),
    (r"^(?:model\.)?vision_tower\.", "vision."),
    (r"^(?:model\.)?multi_modal_projector\.", "projector."),
]


class GemmaPixels:
    """Gemma3ImageProcessorPil without pan and scan, faster: the same PIL resize to the square, then
    one lookup per pixel into the rescale-and-normalize table (as ClipPixels)."""

    def __init__(self, size: tuple[int, int], resample: int, rescale_factor: float, mean, std):
        self.size, self.resample = size, resample
        self.table = normalize_table(rescale_factor, mean, std)

    @classmethod
    def for_processor(cls, processor) -> "GemmaPixels | None":
        if (type(processor).__name__ != "Gemma3ImageProcessorPil"
                or np.size(processor.image_mean) != 3):
            return None
        if not all((processor.do_resize, processor.do_rescale, processor.do_normalize,
                    processor.do_convert_rgb)):
            return None
        size = processor.size
        if not (size.height and size.width):
            return None
        return cls((size.height, size.width), int(processor.resample), processor.rescale_factor,
                   processor.image_mean, processor.image_std)

    def __call__(self, image: Image.Image) -> np.ndarray:
        """An image → pixel values [3, height, width] float32."""
        codes = self.codes(image)
        return np.stack([np.take(self.table[c], codes[c]) for c in range(3)])

    def codes(self, image: Image.Image) -> np.ndarray:
        """An image → its resized uint8 values [3, height, width], before the lookup."""
        resized = np.asarray(to_rgb(image).resize((self.size[1], self.size[0]),
                                                  resample=self.resample))
        return np.ascontiguousarray(resized.transpose(2, 0, 1))


class Gemma3DecoderLayer(DecoderLayer):
    """Gemma3DecoderLayer: (1 + w) RMSNorms (input, post-attention, pre- and post-feedforward, q and
    k), tanh-GELU GeGLU, the attention scale folded into q's norm (see the module docstring)."""

    def __init__(self, dims: DecoderDims, weights: dict[str, torch.Tensor], linear,
                 q_scale: float = 1.0):
        super().__init__(dims, weights, linear)
        self.pre_ff_norm, self.post_ff_norm = (
            nn.Parameter(weights[f"{n}_feedforward_layernorm.weight"], requires_grad=False)
            for n in ("pre", "post"))
        self.q_scale = q_scale

    def qkv(self, x, cos, sin, need_q: bool = True, image=None):
        b, s, _ = x.shape
        d = self.dims
        h = offset_rms_norm(x, self.input_norm, d.rms_eps)
        k = offset_rms_norm(self.k_proj(h).view(b, s, d.num_kv_heads, d.head_dim), self.k_norm,
                            d.rms_eps)
        k = k.transpose(1, 2)
        v = self.v_proj(h).view(b, s, d.num_kv_heads, d.head_dim).transpose(1, 2)
        if not need_q:
            return None, apply_rotary(k, cos, sin), v
        q = offset_rms_norm(self.q_proj(h).view(b, s, d.num_heads, d.head_dim), self.q_norm,
                            d.rms_eps, self.q_scale)
        return apply_rotary(q.transpose(1, 2), cos, sin), apply_rotary(k, cos, sin), v

    def finish(self, x, attn, image=None, mlp=None):
        b, _, s, _ = attn.shape
        eps = self.dims.rms_eps
        x = x + offset_rms_norm(self.o_proj(attn.transpose(1, 2).reshape(b, s, -1)), self.post_norm,
                                eps)
        h = offset_rms_norm(x, self.pre_ff_norm, eps)
        h = self.down_proj(F.gelu(self.gate_proj(h), approximate="tanh") * self.up_proj(h))
        # mlp: Gemma3MLP's output
        return x + offset_rms_norm(h if mlp is None else mlp(h), self.post_ff_norm, eps)


def text_dims(cfg, where: Path) -> tuple[DecoderDims, float]:
    """DecoderDims of a Gemma3TextConfig and the factor folded into q (sqrt(head_dim /
    query_pre_attn_scalar)); a one-line CheckpointError for what the engine does not implement."""
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(cfg, name, None) is not None:
            raise CheckpointError(f"{where}/config.json: {name} is set; Gemma 3 has none and the "
                                  "engine implements none")
    if getattr(cfg, "use_bidirectional_attention", False):
        raise CheckpointError(f"{where}/config.json: use_bidirectional_attention (an encoder) is "
                              "not supported")
    if getattr(cfg, "hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"{where}/config.json: hidden_activation {cfg.hidden_activation!r} "
                              "is not supported (gelu_pytorch_tanh only)")
    ropes = {}
    for kind in ("sliding_attention", "full_attention"):
        params = cfg.rope_parameters[kind]
        rope_type = params.get("rope_type", "default")
        if rope_type not in ("default", "linear"):
            raise CheckpointError(f"{where}/config.json: {kind} rope_type {rope_type!r} is not "
                                  "supported (default and linear only)")
        ropes[kind] = (float(params["rope_theta"]),
                       float(params.get("factor", 1.0)) if rope_type == "linear" else 1.0)
    kinds = list(cfg.layer_types)
    if len(kinds) != cfg.num_hidden_layers or set(kinds) - set(ropes):
        raise CheckpointError(f"{where}/config.json: layer_types {kinds} do not name the "
                              f"{cfg.num_hidden_layers} layers' attention (sliding_attention or "
                              "full_attention)")
    heads = cfg.num_attention_heads
    dims = DecoderDims(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                     intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers,
                     num_heads=heads, num_kv_heads=cfg.num_key_value_heads,
                     head_dim=cfg.head_dim, rms_eps=cfg.rms_norm_eps,
                     rope_theta=ropes["full_attention"][0],
                     sliding_window=cfg.sliding_window if "sliding_attention" in kinds else None,
                     layer_sliding=tuple(kind == "sliding_attention" for kind in kinds),
                     qkv_bias=bool(getattr(cfg, "attention_bias", False)), qk_norm=True,
                     layer_rope=tuple(ropes[kind] for kind in kinds),
                     embed_scale=cfg.hidden_size**0.5,
                     norm_unit_offset=True, image_bidirectional=True,
                     max_positions=cfg.max_position_embeddings)
    return dims, math.sqrt(cfg.head_dim / cfg.query_pre_attn_scalar)


class Gemma3Model(Family):
    """Everything the engine needs from one Gemma 3 checkpoint."""

    family = "gemma3"
    name = "Gemma 3"
    seed_model = "Gemma-3-4B-it"
    inner_types = {"text_config": ("gemma3_text",), "vision_config": ("siglip_vision_model",)}
    default_template = "gemma3_chat"
    image_marker = BOI
    own_aspect = "resizes every image to its square"

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoImageProcessor, AutoTokenizer

        super().__init__(folder, settings)
        self.config = cfg = self.auto_config()
        self.tokenizer = self.shared(AutoTokenizer, "tokenizer files")
        self.image_token_id = cfg.image_token_id
        self.mm_tokens = cfg.mm_tokens_per_image
        for token, wanted in ((BOI, cfg.boi_token_id), (EOI, cfg.eoi_token_id),
                              (IMAGE, cfg.image_token_id)):
            got = self.tokenizer.encode(token, add_special_tokens=False)
            if got != [wanted]:
                raise CheckpointError(f"{folder}: the tokenizer encodes {token} as {got}, "
                                      f"config.json says {wanted}")
        vc = cfg.vision_config
        side = vc.image_size // vc.patch_size
        pooled = math.isqrt(self.mm_tokens)
        if pooled**2 != self.mm_tokens or side % pooled:
            raise CheckpointError(f"{folder}/config.json: mm_tokens_per_image {self.mm_tokens} "
                                  f"does not pool the {side} x {side} patch grid evenly")
        self.image_processor = self.pretrained(AutoImageProcessor, "image processor config")
        if getattr(self.image_processor, "do_pan_and_scan", None):
            raise CheckpointError(f"{folder}: do_pan_and_scan is on; "
                                  "the engine runs one view per image")

        dims, self.q_scale = text_dims(cfg.text_config, folder)
        parts = self._load(dims)
        self.feature_fingerprint = self.fingerprint(
            {f"{group}.{k}": v for group in ("vision", "projector")
             for k, v in parts.get(group, {}).items()},
            mm_tokens_per_image=self.mm_tokens)
        load_module(self.vision, parts.get("vision", {}), folder, "vision tower")
        load_module(self.projector, parts.get("projector", {}), folder, "projector")
        self.vision, self.projector = self.borrowed(self.vision), self.borrowed(self.projector)
        q_scale = self.q_scale
        self.lm = self.language_model(
            dims, parts["lm"],
            layer_class=lambda d, w, linear: Gemma3DecoderLayer(d, w, linear, q_scale))
        self._fast_pixels = checked_fast_path(GemmaPixels.for_processor(self.image_processor),
                                              self._processor_pixels)
        self.full_image = f"\n\n{BOI}{IMAGE * self.mm_tokens}{EOI}\n\n"
        self._ids = PromptMemo(lambda prompt: self.tokenizer.encode(
            prompt.replace(BOI, self.full_image), add_special_tokens=False))

    def _load(self, dims: DecoderDims) -> dict[str, dict[str, torch.Tensor]]:
        """Every tensor, grouped lm / vision / projector; a tied checkpoint (the published ones)
        reads its logits off the embedding matrix."""
        from transformers import AutoModel
        from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

        cfg = self.config
        with no_init():
            self.vision = AutoModel.from_config(cfg.vision_config)
            self.projector = Gemma3MultiModalProjector(cfg)
        expected = {f"lm.{k}": s for k, s in dims.expected_shapes().items()}
        for i in range(dims.num_layers):
            expected.update({f"lm.layers.{i}.{n}_feedforward_layernorm.weight": (dims.hidden_size,)
                             for n in ("pre", "post")})
        expected.update({f"vision.{k}": tuple(v.shape)
                         for k, v in self.vision.state_dict().items()})
        expected.update({f"projector.{k}": tuple(v.shape)
                         for k, v in self.projector.state_dict().items()})
        return self.load_parts(NAME_RULES, expected)

    def tied(self) -> bool:
        """Tied (true where config.json does not say; the published checkpoints store no lm_head),
        unless an lm_head is stored all the same, which transformers 5 then keeps untied."""
        cfg = self.config
        stored = self.stores_lm_head(NAME_RULES)
        return bool(getattr(cfg, "tie_word_embeddings",
                            getattr(cfg.text_config, "tie_word_embeddings", True))) and not stored

    def preprocess_settings(self) -> dict:
        return {"processor": self.image_processor.to_dict(),
                "backend": type(self.image_processor).__name__, "alpha": "over white"}

    def preprocess(self, image: Image.Image) -> np.ndarray | CodedPixels:
        """One image → pixel values [3, H, W] as Gemma3ImageProcessor makes them (NumPy:
        Family.preprocess); on the fast path as uint8 codes and their table, normalized on
        the device."""
        if self._fast_pixels is None:
            return self._processor_pixels(image)
        return CodedPixels(self._fast_pixels.codes(image), self._fast_pixels.table)

    def _processor_pixels(self, image: Image.Image) -> np.ndarray:
        out = self.image_processor(images=image, return_tensors="np")
        return np.asarray(out["pixel_values"][0])

    def vision_tokens(self, pixels) -> int:
        vc = self.config.vision_config
        return (vc.image_size // vc.patch_size) ** 2

    @torch.inference_mode()
    def encode_images(self, pixels: list[np.ndarray]) -> list[torch.Tensor]:
        """preprocess() outputs → per image the projected features [mm_tokens_per_image, hidden]
        (Gemma3Model.get_image_features)."""
        x = pixels_on_device(pixels, self.device, self.dtype)
        return list(self.projector(self.vision(pixel_values=x).last_hidden_state))

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt's ids as Gemma3Processor makes them with add_special_tokens=False (the chat
        template writes <bos> itself): <start_of_image> expanded to the full image sequence, the
        text tokenized whole."""
        if prompt.count(BOI) != 1:
            raise ValueError(f"prompt must hold exactly one {BOI}: {prompt!r}")
        return self._ids(prompt)

    def text_ids(self, prompt: str) -> list[int]:
        """A text-only prompt's ids, as for an image prompt without special tokens added: the chat
        template writes <bos> itself (a second one is what tokenizing the rendered text with them
        would add)."""
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        if features.shape[0] != self.mm_tokens:
            raise ValueError(f"{features.shape[0]} image features, the processor writes "
                             f"{self.mm_tokens} image tokens")
        return PromptLayout.of(self.prompt_ids(prompt), self.image_token_id)

    def vision_flops(self, counts: Counts) -> float:
        """Per patch the SigLIP layers and patch embedding; per pooled token the projection."""
        vc, h = self.config.vision_config, self.lm.dims.hidden_size
        d = vc.hidden_size
        per_patch = (2 * vc.num_hidden_layers * (4 * d * d + 2 * d * vc.intermediate_size)
                     + 2 * 3 * vc.patch_size**2 * d)
        pooled = self.mm_tokens / (vc.image_size // vc.patch_size) ** 2
        return (per_patch + 2 * d * h * pooled) * counts.vision_tokens


    @classmethod
    def reference_processor(cls, checkpoint: Path):
        """Gemma3Processor, tokenizing without added specials: the chat template writes <bos> itself
        (as the processor's own apply_chat_template tokenizes it)."""
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(checkpoint))

        def process(images, text: str, return_tensors: str):
            return processor(images=images, text=text, return_tensors=return_tensors,
                             add_special_tokens=False)


        process.tokenizer = processor.tokenizer
        return process


