"""Gemma 4's random checkpoints (the seed size and the tiny one), the writer, and the stand-in
tokenizer with its chat template.

What could not be checked here (no hub access; the tokenizer and config.json of the published
checkpoints are not in ../shared): the "7b" entry is transformers 5.25's Gemma4TextConfig /
Gemma4VisionConfig defaults, which its docstrings name google/gemma-4-e2b-it, not a copy of that
checkpoint's config.json; the special tokens' strings (<|image>, <image|>, <|image|>, <|turn>,
<turn|>) and the turn ids 105 / 106 are Gemma 4's as recalled, the image ids (<|image> 255999,
<image|> 258882, <|image|> 258880, audio 258881, video 258884) Gemma4Config's defaults, the
vocabulary 262,144 Gemma4TextConfig's; the stand-in chat template renders one turn as
"<|turn>user\\n...<turn|>\\n" and opens "<|turn>model\\n" for the answer, the image as <|image|>
where the message has it. The word-level vocabulary (Yes/No at Gemma 3's 10784 / 3771) stands in for
the real SentencePiece one.
"""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from ..models.gemma4 import BOI, EOI, IMAGE
from . import COCO_CATEGORIES, Weights, checkpoint_folder, save_checkpoint, sized, with_vocab

SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<|turn>": 105, "<turn|>": 106,
            BOI: 255999, "<|audio>": 256000, IMAGE: 258880, "<|audio|>": 258881, EOI: 258882,
            "<audio|>": 258883, "<|video|>": 258884}
VOCAB = 262144

# The tiny stand-ins (the tests'): a 2-layer tower on 4-px patches pooled 2 x 2, at most 70 soft
# tokens an image (the smallest budget the processor takes); five layers sliding, sliding, full,
# sliding, full with the last two KV-shared (layer 3 reads layer 1's K/V, layer 4 layer 2's) and
# twice as wide, full layers of head_dim 32 against the sliding ones' 16 (proportional RoPE on a
# quarter of it), per-layer inputs of width 4, a 24-token window inside every image's run of soft
# tokens (so every prompt outgrows it), the image bidirectional.
VISION_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2,
                   position_embedding_size=160)
TEXT_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, global_head_dim=32, vocab_size=VOCAB,
                 sliding_window=24,
                 layer_types=["sliding_attention", "sliding_attention", "full_attention",
                              "sliding_attention", "full_attention"],
                 num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=4,
                 vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0,
                 use_bidirectional_attention="vision", max_position_embeddings=4096)
PROCESSOR_TINY = dict(patch_size=4, max_soft_tokens=70, pooling_kernel_size=2)

STANDIN_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif c['type'] == 'text' %}{{ c['text'] | trim }}"
    "{% endif %}{% endfor %}{% endif %}{{ '<turn|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %}")

SIZES = {"7b": dict(vision={}, text={}, processor={}),
         "tiny": dict(vision=VISION_TINY, text=TEXT_TINY, processor=PROCESSOR_TINY)}


class _Files:
    """What Gemma4Processor would save, where it cannot be built (its video half needs torchvision):
    the tokenizer (with its chat template) and the image processor."""

    def __init__(self, *parts):
        self.parts = parts

    def save_pretrained(self, folder: str) -> None:
        for part in self.parts:
            part.save_pretrained(folder)


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """A random-weight Gemma 4 checkpoint (image and text, no audio tower; tied embeddings),
    its tokenizer and image processor; the tokenizer is tokenizer_dir's, or the built-in
    word-level stand-in."""
    with quiet_fallback():
        from transformers import (AutoTokenizer, Gemma4Config, Gemma4ForConditionalGeneration,
                                  Gemma4ImageProcessorPil, Gemma4TextConfig, Gemma4VisionConfig)

    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = (AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True) if tokenizer_dir
           else builtin_gemma4_tokenizer(folder))
    text = Gemma4TextConfig(**with_vocab(dims["text"], tok), pad_token_id=tok.pad_token_id,
                            bos_token_id=tok.bos_token_id,
                            eos_token_id=[tok.eos_token_id, tok.convert_tokens_to_ids("<eos>")])
    config = Gemma4Config(text_config=text, vision_config=Gemma4VisionConfig(**dims["vision"]),
                          audio_config=None, boi_token_id=tok.convert_tokens_to_ids(BOI),
                          eoi_token_id=tok.convert_tokens_to_ids(EOI),
                          image_token_id=tok.convert_tokens_to_ids(IMAGE), **dims.get("config", {}))
    image_processor = Gemma4ImageProcessorPil(**dims["processor"])
    return save_checkpoint(folder, config, Gemma4ForConditionalGeneration,
                           _Files(tok, image_processor), weights or Weights(**stream))


def builtin_gemma4_tokenizer(folder: Path):
    """A word-level stand-in at Gemma 4's special-token ids (SPECIALS) and Yes 10784 / No 3771, the
    other rows placeholders (see the module docstring for what is unchecked)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    fixed = {"Yes": 10784, "No": 3771}
    words = sorted({w for c in COCO_CATEGORIES for w in c.split()} | set(
        "user model : ? . , Answer answer yes no only or the question using a an single word "
        "phrase Is is there There in image not A You are helpful assistant The".split())
        - set(fixed))
    vocab = {**SPECIALS, **fixed}
    taken = set(vocab.values())
    free = (i for i in range(VOCAB) if i not in taken)
    vocab.update({w: next(free) for w in words})
    taken = set(vocab.values())
    vocab.update({f"<unused{i}>": i for i in range(VOCAB) if i not in taken})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<turn|>",
                                   unk_token="<unk>", pad_token="<pad>",
                                   extra_special_tokens={"boi_token": BOI, "eoi_token": EOI,
                                                         "image_token": IMAGE})
    fast.add_special_tokens({"additional_special_tokens": [t for t in SPECIALS if t not in (
        "<pad>", "<bos>", "<unk>", "<turn|>")]})
    fast.chat_template = STANDIN_CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return fast
