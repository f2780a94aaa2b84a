"""LLaVA-1.5's random checkpoints: their shapes (the seed model's and the tiny one) and the writer."""
from __future__ import annotations

from pathlib import Path

from ..loader import quiet_fallback
from . import LLAMA_7B, LLAMA_TINY, Weights, checkpoint_folder, save_checkpoint, sized, tokenizer_for, with_vocab

# CLIP ViT-L/14 at 336 px (577 tokens, 576 after dropping CLS), and the tiny tower of the random
# checkpoints: small widths, the real image, so prefixes are as long as the real ones.
CLIP_L_336 = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                  image_size=336, patch_size=14, projection_dim=768)

CLIP_TINY_336 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     image_size=336, patch_size=14, projection_dim=64)

SIZES = {"7b": dict(vision=CLIP_L_336, text=LLAMA_7B), "tiny": dict(vision=CLIP_TINY_336, text=LLAMA_TINY)}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """A random-weight llava-hf checkpoint. dims: a SIZES name or a dict of its shape (vision,
    text, and optional top-level `config` kwargs)."""
    with quiet_fallback():  # the processor classes' torchvision notice
        from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                                  LlavaForConditionalGeneration, LlavaProcessor)

    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = tokenizer_for(folder, tokenizer_dir)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**dims["vision"]),
                         text_config=LlamaConfig(**with_vocab(dims["text"], tok), bos_token_id=1, eos_token_id=2),
                         image_token_index=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id,
                         **dims.get("config", {}))
    size = dims["vision"]["image_size"]
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}),
        tokenizer=tok, patch_size=dims["vision"]["patch_size"], vision_feature_select_strategy="default",
        num_additional_image_tokens=1)
    return save_checkpoint(folder, config, LlavaForConditionalGeneration, processor, weights or Weights(**stream))
