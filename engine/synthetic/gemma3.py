"""Gemma 3's random checkpoints (Gemma-3-4B-it's shape and the tiny one), the writer, and the
stand-in tokenizer at Gemma's special-token ids with its chat template."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from ..models.gemma3 import BOI, EOI, IMAGE
from . import COCO_CATEGORIES, Weights, checkpoint_folder, save_checkpoint, sized, with_vocab

# gemma-3-4b-it ("7b" is the table's name for the seed size): SigLIP so400m at 896 px without its
# head, Gemma 3 4B.
SIGLIP_896 = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                  num_attention_heads=16, image_size=896, patch_size=14, vision_use_head=False,
                  layer_norm_eps=1e-6)

GEMMA3_4B = dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                 query_pre_attn_scalar=256, vocab_size=262208, rms_norm_eps=1e-6,
                 sliding_window=1024, sliding_window_pattern=6, max_position_embeddings=131072,
                 rope_parameters={"sliding_attention": {"rope_type": "default",
                                                        "rope_theta": 10000.0},
                                  "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                     "rope_theta": 1e6}})

# The tiny stand-ins (the tests'): 64-px images of 8 x 8 patches pooled to 4 x 4 = 16 tokens; four
# layers, local, local, global (linearly scaled RoPE), local, with a window longer than any test
# prompt; head_dim 32 against a query_pre_attn_scalar of 24, so that a wrong attention scale shows.
# The bench's `tiny` size keeps the real image: 896 px, 64 x 64 patches pooled to 256 tokens.
SIGLIP_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   image_size=64, patch_size=8, vision_use_head=False, layer_norm_eps=1e-6)

GEMMA3_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   query_pre_attn_scalar=24, vocab_size=262208, rms_norm_eps=1e-6,
                   sliding_window=512, max_position_embeddings=4096,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                "sliding_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                       "rope_theta": 1e6}})

# The built-in stand-in tokenizer's chat template: Gemma's turn format (a system text opens the
# first user turn, followed by a blank line; the image as <start_of_image>; the model's turn opened
# for the answer).
STANDIN_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set prefix = '' %}{% set turns = messages %}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'][0]['text'] + '\n\n' %}"
    "{% set turns = messages[1:] %}{% endif %}"
    "{% for m in turns %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{% if loop.first %}{{ prefix }}{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif c['type'] == 'text' %}{{ c['text'] | trim }}"
    "{% endif %}{% endfor %}{% endif %}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")

SIZES = {"7b": dict(vision=SIGLIP_896, text=GEMMA3_4B, mm_tokens=256),
         "tiny": dict(vision=dict(SIGLIP_TINY, image_size=896, patch_size=14), text=GEMMA3_TINY,
                      mm_tokens=256)}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     weights: Weights | None = None, **stream) -> Path:
    """A random-weight Gemma 3 checkpoint: SigLIP, the projector, Gemma 3's language model (tied
    embeddings), Gemma3Processor's files; the tokenizer is tokenizer_dir's (the real one, whose
    terms forbid bundling it) or a built-in word-level stand-in with Gemma's special-token ids."""
    with quiet_fallback():
        from transformers import (AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration,
                                  Gemma3ImageProcessorPil, Gemma3Processor, Gemma3TextConfig,
                                  SiglipVisionConfig)

    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = (AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True) if tokenizer_dir
           else builtin_gemma_tokenizer(folder))
    text = Gemma3TextConfig(**with_vocab(dims["text"], tok), pad_token_id=tok.pad_token_id,
                            bos_token_id=tok.bos_token_id,
                            eos_token_id=[tok.eos_token_id, tok.convert_tokens_to_ids("<eos>")])
    config = Gemma3Config(vision_config=SiglipVisionConfig(**dims["vision"]), text_config=text,
                          mm_tokens_per_image=dims["mm_tokens"],
                          boi_token_index=tok.convert_tokens_to_ids(BOI),
                          eoi_token_index=tok.convert_tokens_to_ids(EOI),
                          image_token_index=tok.convert_tokens_to_ids(IMAGE),
                          **dims.get("config", {}))
    size = dims["vision"]["image_size"]
    image_processor = Gemma3ImageProcessorPil(size={"height": size, "width": size},
                                              image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                              do_pan_and_scan=False)
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tok,
                                chat_template=tok.chat_template, image_seq_length=dims["mm_tokens"])
    return save_checkpoint(folder, config, Gemma3ForConditionalGeneration, processor,
                           weights or Weights(**stream))


def builtin_gemma_tokenizer(folder: Path):
    """A word-level stand-in at Gemma 3's special-token ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3,
    <start_of_turn> 105, <end_of_turn> 106, <start_of_image> 255999, <end_of_image> 256000,
    <image_soft_token> 262144) and Gemma's Yes 10784 / No 3771, the other rows placeholders, for
    machines without ../shared."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 105,
                "<end_of_turn>": 106, BOI: 255999, EOI: 256000, IMAGE: 262144}
    fixed = {"Yes": 10784, "No": 3771}
    words = sorted({w for c in COCO_CATEGORIES for w in c.split()} | set(
        "user model : ? . , Answer answer yes no only or the question using a an single word "
        "phrase Is is there There in image not A You are helpful assistant The".split())
        - set(fixed))
    vocab = {**specials, **fixed}
    free = (i for i in range(262145) if i not in set(vocab.values()))
    vocab.update({w: next(free) for w in words})
    taken = set(vocab.values())
    vocab.update({f"<unused{i}>": i for i in range(262145) if i not in taken})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>",
                                   eos_token="<end_of_turn>", unk_token="<unk>", pad_token="<pad>",
                                   extra_special_tokens={"boi_token": BOI, "eoi_token": EOI,
                                                         "image_token": IMAGE})
    fast.add_special_tokens({"additional_special_tokens": ["<eos>", "<start_of_turn>", BOI, EOI,
                                                           IMAGE]})
    fast.chat_template = STANDIN_CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return fast
