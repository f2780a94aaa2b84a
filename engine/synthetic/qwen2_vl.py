"""Qwen2-VL's random checkpoints (Qwen2-VL-7B-Instruct's shape and the tiny one), the writer
Qwen2.5-VL and Qwen3-VL share, and the stand-in tokenizer of the Qwen2 chat format."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from ..models.qwen2_vl import IMAGE_PAD, Qwen2VLModel
from . import COCO_CATEGORIES, Weights, checkpoint_folder, save_checkpoint, sized, with_vocab

# Qwen2-VL-7B-Instruct: a 32-block, 1280-wide native-resolution ViT merging 2 x 2 patches (a COCO
# image: 391 tokens under the processor's default pixel budget), Qwen2-7B with M-RoPE.
SIZES = {
    "7b": dict(vision=dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16, mlp_ratio=4),
               text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                         rms_norm_eps=1e-6,
                         max_position_embeddings=32768, rope_theta=1e6,
                         rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})),
    "tiny": dict(vision=dict(depth=2, embed_dim=64, hidden_size=128, num_heads=4, mlp_ratio=2),
                 text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=152064,
                           rms_norm_eps=1e-6,
                           max_position_embeddings=32768, rope_theta=1e6,
                           rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})),
}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", **kwargs) -> Path:
    """A random-weight Qwen2-VL checkpoint (write_family_checkpoint)."""
    return write_family_checkpoint(Qwen2VLModel, SIZES, folder, dims, **kwargs)


def write_family_checkpoint(family, sizes: dict, folder: Path, dims: str | dict = "tiny", *,
                            tokenizer_dir: Path | None = None, weights: Weights | None = None,
                            **stream) -> Path:
    """A random-weight checkpoint of a Qwen2-VL-like family (the processor's default pixel budget
    unless dims' `processor` says otherwise); the tokenizer is tokenizer_dir's when it has
    Qwen2-VL's image pad, else the built-in one."""
    with quiet_fallback():  # the processor classes' torchvision notice
        from transformers import AutoTokenizer, Qwen2VLImageProcessor
    config_class, model_class, _ = family.transformers_classes()

    dims, folder = sized(sizes, dims), checkpoint_folder(folder)
    tok = (AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True) if tokenizer_dir
           else None)
    if tok is None or tok.convert_tokens_to_ids(IMAGE_PAD) in (None, tok.unk_token_id):
        tok = builtin_qwen2_tokenizer(folder)
    special = {t: tok.convert_tokens_to_ids(t)
               for t in (IMAGE_PAD, "<|vision_start|>", "<|vision_end|>")}
    text = dict(with_vocab(dims["text"], tok), bos_token_id=None,
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    vision = dict(dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
                  **dims["vision"])
    config = config_class(text_config=text, vision_config=vision,
                          image_token_id=special[IMAGE_PAD],
                          vision_start_token_id=special["<|vision_start|>"],
                          vision_end_token_id=special["<|vision_end|>"], tie_word_embeddings=False)
    tok.save_pretrained(str(folder))
    # Saved apart: Qwen2VLProcessor also wants a video processor, which needs torchvision.
    processor = Qwen2VLImageProcessor(**dims.get("processor", {}))
    return save_checkpoint(folder, config, model_class, processor, weights or Weights(**stream))

QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>"]


def builtin_qwen2_tokenizer(folder: Path):
    """A word-level stand-in for Qwen2-VL's tokenizer: its special tokens, its chat template's
    shape, no BOS, for machines without the real one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {w for c in COCO_CATEGORIES for w in c.split()} | set(
        "system user assistant You are a helpful . ? Answer answer yes no Yes No only or Is is "
        "there in the image an".split())
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(sorted(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.add_tokens(QWEN2_SPECIALS, special_tokens=True)
    fast.pad_token, fast.eos_token = "<|endoftext|>", "<|im_end|>"
    fast.chat_template = QWEN2_CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return fast
