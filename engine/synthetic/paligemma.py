"""PaliGemma 2's random checkpoints (a tiny one): a model the engine has no family for, run by the
transformers backend (prefix-LM: the image and the prompt attend to each other both ways)."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (Weights, builtin_chat_tokenizer, checkpoint_folder, save_checkpoint, sized,
               stand_in_only, with_vocab)

# SigLIP at 28 px in 14-px patches (4 image tokens), Gemma 2 below it; no chat template (the
# processor writes the image tokens, BOS and the prompt's closing newline itself) (32,064 vocabulary
# rows, as the families' tables pad LLaMA's: the legacy readouts' fixed ids are rows)
SIZES = {"tiny": dict(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                image_size=28, patch_size=14),
    text=dict(model_type="gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=2048, vocab_size=32064))}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    with quiet_fallback():
        from transformers import (PaliGemmaConfig, PaliGemmaForConditionalGeneration,
                                  PaliGemmaProcessor, SiglipImageProcessor)

    stand_in_only(tokenizer_dir, __name__)
    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = builtin_chat_tokenizer(["<image>"], bos="<bos>", eos="<eos>", pad="<pad>")
    vision = dims["vision"]
    tokens = (vision["image_size"] // vision["patch_size"]) ** 2
    text = dict(with_vocab(dims["text"], tok), bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = PaliGemmaConfig(vision_config=dict(vision, projection_dim=text["hidden_size"]),
                             text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"),
                             projection_dim=text["hidden_size"])
    config.text_config.num_image_tokens = tokens
    side = vision["image_size"]
    image_processor = SiglipImageProcessor(size={"height": side, "width": side},
                                           image_seq_length=tokens)
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tok)
    return save_checkpoint(folder, config, PaliGemmaForConditionalGeneration, processor,
                           weights or Weights(**stream))
