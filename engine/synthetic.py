"""Built-in models and data, so the main job and the benchmark run on a fresh machine with nothing
downloaded: random-weight checkpoints at tiny or real (7B) dimensions in the llava-hf layout,
deterministic synthetic images, and POPE-shaped question sets."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..readout import Question

COCO_CATEGORIES = tuple(w.replace("_", " ") for w in (
    "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant stop_sign "
    "parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe backpack umbrella handbag tie "
    "suitcase frisbee skis snowboard sports_ball kite baseball_bat baseball_glove skateboard surfboard "
    "tennis_racket bottle wine_glass cup fork knife spoon bowl banana apple sandwich orange broccoli carrot "
    "hot_dog pizza donut cake chair couch potted_plant bed dining_table toilet tv laptop mouse remote keyboard "
    "cell_phone microwave oven toaster sink refrigerator book clock vase scissors teddy_bear hair_drier toothbrush"
).split())

# LLaVA-1.5-7B: CLIP ViT-L/14 at 336 px (577 tokens, 576 after dropping CLS) and Vicuna-7B.
LLAVA_DIMS = {
    "7b": dict(vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                           image_size=336, patch_size=14, projection_dim=768),
               text=dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=32, vocab_size=32064, rms_norm_eps=1e-5, max_position_embeddings=4096)),
    # Small widths, the real image: 576 image tokens, so prefixes are as long as the real ones.
    "tiny": dict(vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             image_size=336, patch_size=14, projection_dim=64),
                 text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4, vocab_size=32064, rms_norm_eps=1e-5, max_position_embeddings=4096)),
}


# LLaVA-1.6-Mistral-7B: LLaVA-1.5's CLIP ViT-L/14-336 over anyres crops, and Mistral-7B-Instruct-v0.2.
LLAVA_NEXT_DIMS = {
    "7b": dict(vision=LLAVA_DIMS["7b"]["vision"],
               text=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32064, rms_norm_eps=1e-5, max_position_embeddings=32768,
                         rope_theta=1e6, sliding_window=None)),
    "tiny": dict(vision=LLAVA_DIMS["tiny"]["vision"],
                 text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=32064, rms_norm_eps=1e-5, max_position_embeddings=32768,
                           rope_theta=1e6, sliding_window=None)),
}
# InstructBLIP-Vicuna-7B: EVA ViT-g/14 at 224 px (257 tokens), a BERT-base Q-Former with 32 queries, Vicuna-7B.
INSTRUCTBLIP_DIMS = {
    "7b": dict(vision=dict(hidden_size=1408, intermediate_size=6144, num_hidden_layers=39, num_attention_heads=16,
                           image_size=224, patch_size=14),
               qformer=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                            encoder_hidden_size=1408),
               text=dict(LLAVA_DIMS["7b"]["text"], vocab_size=32001), queries=32),
    "tiny": dict(vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             image_size=224, patch_size=14),
                 qformer=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              encoder_hidden_size=64),
                 text=dict(LLAVA_DIMS["tiny"]["text"]), queries=32),
}
# Qwen2-VL-7B-Instruct: a 32-block, 1280-wide native-resolution ViT merging 2 x 2 patches (a COCO
# image: 391 tokens under the processor's default pixel budget), Qwen2-7B with M-RoPE.
QWEN2_VL_DIMS = {
    "7b": dict(vision=dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16, mlp_ratio=4),
               text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                         num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6,
                         max_position_embeddings=32768, rope_theta=1e6,
                         rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})),
    "tiny": dict(vision=dict(depth=2, embed_dim=64, hidden_size=128, num_heads=4, mlp_ratio=2),
                 text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=152064, rms_norm_eps=1e-6,
                           max_position_embeddings=32768, rope_theta=1e6,
                           rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})),
}
ANYRES_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
# mPLUG-Owl2-LLaMA2-7B: a ViT-L/14 at 448 px (1,025 tokens), a 6-layer visual abstractor of 64 queries,
# LLaMA-2-7B with multiway k/v projections and norms; 65 image tokens either way.
MPLUG_OWL2_DIMS = {
    "7b": dict(vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                           image_size=448, patch_size=14),
               abstractor=dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=6, num_attention_heads=16,
                               encoder_hidden_size=1024, grid_size=32, num_learnable_queries=64),
               text=dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=32, vocab_size=32000, rms_norm_eps=1e-5, max_position_embeddings=4096)),
    "tiny": dict(vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             image_size=448, patch_size=14),
                 abstractor=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 encoder_hidden_size=64, grid_size=32, num_learnable_queries=64),
                 text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4, vocab_size=32000, rms_norm_eps=1e-5, max_position_embeddings=4096)),
}


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def synthetic_image(seed: int, size: tuple[int, int] = (640, 480)) -> Image.Image:
    """A deterministic RGB image with structure (gradients and noise), sized like a COCO photo."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (seed % 7 + 1)) % 256, (y * 3 + seed * 17) % 256, ((x + y) * 2) % 256], axis=-1)
    noise = rng.integers(0, 60, size=(h, w, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def image_for_name(name: str) -> Image.Image:
    """The synthetic stand-in for an image file name (e.g. a COCO name from a POPE file)."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    sizes = ((640, 480), (480, 640), (640, 427), (500, 375))
    return synthetic_image(seed, sizes[seed % len(sizes)])


def write_images(folder: Path, names) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(names):
        if not (folder / name).is_file():
            image_for_name(name).save(folder / name, format="PNG" if name.endswith(".png") else "JPEG", quality=90)
    return folder


def builtin_questions(n_questions: int, split: str = "synthetic") -> list[Question]:
    """POPE-shaped: n/6 images × 6 questions 'Is there a/an <COCO category> in the image?', alternating yes/no."""
    questions = []
    for i in range(n_questions):
        image, j = divmod(i, 6)
        category = COCO_CATEGORIES[(image * 7 + j * 13) % len(COCO_CATEGORIES)]
        questions.append(Question(i + 1, f"synthetic_{image:05d}.jpg",
                                  f"Is there {article(category)} {category} in the image?",
                                  "yes" if j % 2 == 0 else "no", split))
    return questions


def write_question_file(path: Path, questions: list[Question]) -> Path:
    path.write_text("".join(json.dumps({"question_id": q.question_id, "image": q.image, "text": q.text,
                                        "label": q.label}) + "\n" for q in questions))
    return path


def builtin_tokenizer(folder: Path):
    """A word-level LLaMA-like tokenizer (<unk>=0, <s>=1, </s>=2, words, then <image>, <pad>) built with
    the `tokenizers` library, for machines without a real tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {w for c in COCO_CATEGORIES for w in c.split()} | set(
        "USER ASSISTANT : ? . , Answer answer yes no Yes No only or the question using a an single word phrase "
        "Is is there There in image not A chat between curious human and artificial intelligence assistant The "
        "gives helpful detailed polite answers to human's questions".split())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(sorted(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.add_tokens(["<image>"], special_tokens=True)
    fast.add_special_tokens({"pad_token": "<pad>"})
    fast.save_pretrained(str(folder))
    return fast


QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>"]


def builtin_qwen2_tokenizer(folder: Path):
    """A word-level stand-in for Qwen2-VL's tokenizer: its special tokens, its chat template's shape,
    no BOS, for machines without the real one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {w for c in COCO_CATEGORIES for w in c.split()} | set(
        "system user assistant You are a helpful . ? Answer answer yes no Yes No only or Is is there in the "
        "image an".split())
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(sorted(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.add_tokens(QWEN2_SPECIALS, special_tokens=True)
    fast.pad_token, fast.eos_token = "<|endoftext|>", "<|im_end|>"
    fast.chat_template = QWEN2_CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return fast


def builtin_bert_tokenizer(folder: Path):
    """A word-level BERT-like tokenizer ([PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, lowercased
    words) for InstructBLIP's Q-Former on machines without bert-base-uncased."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {w.lower() for c in COCO_CATEGORIES for w in c.split()} | set(
        "question answer yes no only or the is there a an in image ? . : ,".split())
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4,
             **{w: i + 5 for i, w in enumerate(sorted(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                             ("[SEP]", 3)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                                   unk_token="[UNK]", mask_token="[MASK]")
    fast.save_pretrained(str(folder))
    return fast


def _tokenizer(folder: Path, tokenizer_dir: Path | None, builtin=builtin_tokenizer):
    from transformers import AutoTokenizer

    if tokenizer_dir is None:
        return builtin(folder)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tok.save_pretrained(str(folder))
    return tok


def _random_tensor(name: str, shape, std: float, generator: torch.Generator, dtype, device) -> torch.Tensor:
    norm = "norm" in name.lower() or name.endswith("_ln.weight")  # LayerNorm, layrnorm, norm, ffn_ln
    if len(shape) == 1 and norm and name.endswith("weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    if name.endswith("bias"):
        return torch.zeros(shape, dtype=dtype, device=device)
    return (torch.randn(shape, generator=generator, device=device) * std).to(dtype)


@dataclass
class Weights:
    """How a builder fills a checkpoint. "stream" (the demo and bench): random tensors written shard by
    shard, so a 7B checkpoint never sits in memory; norms one, biases zero, the rest N(0, std).
    "model" (the tests): the transformers class built under `seed`, then every parameter whose rank is
    in `spread_ranks` drawn from N(0, std), then `extra` parameters from N(0, their std); saved with
    save_pretrained (generation_config included)."""

    init: str = "stream"
    seed: int = 0
    std: float = 0.02
    dtype: torch.dtype = torch.float16
    device: str = "cpu"
    shard_bytes: int = 2 << 30
    spread_ranks: tuple[int, ...] = (2,)
    extra: dict[str, float] = field(default_factory=dict)


def write_llava_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                           weights: Weights | None = None, **stream) -> Path:
    """A random-weight llava-hf LLaVA-1.5 checkpoint. dims: a LLAVA_DIMS name or a dict of its shape
    (vision, text, and optional top-level `config` kwargs); keyword arguments are Weights fields."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    dims, folder = _dims(LLAVA_DIMS, dims), _folder(folder)
    tok = _tokenizer(folder, tokenizer_dir)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**dims["vision"]),
                         text_config=LlamaConfig(**_vocab(dims["text"], tok), bos_token_id=1, eos_token_id=2),
                         image_token_index=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id,
                         **dims.get("config", {}))
    image_size = dims["vision"]["image_size"]
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": image_size},
                                           crop_size={"height": image_size, "width": image_size}),
        tokenizer=tok, patch_size=dims["vision"]["patch_size"], vision_feature_select_strategy="default",
        num_additional_image_tokens=1)
    return _write(folder, config, LlavaForConditionalGeneration, processor, weights or Weights(**stream))


def write_llava_next_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                                weights: Weights | None = None, **stream) -> Path:
    """A random-weight llava-hf LLaVA-1.6-Mistral checkpoint: LLaVA-1.5's tower, a Mistral language
    model and anyres pinpoints (`tiny`/`7b`: the 336-px ones, a 640 x 480 COCO image is 5 crops,
    2,340 image tokens)."""
    from transformers import (CLIPVisionConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
                              LlavaNextImageProcessor, LlavaNextProcessor, MistralConfig)

    dims, folder = _dims(LLAVA_NEXT_DIMS, dims), _folder(folder)
    tok = _tokenizer(folder, tokenizer_dir)
    pinpoints = dims.get("pinpoints", ANYRES_PINPOINTS)
    config = LlavaNextConfig(vision_config=CLIPVisionConfig(**dims["vision"]),
                             text_config=MistralConfig(**_vocab(dims["text"], tok), bos_token_id=1, eos_token_id=2),
                             image_token_index=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id,
                             image_grid_pinpoints=pinpoints, **dims.get("config", {}))
    image_size = dims["vision"]["image_size"]
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(size={"shortest_edge": image_size},
                                                crop_size={"height": image_size, "width": image_size},
                                                image_grid_pinpoints=pinpoints),
        tokenizer=tok, patch_size=dims["vision"]["patch_size"], vision_feature_select_strategy="default",
        num_additional_image_tokens=1)
    return _write(folder, config, LlavaNextForConditionalGeneration, processor, weights or Weights(**stream))


def write_instructblip_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                                  qformer_tokenizer_dir: Path | None = None, weights: Weights | None = None,
                                  **stream) -> Path:
    """A random-weight InstructBLIP-Vicuna checkpoint; the Q-Former's tokenizer is qformer_tokenizer_dir's
    (bert-base-uncased) or the built-in BERT-like one."""
    from transformers import (BlipImageProcessor, InstructBlipConfig, InstructBlipForConditionalGeneration,
                              InstructBlipProcessor, InstructBlipQFormerConfig, InstructBlipVisionConfig,
                              LlamaConfig)

    dims, folder = _dims(INSTRUCTBLIP_DIMS, dims), _folder(folder)
    tok = _tokenizer(folder, tokenizer_dir)
    qformer_tok = _tokenizer(folder / "qformer_tokenizer", qformer_tokenizer_dir, builtin_bert_tokenizer)
    config = InstructBlipConfig(
        vision_config=InstructBlipVisionConfig(**dims["vision"]).to_dict(),
        qformer_config=InstructBlipQFormerConfig(**dims["qformer"], vocab_size=len(qformer_tok),
                                                 pad_token_id=qformer_tok.pad_token_id).to_dict(),
        text_config=LlamaConfig(**_vocab(dims["text"], tok), bos_token_id=1, eos_token_id=2).to_dict(),
        num_query_tokens=dims["queries"], image_token_index=tok.convert_tokens_to_ids("<image>"),
        **dims.get("config", {}))
    side = dims["vision"]["image_size"]
    processor = InstructBlipProcessor(image_processor=BlipImageProcessor(size={"height": side, "width": side}),
                                      tokenizer=tok, qformer_tokenizer=qformer_tok, num_query_tokens=dims["queries"])
    return _write(folder, config, InstructBlipForConditionalGeneration, processor, weights or Weights(**stream))


def write_qwen2_vl_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                              weights: Weights | None = None, **stream) -> Path:
    """A random-weight Qwen2-VL checkpoint (the processor's default pixel budget unless dims'
    `processor` says otherwise); the tokenizer is tokenizer_dir's when it has Qwen2-VL's image pad,
    else the built-in one."""
    from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor

    dims, folder = _dims(QWEN2_VL_DIMS, dims), _folder(folder)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True) if tokenizer_dir else None
    if tok is None or tok.convert_tokens_to_ids("<|image_pad|>") in (None, tok.unk_token_id):
        tok = builtin_qwen2_tokenizer(folder)
    special = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")}
    text = dict(_vocab(dims["text"], tok), bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    config = Qwen2VLConfig(text_config=text, vision_config=dict(dims["vision"], patch_size=14, spatial_merge_size=2,
                                                               temporal_patch_size=2, in_channels=3),
                           image_token_id=special["<|image_pad|>"], vision_start_token_id=special["<|vision_start|>"],
                           vision_end_token_id=special["<|vision_end|>"], tie_word_embeddings=False)
    tok.save_pretrained(str(folder))
    # Saved apart: Qwen2VLProcessor also wants a video processor, which needs torchvision.
    processor = Qwen2VLImageProcessor(**dims.get("processor", {}))
    return _write(folder, config, Qwen2VLForConditionalGeneration, processor, weights or Weights(**stream))


TOP_LEVEL = ("visual_config", "model_type", "architectures")  # mPLUG-Owl2 config keys that are not LLaMA's


def write_mplug_owl2_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                                weights: Weights | None = None, **stream) -> Path:
    """A random-weight checkpoint in upstream mPLUG-Owl2's layout (config.json with visual_config,
    upstream's tensor names, a CLIP processor at the ViT's size); transformers has no class for it,
    so the tensors are streamed from the family's own shape tables ("stream" weights only)."""
    from transformers import CLIPImageProcessor, LlamaConfig

    from .llama import LlamaDims
    from .mplug_owl2 import AbstractorDims, VisionDims, lm_expected_shapes

    dims, folder = _dims(MPLUG_OWL2_DIMS, dims), _folder(folder)
    weights = weights or Weights(**stream)
    if weights.init != "stream":
        raise ValueError("mPLUG-Owl2 checkpoints are written as streamed random tensors only")
    tok = _tokenizer(folder, tokenizer_dir)
    text = _vocab(dims["text"], tok)
    raw = {"architectures": ["MPLUGOwl2LlamaForCausalLM"], "model_type": "mplug_owl2", **text,
           "num_key_value_heads": text.get("num_key_value_heads", text["num_attention_heads"]),
           "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 10000.0,
           "tie_word_embeddings": False,
           "visual_config": {"visual_model": dims["vision"], "visual_abstractor": dims["abstractor"]}}
    lm = LlamaDims.from_config(LlamaConfig(**{k: v for k, v in raw.items() if k not in TOP_LEVEL}))
    shapes = {(k if k == "lm_head.weight" else f"model.{k}"): v for k, v in lm_expected_shapes(lm).items()}
    shapes.update({f"model.vision_model.{k}": v for k, v in VisionDims(**dims["vision"]).expected_shapes().items()})
    shapes.update({f"model.visual_abstractor.{k}": v
                   for k, v in AbstractorDims(**dims["abstractor"]).expected_shapes(lm.hidden_size).items()})
    side = dims["vision"]["image_size"]
    processor = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    _write_tensors(folder, shapes, weights)
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    processor.save_pretrained(str(folder))
    return folder


def _dims(table: dict, dims: str | dict) -> dict:
    if isinstance(dims, dict):
        return dims
    if dims not in table:
        raise ValueError(f"size must be one of {', '.join(table)}")
    return table[dims]


def _folder(folder: Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _vocab(text: dict, tok) -> dict:
    """The text config with at least one lm_head row per token (the tables pad LLaMA's to 32,064, as
    llava-hf does, so the legacy readouts' fixed ids are rows whichever tokenizer stands in)."""
    return dict(text, vocab_size=max(text["vocab_size"], len(tok)))


def _write(folder: Path, config, model_class, processor, weights: Weights) -> Path:
    if weights.init == "stream":  # transformers' own tensor names, shard by shard: a 7B model never sits in memory
        with torch.device("meta"):
            shapes = {k: tuple(v.shape) for k, v in model_class(config).state_dict().items()
                      if not k.endswith("position_ids")}
        _write_tensors(folder, shapes, weights)
        config.save_pretrained(str(folder))
    elif weights.init == "model":
        torch.manual_seed(weights.seed)
        model = model_class(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() in weights.spread_ranks:
                    p.normal_(0.0, weights.std)
            for name, std in weights.extra.items():
                model.get_parameter(name).normal_(0.0, std)
        model.to(weights.dtype).save_pretrained(str(folder))
    else:
        raise ValueError(f"init must be stream or model, not {weights.init!r}")
    processor.save_pretrained(str(folder))
    return folder


def _write_tensors(folder: Path, shapes: dict[str, tuple[int, ...]], weights: Weights) -> None:
    """Random tensors of these names and shapes as safetensors shards (with an index when more than one)."""
    from safetensors.torch import save_file

    generator = torch.Generator(device=weights.device).manual_seed(weights.seed)
    shards, current, current_bytes = [], {}, 0
    for name, shape in shapes.items():
        current[name] = _random_tensor(name, shape, weights.std, generator, weights.dtype, weights.device).cpu()
        current_bytes += current[name].numel() * current[name].element_size()
        if current_bytes >= weights.shard_bytes:
            shards.append(current)
            current, current_bytes = {}, 0
    if current:
        shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    if len(shards) > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
