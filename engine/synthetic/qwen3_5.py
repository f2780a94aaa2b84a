"""Qwen3.5's random checkpoints (Qwen3.5-9B's shape and the tiny one) and the stand-in tokenizer.

No Qwen3.5 tokenizer is in ../shared, and this machine has no hub, so the stand-in is word-level,
built from what could be read: transformers 5.25's Qwen3_5Config (vocabulary 248,320;
<|vision_start|> 248053, <|vision_end|> 248054, <|image_pad|> 248056, <|video_pad|> 248057) and the
published chat templates and token ids as public copies of them give them (goinfer's
testdata/chat_think_goldens/think_modes.json, rendered from Qwen3.5-0.8B's and -9B's tokenizers:
<|im_start|> 248045, <|im_end|> 248046, <think> 248068, </think> 248069; no default system message;
after the assistant's turn "<think>\\n\\n</think>\\n\\n" with enable_thinking=False, "<think>\\n"
otherwise on the 9B, whose default is thinking and whose template the stand-in's follows). Not
checked here: <|endoftext|>'s id (248044, the id before <|im_start|> as Qwen2's and Qwen3's
vocabularies place it), the ordinary words' ids (the real BPE's are not known; newlines, ids 198 and
271 there, are dropped by the stand-in), and the tool-call part of the template (left out: a POPE
prompt has no tools).
"""
from __future__ import annotations

from pathlib import Path

from ..models.qwen3_5 import Qwen3_5Model
from ..utils.loader import quiet_fallback
from . import COCO_CATEGORIES, Weights, checkpoint_folder, save_checkpoint, sized, with_vocab

VOCAB_SIZE = 248320
SPECIAL_IDS = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046,
               "<|vision_start|>": 248053, "<|vision_end|>": 248054, "<|image_pad|>": 248056,
               "<|video_pad|>": 248057, "<think>": 248068, "</think>": 248069}

# Qwen3.5-9B's chat template as it renders a conversation without tools: the 9B opens a <think>
# block unless enable_thinking is false
CHAT_TEMPLATE = (
    "{%- for message in messages %}{%- if message['content'] is string %}"
    "{%- set content = message['content'] %}"
    "{%- else %}{%- set content = namespace(text='') %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}"
    "{%- set content.text = content.text + '<|vision_start|><|image_pad|><|vision_end|>' %}"
    "{%- elif item['type'] == 'text' %}{%- set content.text = content.text + item['text'] %}"
    "{%- endif %}{%- endfor %}{%- set content = content.text %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}")

# The processor of Qwen3-VL's preprocessor_config.json, which Qwen3.5's repeats (16-px patches,
# 2 x 2 merging).
PROCESSOR = dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                 image_std=[0.5] * 3, min_pixels=65536, max_pixels=16777216)

# "7b" (the tables' name for the seed size) is Qwen3.5-9B as transformers' Qwen3_5Config defaults
# give it (its docstring: "Qwen3.5-9B style"); the published config.json was not read here.
SIZES = {
    "7b": dict(vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                           out_hidden_size=4096, patch_size=16, num_position_embeddings=2304,
                           hidden_act="gelu_pytorch_tanh"),
               text=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=256,
                         vocab_size=VOCAB_SIZE, rms_norm_eps=1e-6, max_position_embeddings=262144,
                         linear_conv_kernel_dim=4, linear_key_head_dim=128,
                         linear_value_head_dim=128, linear_num_key_heads=16,
                         linear_num_value_heads=32,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                          "partial_rotary_factor": 0.25,
                                          "mrope_section": [11, 11, 10],
                                          "mrope_interleaved": True}),
               processor=PROCESSOR),
    # linear, full, linear: both kinds, a DeltaNet layer last; 4 value heads on 2 key heads
    # (grouped)
    "tiny": dict(vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                             out_hidden_size=32, patch_size=16, num_position_embeddings=16,
                             hidden_act="gelu_pytorch_tanh"),
                 text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                           vocab_size=VOCAB_SIZE, rms_norm_eps=1e-6, max_position_embeddings=4096,
                           linear_conv_kernel_dim=4, linear_key_head_dim=16,
                           linear_value_head_dim=16, linear_num_key_heads=2,
                           linear_num_value_heads=4,
                           layer_types=["linear_attention", "full_attention", "linear_attention"],
                           rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                            "partial_rotary_factor": 0.25,
                                            "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
                 processor=dict(PROCESSOR, min_pixels=4 * 32 * 32, max_pixels=30 * 32 * 32)),
}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", **kwargs) -> Path:
    """A random-weight Qwen3.5 checkpoint (write_family_checkpoint)."""
    return write_family_checkpoint(Qwen3_5Model, SIZES, folder, dims, **kwargs)


def write_family_checkpoint(family, sizes: dict, folder: Path, dims: str | dict = "tiny", *,
                            tokenizer_dir: Path | None = None, weights: Weights | None = None,
                            **stream) -> Path:
    """A random-weight checkpoint of Qwen3.5 or a family built on it, of `sizes`' shapes; the
    tokenizer is tokenizer_dir's, else the stand-in."""
    with quiet_fallback():  # the processor classes' torchvision notice
        from transformers import AutoTokenizer, Qwen2VLImageProcessor
    config_class, model_class, _ = family.transformers_classes()
    dims, folder = sized(sizes, dims), checkpoint_folder(folder)
    tok = (AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True) if tokenizer_dir
           else builtin_tokenizer(folder))
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>",
                                                      "<|vision_start|>", "<|vision_end|>",
                                                      "<|im_end|>")}
    text = dict(with_vocab(dims["text"], tok), bos_token_id=None, eos_token_id=ids["<|im_end|>"])
    vision = dict(dict(spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
                  **dims["vision"])
    config = config_class(text_config=text, vision_config=vision,
                          image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                          vision_start_token_id=ids["<|vision_start|>"],
                          vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    tok.save_pretrained(str(folder))
    # saved apart: Qwen3VLProcessor also wants a video processor, which needs torchvision
    processor = Qwen2VLImageProcessor(**dims.get("processor", {}))
    return save_checkpoint(folder, config, model_class, processor, weights or Weights(**stream))


def builtin_tokenizer(folder: Path):
    """A word-level stand-in for Qwen3.5's tokenizer: its special tokens at their ids, a word for
    every other id of its 248,320, the 9B's chat template (module docstring), no BOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {w for c in COCO_CATEGORIES for w in c.split()} | set(
        "system user assistant You are a helpful . ? Answer answer yes no Yes No only or Is is "
        "there in the image an".split())
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(sorted(words))}}
    # every other id a word of its own ("w1234"), so that whatever a random model generates decodes
    # to text that tells its ids apart (a continuation compared as text is compared token for token)
    taken = set(vocab.values()) | set(SPECIAL_IDS.values())
    vocab.update({f"w{i}": i for i in range(VOCAB_SIZE) if i not in taken}, **SPECIAL_IDS)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": list(SPECIAL_IDS)})
    fast.pad_token, fast.eos_token = "<|endoftext|>", "<|im_end|>"
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return fast
