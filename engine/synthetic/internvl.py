"""InternVL3's random checkpoints (InternVL3-8B-hf's shape and the tiny one), the writer, and the
stand-in tokenizer's chat template."""
from __future__ import annotations

import json
from pathlib import Path

from ..utils.loader import quiet_fallback
from ..models.internvl import CONTEXT, END, IMAGENET_MEAN, IMAGENET_STD, START
from . import Weights, checkpoint_folder, save_checkpoint, sized, with_vocab
from .llava_onevision import QWEN2_7B, QWEN2_TINY
from .qwen2_vl import builtin_qwen2_tokenizer

# transformers' convert_internvl_weights_to_hf.py chat template (images as '<IMG_CONTEXT>\n',
# no default system).
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\n' }}{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}")

# InternViT-300M-448px-V2.5 (InternVL3-8B's tower), and a tiny tower at the real tile size.
INTERNVIT_300M = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                      num_attention_heads=16, image_size=448, patch_size=14, norm_type="layer_norm",
                      use_qk_norm=False, use_mean_pooling=True, layer_norm_eps=1e-6,
                      attention_bias=True)

INTERNVIT_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, image_size=448, patch_size=14, norm_type="layer_norm",
                      use_qk_norm=False, use_mean_pooling=True, layer_norm_eps=1e-6,
                      attention_bias=True)

# Qwen2.5-7B as InternVL3-8B-hf carries it (its vocabulary: Qwen2.5's 151,665 + InternVL's nine
# tokens).
QWEN2_5_7B = {**QWEN2_7B, "vocab_size": 151674}
NAMED = {"start_image_token": START, "end_image_token": END, "context_image_token": CONTEXT,
         "video_token": "<video>"}

SIZES = {"7b": dict(vision=INTERNVIT_300M, text=QWEN2_5_7B),
         "tiny": dict(vision=INTERNVIT_TINY, text=QWEN2_TINY)}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """A random-weight InternVL3-hf checkpoint: an InternViT tower, a Qwen2 language model (dims'
    text model_type "qwen3": InternVL3.5-hf's layout, which the engine's family does not implement),
    the image processor (dims' `max_patches`, default 12) and the tokenizer (tokenizer_dir's where
    it has <IMG_CONTEXT>, else a built-in stand-in with InternVL's template)."""
    with quiet_fallback():  # the processor classes' torchvision notice
        from transformers import (CONFIG_MAPPING, AutoTokenizer, GotOcr2ImageProcessorPil,
                                  InternVLConfig, InternVLForConditionalGeneration,
                                  InternVLVisionConfig)

    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = (AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True) if tokenizer_dir
           else None)
    if tok is None or tok.convert_tokens_to_ids(CONTEXT) in (None, tok.unk_token_id):
        tok = builtin_qwen2_tokenizer(folder)
        tok.add_tokens([START, END, CONTEXT], special_tokens=True)
        tok.chat_template = INTERNVL_CHAT_TEMPLATE
        tok.save_pretrained(str(folder))
        # the named tokens InternVLProcessor reads, as InternVL3-8B-hf's tokenizer_config.json
        # names them
        tok = AutoTokenizer.from_pretrained(str(folder), extra_special_tokens=NAMED)
    tok.save_pretrained(str(folder))
    vision = InternVLVisionConfig(**dims["vision"])
    tied = dims.get("config", {}).get("tie_word_embeddings", False)
    # InternVL3's language model is Qwen2.5 (Qwen2's class), InternVL3.5-hf's Qwen3: dims'
    # text model_type says
    text = dict(with_vocab(dims["text"], tok))
    text = CONFIG_MAPPING[text.pop("model_type", "qwen2")](
        **text, bos_token_id=None, tie_word_embeddings=tied,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    side = vision.image_size[0] // vision.patch_size[0]
    config = InternVLConfig(vision_config=vision, text_config=text,
                            image_token_id=tok.convert_tokens_to_ids(CONTEXT),
                            image_seq_length=(side // 2) ** 2, downsample_ratio=0.5,
                            vision_feature_select_strategy="default",
                            **{"tie_word_embeddings": False, "vision_feature_layer": -1,
                               **dims.get("config", {})})
    size = vision.image_size[0]
    processor = GotOcr2ImageProcessorPil(size={"height": size, "width": size},
                                         crop_to_patches=False, min_patches=1,
                                         max_patches=dims.get("max_patches", 12),
                                         image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
    save_checkpoint(folder, config, InternVLForConditionalGeneration, processor,
                    weights or Weights(**stream))
    # what InternVLProcessor.save_pretrained writes beside its parts: its context tokens per
    # tile (256 unless said)
    (folder / "processor_config.json").write_text(json.dumps(
        {"processor_class": "InternVLProcessor", "image_seq_length": config.image_seq_length},
        indent=2))
    return folder
