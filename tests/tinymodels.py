"""Tiny random checkpoints written by transformers, and synthetic images, for the engine tests.

The LLaVA tokenizer is the real LLaVA-1.5 one from ../shared when it is there; elsewhere the built-in
word-level tokenizer of `pope_fast.bench.synthetic` stands in, so these tests run on any clone.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from pope_fast.engine.synthetic import builtin_tokenizer, synthetic_image

SHARED_LLAVA_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/llama2/llava-1.5-7b-hf"
SHARED_BERT_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/bert/bert-base-uncased"
SHARED_QWEN2_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/qwen2/qwen2-vl-7b-instruct"
SHARED_MISTRAL_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/mistral/llava-v1.6-mistral-7b-hf"
QUESTIONS = ["Is there a dog in the image?", "Is there a person in the image?", "Is there a car in the image?",
             "Is there a dining table in the image?", "Is there a skis in the image?",
             "Is there a traffic light in the image?"]


def llava_tokenizer(folder: Path, builtin: bool = False, shared: Path = SHARED_LLAVA_TOKENIZER):
    from transformers import AutoTokenizer

    if shared.is_dir() and not builtin:
        tok = AutoTokenizer.from_pretrained(str(shared))
        tok.save_pretrained(str(folder))
        return tok
    return builtin_tokenizer(folder)


def make_tiny_llava(folder: Path, *, seed: int = 0, image_size: int = 42, layers: int = 2, kv_heads: int = 2,
                    hidden: int = 64, vision_hidden: int = 32, init_std: float = 0.08, dtype=torch.float32,
                    builtin_tokenizer: bool = False, vocab_size: int | None = None, feature_layer=-2) -> Path:
    """A random LLaVA-1.5-shaped checkpoint saved with save_pretrained, with its processor files.

    vocab_size: lm_head rows (default 32064, at least the tokenizer's length).
    init_std is larger than transformers' 0.02 so the random model's logits spread out and yes/no
    decisions are not coin-flips decided in the last bit.
    """
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = llava_tokenizer(folder, builtin_tokenizer)
    image_id = tok.convert_tokens_to_ids("<image>")
    # Padded past the tokenizer as llava-hf's is (32064 rows for 32002 tokens), so the legacy readouts'
    # fixed ids are rows here whichever tokenizer stands in; vocab_size overrides it.
    vocab = vocab_size or max(len(tok), 32064)
    vision = CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=2,
                              num_attention_heads=4, image_size=image_size, patch_size=14, projection_dim=vision_hidden)
    text = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=vocab,
                       max_position_embeddings=2048, initializer_range=init_std, bos_token_id=1, eos_token_id=2)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id,
                         pad_token_id=tok.pad_token_id, initializer_range=init_std, vision_feature_layer=feature_layer)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # spread the lm_head rows too, so answers vary between questions
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, init_std)
    model.to(dtype).save_pretrained(str(folder))
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": image_size},
                                           crop_size={"height": image_size, "width": image_size}),
        tokenizer=tok, patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1)
    processor.save_pretrained(str(folder))
    return folder


# Crops of 28 px, 2 x 2 patches each: every grid shape and both unpad directions at test sizes.
TINY_PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]


def make_tiny_llava_next(folder: Path, *, seed: int = 0, layers: int = 2, kv_heads: int = 2, hidden: int = 64,
                         vision_hidden: int = 32, init_std: float = 0.08, dtype=torch.float32,
                         builtin_tokenizer: bool = False) -> Path:
    """A random LLaVA-NeXT checkpoint (CLIP tower, Mistral language model) with its processor files;
    the tokenizer is LLaVA-1.6-Mistral's from ../shared when it is there."""
    from transformers import (CLIPVisionConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
                              LlavaNextImageProcessor, LlavaNextProcessor, MistralConfig)

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = llava_tokenizer(folder, builtin_tokenizer, SHARED_MISTRAL_TOKENIZER)
    image_id = tok.convert_tokens_to_ids("<image>")
    vision = CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=2,
                              num_attention_heads=4, image_size=28, patch_size=14, projection_dim=vision_hidden)
    text = MistralConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=max(len(tok), 32064),
                         max_position_embeddings=2048, initializer_range=init_std, bos_token_id=1, eos_token_id=2,
                         sliding_window=None, rope_theta=1e6)
    config = LlavaNextConfig(vision_config=vision, text_config=text, image_token_index=image_id,
                             image_grid_pinpoints=TINY_PINPOINTS, pad_token_id=tok.pad_token_id,
                             initializer_range=init_std)
    torch.manual_seed(seed)
    model = LlavaNextForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, init_std)
        model.model.image_newline.normal_(0.0, 0.5)
    model.to(dtype).save_pretrained(str(folder))
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28},
                                                image_grid_pinpoints=TINY_PINPOINTS),
        tokenizer=tok, patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1)
    processor.save_pretrained(str(folder))
    return folder


def make_tiny_instructblip(folder: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64, vision_hidden: int = 32,
                           qformer_hidden: int = 32, queries: int = 4, init_std: float = 0.08, dtype=torch.float32,
                           builtin_tokenizer: bool = False) -> Path:
    """A random InstructBLIP checkpoint (EVA-style ViT of 28 px, 2-layer Q-Former, LLaMA) with its
    processor files; the tokenizers are Vicuna's and bert-base-uncased from ../shared when there."""
    from transformers import (AutoTokenizer, BlipImageProcessor, InstructBlipConfig,
                              InstructBlipForConditionalGeneration, InstructBlipProcessor, InstructBlipQFormerConfig,
                              InstructBlipVisionConfig, LlamaConfig)

    from pope_fast.engine.synthetic import builtin_bert_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = llava_tokenizer(folder, builtin_tokenizer)
    if SHARED_BERT_TOKENIZER.is_dir() and not builtin_tokenizer:
        qformer_tok = AutoTokenizer.from_pretrained(str(SHARED_BERT_TOKENIZER))
    else:
        qformer_tok = builtin_bert_tokenizer(folder / "qformer_tokenizer_source")
    vision = InstructBlipVisionConfig(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                                      num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=14)
    qformer = InstructBlipQFormerConfig(vocab_size=len(qformer_tok), hidden_size=qformer_hidden,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=2 * qformer_hidden, encoder_hidden_size=vision_hidden,
                                        pad_token_id=qformer_tok.pad_token_id)
    text = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=4, vocab_size=max(len(tok), 32064),
                       max_position_embeddings=2048, initializer_range=init_std, bos_token_id=1, eos_token_id=2)
    config = InstructBlipConfig(vision_config=vision.to_dict(), qformer_config=qformer.to_dict(),
                                text_config=text.to_dict(), num_query_tokens=queries,
                                image_token_index=tok.convert_tokens_to_ids("<image>"), initializer_range=init_std)
    torch.manual_seed(seed)
    model = InstructBlipForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, init_std)
        model.query_tokens.normal_(0.0, 0.5)
    model.to(dtype).save_pretrained(str(folder))
    processor = InstructBlipProcessor(image_processor=BlipImageProcessor(size={"height": 28, "width": 28}),
                                      tokenizer=tok, qformer_tokenizer=qformer_tok, num_query_tokens=queries)
    processor.save_pretrained(str(folder))
    return folder


def make_tiny_qwen2_vl(folder: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64, vision_dim: int = 32,
                       init_std: float = 0.08, dtype=torch.float32, builtin_tokenizer: bool = False) -> Path:
    """A random Qwen2-VL checkpoint (2-block native-resolution ViT, 2-layer Qwen2 with M-RoPE sections
    [2, 3, 3] of its 8 frequencies) whose processor keeps images between 4 and 30 merged tokens; the
    tokenizer is Qwen2-VL's from ../shared when it is there."""
    from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor

    from pope_fast.engine.synthetic import builtin_qwen2_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if SHARED_QWEN2_TOKENIZER.is_dir() and not builtin_tokenizer:
        tok = AutoTokenizer.from_pretrained(str(SHARED_QWEN2_TOKENIZER))
    else:
        tok = builtin_qwen2_tokenizer(folder / "tokenizer_source")
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")}
    text = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=max(len(tok), 32064), max_position_embeddings=4096, rope_theta=1e6,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, initializer_range=init_std,
                bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    vision = dict(depth=2, embed_dim=vision_dim, hidden_size=hidden, num_heads=4, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                           vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                           tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, init_std)
    model.to(dtype).save_pretrained(str(folder))
    # The tokenizer and image processor as the hub checkpoint ships them; Qwen2VLProcessor itself
    # also wants a video processor, which needs torchvision.
    Qwen2VLImageProcessor(min_pixels=4 * 28 * 28, max_pixels=30 * 28 * 28, patch_size=14, merge_size=2,
                          temporal_patch_size=2).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def write_pope_set(root: Path, n_images: int = 3, sizes=((90, 70), (64, 64), (50, 120)), splits=("random", "adversarial"),
                   questions_per_image: int = 4) -> tuple[Path, list[Path]]:
    """Synthetic images and POPE-format question files; the splits share their yes-questions, as COCO's do."""
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        synthetic_image(i, sizes[i % len(sizes)]).save(images / f"img_{i}.png")
    files = []
    for s, split in enumerate(splits):
        rows, qid = [], 1
        for i in range(n_images):
            for j in range(questions_per_image):
                yes = j % 2 == 0
                text = QUESTIONS[j] if yes else QUESTIONS[(j + s + i) % len(QUESTIONS)]
                rows.append({"question_id": qid, "image": f"img_{i}.png", "text": text,
                             "label": "yes" if yes else "no"})
                qid += 1
        path = root / f"tiny_pope_{split}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files.append(path)
    return images, files


def worst_difference(ours: dict[int, float], theirs: torch.Tensor) -> tuple[float, int]:
    """The largest |ours - theirs| over our candidate ids, and the id where it is."""
    diffs = {i: abs(v - float(theirs[i])) for i, v in ours.items()}
    worst = max(diffs, key=diffs.get)
    return diffs[worst], worst


def generated_text(engine, generated: list[int]) -> str:
    """What the engine's text readouts must see of transformers' generate output: the new tokens up
    to the first stop id, decoded without specials."""
    stop = next((k for k, t in enumerate(generated) if t in engine.model.stop_ids), len(generated))
    return engine.model.tokenizer.decode(generated[:stop], skip_special_tokens=True)


def bnb_nf4_oracle(model_class, checkpoint: Path):
    """transformers + bitsandbytes NF4 as the paper ran it (double quant, fp16 compute), on CPU, with
    bitsandbytes' CPU-only bf16-scale repack switched off so it computes the GPU path's numerics
    (see test_engine_nf4)."""
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.float16)
    model = model_class.from_pretrained(str(checkpoint), quantization_config=config, dtype=torch.float16,
                                        device_map="cpu").eval()
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
    return model


def assert_matches_nf4_oracle(engine, answer, theirs: torch.Tensor) -> None:
    """An NF4 answer against the oracle's answer-position logits: candidate logits within a few fp16
    steps (both round to fp16; attention and norms accumulate in another order), the same first
    token, and identical decisions under every logit readout, near-ties included."""
    from pope_fast.readout import LOGIT_READOUTS
    from pope_fast.readout.protocols import compare_max_logits

    ids = engine.candidate_ids
    ours = torch.tensor([answer.candidate_logits[i] for i in ids])
    step = float(torch.finfo(torch.float16).eps) * max(1.0, float(theirs[ids].abs().max()))
    diff = (ours - theirs[ids]).abs()
    assert float(diff.max()) <= 4 * step, f"{answer.question}: id {ids[int(diff.argmax())]} off by {diff.max()}"
    assert answer.first_token_id == int(theirs.argmax())
    for name in LOGIT_READOUTS:
        logits = {i: float(theirs[i]) for i in engine.token_sets[name].ids}
        assert answer.predictions[name] == compare_max_logits(logits, engine.token_sets[name]), (name, answer.question)
