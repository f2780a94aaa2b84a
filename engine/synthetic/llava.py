"""LLaVA-1.5's random checkpoints: their shapes (the seed model's and the tiny one) and the writer;
and llava-interleave's kind, a llava checkpoint the engine's family does not fit."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (LLAMA_7B, LLAMA_TINY, Weights, builtin_chat_tokenizer, checkpoint_folder,
               save_checkpoint, sized, tokenizer_for, with_vocab)

# CLIP ViT-L/14 at 336 px (577 tokens, 576 after dropping CLS), and the tiny tower of the random
# checkpoints: small widths, the real image, so prefixes are as long as the real ones.
CLIP_L_336 = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                  num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768)

CLIP_TINY_336 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, image_size=336, patch_size=14, projection_dim=64)

SIZES = {"7b": dict(vision=CLIP_L_336, text=LLAMA_7B),
         "tiny": dict(vision=CLIP_TINY_336, text=LLAMA_TINY)}


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
                         text_config=LlamaConfig(**with_vocab(dims["text"], tok), bos_token_id=1,
                                                 eos_token_id=2),
                         image_token_index=tok.convert_tokens_to_ids("<image>"),
                         pad_token_id=tok.pad_token_id, **dims.get("config", {}))
    size = dims["vision"]["image_size"]
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": size},
                                           crop_size={"height": size, "width": size}),
        tokenizer=tok, patch_size=dims["vision"]["patch_size"],
        vision_feature_select_strategy="default", num_additional_image_tokens=1)
    return save_checkpoint(folder, config, LlavaForConditionalGeneration, processor,
                           weights or Weights(**stream))


# llava-interleave's kind (llava-hf/llava-interleave-qwen-*): a llava checkpoint of a Qwen2 language
# model and a SigLIP tower, which the engine's LLaVA-1.5 does not implement and the transformers
# backend runs; tiny, on a stand-in tokenizer with a chat template of its shape
# ("USER: <image>\n{question} ASSISTANT:").
INTERLEAVE_TINY = dict(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                image_size=56, patch_size=14),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=2048, vocab_size=32064))
INTERLEAVE_CHAT = (
    "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['role'] | upper }}: {% endif %}"
    "{% for c in m['content'] if c['type'] == 'image' %}<image>\n{% endfor %}"
    "{% for c in m['content'] if c['type'] == 'text' %}{{ c['text'] }} {% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def write_interleave_checkpoint(folder: Path, *, weights: Weights | None = None, **stream) -> Path:
    """A random-weight llava checkpoint of llava-interleave's kind (Qwen2 and SigLIP inside), with
    its processor and chat template."""
    with quiet_fallback():  # the processor classes' torchvision notice
        from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor, \
            Qwen2Config, SiglipImageProcessor, SiglipVisionConfig

    dims, folder = INTERLEAVE_TINY, checkpoint_folder(folder)
    tok = builtin_chat_tokenizer(["<image>"], eos="<|im_end|>", pad="<|endoftext|>",
                                 chat_template=INTERLEAVE_CHAT)
    text = Qwen2Config(**with_vocab(dims["text"], tok), eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)
    config = LlavaConfig(vision_config=SiglipVisionConfig(**dims["vision"]), text_config=text,
                         image_token_index=tok.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="full", vision_feature_layer=-1)
    size = dims["vision"]["image_size"]
    image_processor = SiglipImageProcessor(size={"height": size, "width": size})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok,
                               patch_size=dims["vision"]["patch_size"],
                               vision_feature_select_strategy="full", num_additional_image_tokens=0,
                               chat_template=INTERLEAVE_CHAT)
    return save_checkpoint(folder, config, LlavaForConditionalGeneration, processor,
                           weights or Weights(**stream))
