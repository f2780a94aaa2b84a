"""BLIP-2's random checkpoints (a tiny one; OPT's shape): a model the engine has no family for, run
by the transformers backend (a Q-Former's query tokens before the prompt; the class POPE's own
paper evaluated)."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (Weights, builtin_chat_tokenizer, checkpoint_folder, save_checkpoint, sized,
               stand_in_only, with_vocab)

# ViT at 28 px, a 2-layer Q-Former of 4 queries, OPT below it; no chat template (POPE's "Question:
# ... Answer:") (32,064 vocabulary rows, as the families' tables pad LLaMA's: the legacy readouts'
# fixed ids are rows)
SIZES = {"tiny": dict(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                image_size=28, patch_size=14),
    qformer=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 encoder_hidden_size=32),
    text=dict(model_type="opt", hidden_size=64, ffn_dim=128, num_hidden_layers=2,
              num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=2048,
              vocab_size=32064),
    queries=4)}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    with quiet_fallback():
        from transformers import (Blip2Config, Blip2ForConditionalGeneration, Blip2Processor,
                                  BlipImageProcessor)

    stand_in_only(tokenizer_dir, __name__)
    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = builtin_chat_tokenizer(["<image>"], bos="</s>", eos="</s>", pad="<pad>")
    text = dict(with_vocab(dims["text"], tok), bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = Blip2Config(vision_config=dims["vision"],
                         qformer_config=dict(dims["qformer"], vocab_size=len(tok)),
                         text_config=text, num_query_tokens=dims["queries"],
                         image_token_index=tok.convert_tokens_to_ids("<image>"))
    side = dims["vision"]["image_size"]
    image_processor = BlipImageProcessor(size={"height": side, "width": side})
    processor = Blip2Processor(image_processor=image_processor, tokenizer=tok,
                               num_query_tokens=dims["queries"])
    return save_checkpoint(folder, config, Blip2ForConditionalGeneration, processor,
                           weights or Weights(**stream))
