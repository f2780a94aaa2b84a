"""Idefics3's random checkpoints (Idefics3-8B-Llama3's shape and a tiny one of SmolVLM's layout:
the image split into tiles plus a global view, each pixel-shuffled into a few tokens), with the
stand-in tokenizer."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (Weights, builtin_chat_tokenizer, checkpoint_folder, save_checkpoint, sized,
               stand_in_only, with_vocab)

# SmolVLM's chat template's shape: "User:<image> question<end_of_utterance>\nAssistant:"
CHAT = ("<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
        "{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image>{% else %} {{ c['text'] }}{% endif %}{% endfor %}"
        "<end_of_utterance>\n"
        "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")
SPECIALS = ["<|im_start|>", "<image>", "<fake_token_around_image>", "<global-img>",
            *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]
# 56-px tiles of 14-px patches, shuffled by 2: 4 tokens a tile; an image's longest edge resized to
# 112 (up to 2 x 2 tiles and the global view); 32,064 vocabulary rows, as the families' tables pad
# LLaMA's (the legacy readouts' fixed ids are rows)
# Idefics3-8B-Llama3: SigLIP-so400m on 364-px tiles (169 tokens each), images to 4 x 364 px,
# Llama 3.1 8B's language model (its RoPE scaled as "llama3") with its three image tokens added
# (vocabulary 128,259 rows)
SIZES = {"tiny": dict(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                image_size=56, patch_size=14),
    text=dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
              vocab_size=32064),
    longest_edge=112, scale_factor=2),
    "7b": dict(
    vision=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                num_attention_heads=16, image_size=364, patch_size=14),
    text=dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
              vocab_size=128259, rms_norm_eps=1e-5,
              rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                   low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=8192)),
    longest_edge=1456, scale_factor=2)}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    with quiet_fallback():
        from transformers import (Idefics3Config, Idefics3ForConditionalGeneration,
                                  Idefics3ImageProcessor, Idefics3Processor)

    stand_in_only(tokenizer_dir, __name__)
    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = builtin_chat_tokenizer(SPECIALS, eos="<end_of_utterance>", pad="<pad>",
                                 chat_template=CHAT)
    text = dict(with_vocab(dims["text"], tok), eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    vision, scale = dims["vision"], dims["scale_factor"]
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=scale,
                            image_token_id=tok.convert_tokens_to_ids("<image>"))
    tile = vision["image_size"]
    # dims' `images`: further image processor settings (do_resize False keeps an image that fits
    # one tile whole)
    images = Idefics3ImageProcessor(size={"longest_edge": dims["longest_edge"]},
                                    max_image_size={"longest_edge": tile},
                                    **dims.get("images", {}))
    processor = Idefics3Processor(image_processor=images, tokenizer=tok, chat_template=CHAT,
                                  image_seq_len=(tile // vision["patch_size"] // scale) ** 2)
    return save_checkpoint(folder, config, Idefics3ForConditionalGeneration, processor,
                           weights or Weights(**stream))
