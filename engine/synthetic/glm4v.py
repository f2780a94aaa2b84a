"""GLM-4.1V's random checkpoints (a tiny one): a model the engine has no family for, run by the
transformers backend (a native-resolution ViT with 3-D RoPE, 2 x 2 patches merged, GLM-4's decoder
with M-RoPE on half of each head)."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (Weights, builtin_chat_tokenizer, checkpoint_folder, save_checkpoint, sized,
               stand_in_only, with_vocab)

# GLM-4.1V-9B's chat template's shape ("[gMASK]<sop>", role tags, the image between its begin and
# end tokens); its tokenizer is on the hub only: a word-level stand-in with its special tokens
CHAT = ("[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
        "{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
SPECIALS = ["[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|begin_of_image|>", "<|image|>",
            "<|end_of_image|>", "<|begin_of_video|>", "<|video|>", "<|end_of_video|>"]
# 14-px patches merged 2 x 2 within 3,136-12,544 pixels (a test image: 6 to 16 tokens); heads of
# 32 with half of them rotary, M-RoPE's sections over that half as GLM-4.1V's [8, 12, 12] over 64
# (32,064 vocabulary rows, as the families' tables pad LLaMA's: the legacy readouts' fixed ids
# are rows)
SIZES = {"tiny": dict(
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, image_size=56,
                patch_size=14, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=2048, vocab_size=32064,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                               "mrope_section": [2, 3, 3], "partial_rotary_factor": 0.5}),
    pixels=(56 * 56, 112 * 112))}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """Its config, weights, image processor and tokenizer with the chat template; its
    video processor's file is not written (a real checkpoint's holds no more than the
    model_type names)."""
    with quiet_fallback():
        from transformers import Glm4vConfig, Glm4vForConditionalGeneration
        from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

    stand_in_only(tokenizer_dir, __name__)
    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = builtin_chat_tokenizer(SPECIALS, eos="<|endoftext|>", pad="<|endoftext|>",
                                 chat_template=CHAT)
    ids = {name: tok.convert_tokens_to_ids(f"<|{token}|>") for name, token in (
        ("image_token_id", "image"), ("video_token_id", "video"),
        ("image_start_token_id", "begin_of_image"), ("image_end_token_id", "end_of_image"),
        ("video_start_token_id", "begin_of_video"), ("video_end_token_id", "end_of_video"))}
    text = dict(with_vocab(dims["text"], tok), eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    config = Glm4vConfig(vision_config=dims["vision"], text_config=text, **ids)
    low, high = dims["pixels"]
    tok.save_pretrained(str(folder))
    images = Glm4vImageProcessorPil(size={"shortest_edge": low, "longest_edge": high})
    return save_checkpoint(folder, config, Glm4vForConditionalGeneration, images,
                           weights or Weights(**stream))
