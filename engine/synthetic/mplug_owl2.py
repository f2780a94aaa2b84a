"""mPLUG-Owl2's random checkpoints (mPLUG-Owl2-LLaMA2-7B's shape and the tiny one) and the writer,
which streams upstream's tensor names (transformers has no class for it)."""
from __future__ import annotations

import json
from pathlib import Path

from ..layers.decoder import DecoderDims
from ..utils.loader import quiet_fallback
from ..models.mplug_owl2 import MODEL_TYPE, TOP_LEVEL
from ..models.mplug_owl2_nets import AbstractorDims, VisionDims, lm_expected_shapes
from . import (LLAMA_7B, LLAMA_TINY, Weights, checkpoint_folder, sized, tokenizer_for, with_vocab,
               write_tensors)

# mPLUG-Owl2-LLaMA2-7B: a ViT-L/14 at 448 px (1,025 tokens), a 6-layer visual abstractor of 64
# queries, LLaMA-2-7B with multiway k/v projections and norms; 65 image tokens either way.
SIZES = {
    "7b": dict(vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                           num_attention_heads=16, image_size=448, patch_size=14),
               abstractor=dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
                               num_attention_heads=16, encoder_hidden_size=1024, grid_size=32,
                               num_learnable_queries=64),
               text=dict(LLAMA_7B, vocab_size=32000)),
    "tiny": dict(vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, image_size=448, patch_size=14),
                 abstractor=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, encoder_hidden_size=64, grid_size=32,
                                 num_learnable_queries=64),
                 text=dict(LLAMA_TINY, vocab_size=32000)),
}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """A random-weight checkpoint in upstream mPLUG-Owl2's layout (config.json with visual_config,
    upstream's tensor names, a CLIP processor at the ViT's size); transformers has no class for it,
    so the tensors are streamed from the family's own shape tables ("stream" weights only)."""
    with quiet_fallback():  # the processor class's torchvision notice
        from transformers import CLIPImageProcessor, LlamaConfig

    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    weights = weights or Weights(**stream)
    if weights.init != "stream":
        raise ValueError("mPLUG-Owl2 checkpoints are written as streamed random tensors only")
    text = with_vocab(dims["text"], tokenizer_for(folder, tokenizer_dir))
    raw = {"architectures": ["MPLUGOwl2LlamaForCausalLM"], "model_type": MODEL_TYPE, **text,
           "num_key_value_heads": text.get("num_key_value_heads", text["num_attention_heads"]),
           "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 10000.0,
           "tie_word_embeddings": False,
           "visual_config": {"visual_model": dims["vision"],
                             "visual_abstractor": dims["abstractor"]}}
    lm = DecoderDims.from_config(LlamaConfig(**{k: v for k, v in raw.items()
                                                if k not in TOP_LEVEL}))
    shapes = {(k if k == "lm_head.weight" else f"model.{k}"): v
              for k, v in lm_expected_shapes(lm).items()}
    shapes.update({f"model.vision_model.{k}": v
                   for k, v in VisionDims(**dims["vision"]).expected_shapes().items()})
    abstractor = AbstractorDims(**dims["abstractor"])
    shapes.update({f"model.visual_abstractor.{k}": v
                   for k, v in abstractor.expected_shapes(lm.hidden_size).items()})
    side = dims["vision"]["image_size"]
    write_tensors(folder, shapes, weights)
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    CLIPImageProcessor(size={"shortest_edge": side},
                       crop_size={"height": side, "width": side}).save_pretrained(str(folder))
    return folder
