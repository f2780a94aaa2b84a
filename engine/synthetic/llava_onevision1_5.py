"""LLaVA-OneVision-1.5's random checkpoints (a tiny one): a model the engine has no family for, run
by the transformers backend (the RICE ViT at native resolution with a class token, 2 x 2 patches
merged, a Qwen3 language model with plain RoPE)."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (Weights, builtin_chat_tokenizer, checkpoint_folder, save_checkpoint, sized,
               stand_in_only, with_vocab)

# the Qwen chat format LLaVA-OneVision-1.5 keeps, the image as
# <|vision_start|><|image_pad|><|vision_end|> (here with no default system turn: the stand-in's
# words have none of it)
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}"
        "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# 14-px patches merged 2 x 2 within 3,136-12,544 pixels (a test image: 6 to 16 tokens) (32,064
# vocabulary rows, as the families' tables pad LLaMA's: the legacy readouts' fixed ids are rows)
SIZES = {"tiny": dict(
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                spatial_merge_size=2, out_hidden_size=64),
    text=dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=32,
              max_position_embeddings=2048, vocab_size=32064,
              rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    pixels=(56 * 56, 112 * 112))}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """Its config, weights, image processor and tokenizer with the chat template; its
    video processor's file is not written (a real checkpoint's holds no more than the
    model_type names)."""
    with quiet_fallback():
        from transformers import (LlavaOnevision15Config, LlavaOnevision15ForConditionalGeneration,
                                  Qwen2VLImageProcessorPil)

    stand_in_only(tokenizer_dir, __name__)
    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = builtin_chat_tokenizer(SPECIALS, eos="<|im_end|>", pad="<|endoftext|>",
                                 chat_template=CHAT)
    ids = {name: tok.convert_tokens_to_ids(f"<|{token}|>") for name, token in (
        ("image_token_id", "image_pad"), ("video_token_id", "video_pad"),
        ("vision_start_token_id", "vision_start"), ("vision_end_token_id", "vision_end"))}
    text = dict(with_vocab(dims["text"], tok), eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    config = LlavaOnevision15Config(vision_config=dims["vision"], text_config=text, **ids)
    low, high = dims["pixels"]
    tok.save_pretrained(str(folder))
    # one frame a patch: the RICE ViT embeds 2-D patches (Qwen2-VL's processor's default stacks two)
    images = Qwen2VLImageProcessorPil(size={"shortest_edge": low, "longest_edge": high},
                                      temporal_patch_size=1)
    return save_checkpoint(folder, config, LlavaOnevision15ForConditionalGeneration, images,
                           weights or Weights(**stream))
