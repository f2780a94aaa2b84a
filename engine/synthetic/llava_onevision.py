"""LLaVA-OneVision's random checkpoints (LLaVA-OneVision-Qwen2-7B-OV's shape and the tiny one), the
writer, and the stand-in tokenizer's chat template."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from ..models.llava_onevision import IMAGE
from . import Weights, checkpoint_folder, save_checkpoint, sized, with_vocab
from .qwen2_vl import builtin_qwen2_tokenizer

# llava-hf's processor template (chat_template.json): images first, then "\n" + text, no newline
# after <|im_end|>.
ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\n' + content['text'] }}"
    "{% endfor %}{{'<|im_end|>'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# SigLIP so400m-patch14-384 as OneVision cuts it (26 layers, no head), and a tiny tower at the
# real image size.
SIGLIP_384 = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=26,
                  num_attention_heads=16, image_size=384, patch_size=14, vision_use_head=False)

SIGLIP_TINY_384 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, image_size=384, patch_size=14, vision_use_head=False)

# Qwen2-7B-Instruct, and its tiny stand-in.
QWEN2_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6,
                max_position_embeddings=32768, rope_theta=1e6)

QWEN2_TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=152064,
                  rms_norm_eps=1e-6, max_position_embeddings=32768, rope_theta=1e6)

# The checkpoints' pinpoints: 384-px crops in grids of 1 x 1 up to 6 x 6.
ONEVISION_PINPOINTS = [[384 * r, 384 * c] for r in range(1, 7) for c in range(1, 7)]

SIZES = {"7b": dict(vision=SIGLIP_384, text=QWEN2_7B),
         "tiny": dict(vision=SIGLIP_TINY_384, text=QWEN2_TINY)}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """A random-weight llava-hf OneVision checkpoint: a SigLIP tower, a Qwen2 language model,
    anyres pinpoints (dims' `pinpoints`, default the checkpoints' 384-px ones), the image processor
    and the tokenizer (tokenizer_dir's where it has <image>, else a built-in stand-in with
    OneVision's template)."""
    with quiet_fallback():  # the processor classes' torchvision notice
        from transformers import (AutoTokenizer, LlavaOnevisionConfig,
                                  LlavaOnevisionForConditionalGeneration,
                                  LlavaOnevisionImageProcessor, Qwen2Config, SiglipVisionConfig)

    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = (AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True) if tokenizer_dir
           else None)
    if tok is None or tok.convert_tokens_to_ids(IMAGE) in (None, tok.unk_token_id):
        tok = builtin_qwen2_tokenizer(folder)
        tok.add_tokens([IMAGE, "<video>"], special_tokens=True)
        tok.chat_template = ONEVISION_CHAT_TEMPLATE
    tok.save_pretrained(str(folder))
    pinpoints = dims.get("pinpoints", ONEVISION_PINPOINTS)
    text = Qwen2Config(**with_vocab(dims["text"], tok), bos_token_id=None,
                       eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                       pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    config = LlavaOnevisionConfig(vision_config=SiglipVisionConfig(**dims["vision"]),
                                  text_config=text,
                                  image_token_index=tok.convert_tokens_to_ids(IMAGE),
                                  video_token_index=tok.convert_tokens_to_ids("<video>"),
                                  image_grid_pinpoints=pinpoints,
                                  vision_feature_select_strategy="full", vision_feature_layer=-1,
                                  **dims.get("config", {}))
    size = dims["vision"]["image_size"]
    processor = LlavaOnevisionImageProcessor(size={"height": size, "width": size},
                                             image_grid_pinpoints=pinpoints)
    return save_checkpoint(folder, config, LlavaOnevisionForConditionalGeneration, processor,
                           weights or Weights(**stream))
