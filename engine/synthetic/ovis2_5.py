"""Ovis2.5's random checkpoints (a tiny one): a model the engine has no family for, run by the
transformers backend (a SigLIP-2 NaViT at native resolution whose merged patches are soft tokens of
a visual vocabulary, embedded by a table of its own; a Qwen3 language model)."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (Weights, builtin_chat_tokenizer, checkpoint_folder, save_checkpoint, sized,
               stand_in_only, with_vocab)

# The tokens the processor reads from the tokenizer's named special tokens (Ovis2_5Processor): the
# image's one, which the processor writes between its start and end tokens once per merged patch,
# and the video's. Ovis2.5-hf's tokenizer is on the hub only: the names of its four added boundary
# tokens are stand-ins here.
NAMED = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
         "image_start_token": "<ovis_image_start>", "image_end_token": "<ovis_image_end>",
         "video_start_token": "<ovis_video_start>", "video_end_token": "<ovis_video_end>"}
# the Qwen chat format, the image as its image token alone (the processor adds the boundaries)
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}"
        "<|image_pad|>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# 16-px patches merged 2 x 2 within 4,096-16,384 pixels (a test image: 6 to 16 tokens); a visual
# vocabulary of 64 (32,064 vocabulary rows, as the families' tables pad LLaMA's: the legacy
# readouts' fixed ids are rows)
SIZES = {"tiny": dict(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                patch_size=16, spatial_merge_size=2, image_size=128, vocab_size=64),
    text=dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=32,
              max_position_embeddings=2048, vocab_size=32064),
    pixels=(64 * 64, 128 * 128))}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """Its config, weights, image processor and tokenizer with the chat template; its
    video processor's file is not written (a real checkpoint's holds no more than the
    model_type names)."""
    with quiet_fallback():
        from transformers import Ovis2_5Config, Ovis2_5ForConditionalGeneration
        from transformers.models.ovis2_5.image_processing_pil_ovis2_5 import (
            Ovis2_5ImageProcessorPil)

    stand_in_only(tokenizer_dir, __name__)
    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = builtin_chat_tokenizer(["<|im_start|>", *NAMED.values()], eos="<|im_end|>",
                                 pad="<|endoftext|>", chat_template=CHAT, named=NAMED)
    ids = {f"{name}_id": tok.convert_tokens_to_ids(token) for name, token in NAMED.items()}
    text = dict(with_vocab(dims["text"], tok), eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    config = Ovis2_5Config(vision_config=dims["vision"], text_config=text, **ids)
    low, high = dims["pixels"]
    tok.save_pretrained(str(folder))
    images = Ovis2_5ImageProcessorPil(size={"shortest_edge": low, "longest_edge": high})
    return save_checkpoint(folder, config, Ovis2_5ForConditionalGeneration, images,
                           weights or Weights(**stream))
