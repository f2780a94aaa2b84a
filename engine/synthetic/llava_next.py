"""LLaVA-NeXT's random checkpoints (LLaVA-1.6-Mistral-7B's shape and the tiny one) and
the writer."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import Weights, checkpoint_folder, save_checkpoint, sized, tokenizer_for, with_vocab
from .llava import CLIP_L_336, CLIP_TINY_336

# The 336-px pinpoints of LLaVA-1.6: a 640 x 480 COCO image is 5 crops, 2,340 image tokens.
ANYRES_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]

# Mistral-7B-Instruct-v0.2 (grouped KV heads, rope_theta 1e6), and its tiny stand-in.
MISTRAL_7B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, vocab_size=32064,
                  rms_norm_eps=1e-5, max_position_embeddings=32768, rope_theta=1e6,
                  sliding_window=None)

MISTRAL_TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=32064,
                    rms_norm_eps=1e-5, max_position_embeddings=32768, rope_theta=1e6,
                    sliding_window=None)

SIZES = {"7b": dict(vision=CLIP_L_336, text=MISTRAL_7B),
         "tiny": dict(vision=CLIP_TINY_336, text=MISTRAL_TINY)}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """A random-weight llava-hf LLaVA-1.6-Mistral checkpoint: LLaVA-1.5's tower, a Mistral language
    model and anyres pinpoints (dims' `pinpoints`, default the 336-px ones)."""
    with quiet_fallback():  # the processor classes' torchvision notice
        from transformers import (CLIPVisionConfig, LlavaNextConfig,
                                  LlavaNextForConditionalGeneration, LlavaNextImageProcessor,
                                  LlavaNextProcessor, MistralConfig)

    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = tokenizer_for(folder, tokenizer_dir)
    pinpoints = dims.get("pinpoints", ANYRES_PINPOINTS)
    config = LlavaNextConfig(vision_config=CLIPVisionConfig(**dims["vision"]),
                             text_config=MistralConfig(**with_vocab(dims["text"], tok),
                                                       bos_token_id=1, eos_token_id=2),
                             image_token_index=tok.convert_tokens_to_ids("<image>"),
                             pad_token_id=tok.pad_token_id, image_grid_pinpoints=pinpoints,
                             **dims.get("config", {}))
    size = dims["vision"]["image_size"]
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(size={"shortest_edge": size},
                                                crop_size={"height": size, "width": size},
                                                image_grid_pinpoints=pinpoints),
        tokenizer=tok, patch_size=dims["vision"]["patch_size"],
        vision_feature_select_strategy="default", num_additional_image_tokens=1)
    return save_checkpoint(folder, config, LlavaNextForConditionalGeneration, processor,
                           weights or Weights(**stream))
