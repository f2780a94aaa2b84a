"""Llama-3.2-Vision's random checkpoints (a tiny one): a model the engine has no family for,
run by the transformers backend (cross-attention to the vision features, not image tokens in
the sequence)."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (Weights, builtin_chat_tokenizer, checkpoint_folder, save_checkpoint, sized,
               stand_in_only, with_vocab)

# the chat template's shape (BOS, Llama 3's header turns, the image as <|image|> before the text);
# the tokenizer adds a BOS too, as Llama 3's does, so a rendered prompt is tokenized without added
# special tokens
CHAT = ("{{ bos_token }}{% for m in messages %}"
        "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<|image|>{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}<|eot_id|>"
        "{% endfor %}"
        "{% if add_generation_prompt %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
SPECIALS = ["<|image|>", "<|start_header_id|>", "<|end_header_id|>"]
# 28-px tiles of 2 x 2 patches, up to the class's four tiles; three decoder layers, the middle one
# cross-attention (32,064 vocabulary rows, as the families' tables pad LLaMA's: the legacy readouts'
# fixed ids are rows)
SIZES = {"tiny": dict(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1,
                attention_heads=2, image_size=28, patch_size=14, max_num_tiles=4,
                vision_output_dim=64, intermediate_layers_indices=[0]),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, cross_attention_layers=[1], max_position_embeddings=2048,
              vocab_size=32064))}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    with quiet_fallback():  # the PIL image processor's torchvision notice
        from transformers import (MllamaConfig, MllamaForConditionalGeneration,
                                  MllamaImageProcessor, MllamaProcessor)

    stand_in_only(tokenizer_dir, __name__)
    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = builtin_chat_tokenizer(SPECIALS, bos="<|begin_of_text|>", eos="<|eot_id|>",
                                 pad="<|finetune_right_pad_id|>", chat_template=CHAT)
    text = dict(with_vocab(dims["text"], tok), bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = MllamaConfig(vision_config=dims["vision"], text_config=text,
                          image_token_index=tok.convert_tokens_to_ids("<|image|>"))
    tiles = dims["vision"]["image_size"]
    image_processor = MllamaImageProcessor(size={"height": tiles, "width": tiles},
                                           max_image_tiles=dims["vision"]["max_num_tiles"])
    processor = MllamaProcessor(image_processor=image_processor, tokenizer=tok, chat_template=CHAT)
    return save_checkpoint(folder, config, MllamaForConditionalGeneration, processor,
                           weights or Weights(**stream))
