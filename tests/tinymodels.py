"""The engine tests' tiny random checkpoints (make_tiny: engine/synthetic/<model_type>.py's
SIZES["tiny"], or what a family's maker here changes of it with tiny_dims, weights through the
transformers class), synthetic POPE sets and oracle helpers.

The tokenizers are the real ones from ../shared when they are there; elsewhere the built-in
word-level ones stand in, so these tests run on any clone.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from pope_fast.engine.synthetic import (Weights, family_checkpoints, synthetic_image,
                                        write_checkpoint)

SHARED_LLAVA_TOKENIZER = (Path(__file__).resolve().parents[2]
                          / "shared/tokenizers/llama2/llava-1.5-7b-hf")
SHARED_BERT_TOKENIZER = (Path(__file__).resolve().parents[2]
                         / "shared/tokenizers/bert/bert-base-uncased")
SHARED_QWEN2_TOKENIZER = (Path(__file__).resolve().parents[2]
                          / "shared/tokenizers/qwen2/qwen2-vl-7b-instruct")
SHARED_QWEN2_5_TOKENIZER = (Path(__file__).resolve().parents[2]
                            / "shared/tokenizers/qwen2_5_vl/qwen2.5-vl-7b-instruct")
SHARED_QWEN3_TOKENIZER = (Path(__file__).resolve().parents[2]
                          / "shared/tokenizers/qwen3_vl/qwen3-vl-8b-instruct")
SHARED_MISTRAL_TOKENIZER = (Path(__file__).resolve().parents[2]
                            / "shared/tokenizers/mistral/llava-v1.6-mistral-7b-hf")
SHARED_ONEVISION_TOKENIZER = (Path(__file__).resolve().parents[2]
                              / "shared/tokenizers/llava_onevision/llava-onevision-qwen2-7b-ov-hf")
SHARED_INTERNVL_TOKENIZER = (Path(__file__).resolve().parents[2]
                             / "shared/tokenizers/internvl3/internvl3-8b-hf")
# Under the Gemma Terms of Use: read from ../shared, never copied into the repository.
SHARED_GEMMA3_TOKENIZER = (Path(__file__).resolve().parents[2]
                           / "shared/tokenizers/gemma3/gemma-3-4b-it")
QUESTIONS = ["Is there a dog in the image?", "Is there a person in the image?",
             "Is there a car in the image?", "Is there a dining table in the image?",
             "Is there a skis in the image?", "Is there a traffic light in the image?"]


def _shared(folder: Path, builtin: bool) -> Path | None:
    return folder if folder.is_dir() and not builtin else None


def tiny_dims(model_type: str, **parts) -> dict:
    """engine/synthetic's SIZES["tiny"] of model_type with a test's changes: a dict part updates the
    table's part of that name (vision, text, processor), any other part is set (config, pinpoints,
    queries)."""
    table = family_checkpoints(model_type).SIZES["tiny"]
    return {**table, **{name: {**table[name], **part} if isinstance(part, dict) and name in table
                        else part for name, part in parts.items()}}


def make_tiny(model_type: str, folder: Path, dims: str | dict = "tiny", *, seed: int = 0,
              init_std: float = 0.08, dtype=torch.float32, spread_ranks=(2, 3, 4, 5),
              extra: dict | None = None, **writer) -> Path:
    """A test checkpoint of model_type: engine/synthetic's writer at dims (`writer`: its keywords,
    tokenizer_dir...), the transformers class's weights of a rank in spread_ranks drawn under `seed`
    from N(0, init_std), and `extra`'s parameters, which transformers starts at a constant, from
    N(0, their std), so that a model misreading one differs. init_std is larger than transformers'
    0.02 so that the random model's logits spread out and its yes/no decisions are not coin-flips
    decided in the last bit."""
    return write_checkpoint(model_type, folder, dims, **writer, weights=Weights(
        "model", seed=seed, std=init_std, dtype=dtype, spread_ranks=spread_ranks,
        extra=extra or {}))


# The tests' language models are half the demo's width, and their vocabularies 32,064 rows (or the
# tokenizer's length): the oracle and the engine then run in seconds on 2 cores. LLaMA's and
# Mistral's keep transformers' rms_norm_eps.
LLAMA_TEST = dict(hidden_size=64, intermediate_size=128, max_position_embeddings=2048,
                  rms_norm_eps=1e-6)
QWEN_TEST = dict(hidden_size=64, intermediate_size=128, vocab_size=32064,
                 max_position_embeddings=4096)
# Qwen2-VL's and Qwen2.5-VL's: M-RoPE sections [2, 3, 3] of the 8 frequencies, transformers'
# rms_norm_eps
QWEN2_VL_TEST = dict(QWEN_TEST, rms_norm_eps=1e-5,
                     rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
# Qwen-VL processors keeping images between 4 and 30 merged tokens (of 28 px; Qwen3-VL's of 32 px)
QWEN2_PIXELS = dict(min_pixels=4 * 28 * 28, max_pixels=30 * 28 * 28, patch_size=14, merge_size=2,
                    temporal_patch_size=2)
QWEN3_PIXELS = dict(min_pixels=4 * 32 * 32, max_pixels=30 * 32 * 32)


def _clip(width: int, image_size: int) -> dict:
    return dict(hidden_size=width, intermediate_size=2 * width, image_size=image_size,
                projection_dim=width)


def make_tiny_llava(folder: Path, *, image_size: int = 42, layers: int = 2, kv_heads: int = 2,
                    vision_hidden: int = 32, vocab_size: int | None = None, feature_layer=-2,
                    init_std: float = 0.08, builtin_tokenizer: bool = False, **weights) -> Path:
    """LLaVA-1.5's tiny checkpoint with its processor files, a CLIP tower `vision_hidden` wide on
    42-px images; vocab_size: lm_head rows (default 32064, at least the tokenizer's length)."""
    dims = tiny_dims("llava", vision=_clip(vision_hidden, image_size),
                     text=dict(LLAMA_TEST, num_hidden_layers=layers, num_key_value_heads=kv_heads,
                               initializer_range=init_std,
                               **({"vocab_size": vocab_size} if vocab_size else {})),
                     config=dict(initializer_range=init_std, vision_feature_layer=feature_layer))
    return make_tiny("llava", folder, dims, init_std=init_std, spread_ranks=(2,),
                     tokenizer_dir=_shared(SHARED_LLAVA_TOKENIZER, builtin_tokenizer), **weights)


# Crops of 28 px, 2 x 2 patches each: every grid shape and both unpad directions at test sizes.
TINY_PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]


def make_tiny_llava_next(folder: Path, *, vision_hidden: int = 32, init_std: float = 0.08,
                         builtin_tokenizer: bool = False, **weights) -> Path:
    """LLaVA-NeXT's tiny checkpoint (CLIP tower on 28-px crops, Mistral language model) with its
    processor files, image_newline drawn; the tokenizer is LLaVA-1.6-Mistral's from ../shared when
    it is there."""
    dims = tiny_dims("llava_next", vision=_clip(vision_hidden, 28), pinpoints=TINY_PINPOINTS,
                     text=dict(LLAMA_TEST, initializer_range=init_std),
                     config=dict(initializer_range=init_std))
    return make_tiny("llava_next", folder, dims, init_std=init_std, spread_ranks=(2,),
                     extra={"model.image_newline": 0.5},
                     tokenizer_dir=_shared(SHARED_MISTRAL_TOKENIZER, builtin_tokenizer), **weights)


# OneVision's crops of 42 px (3 x 3 SigLIP patches), in grids of 1 x 1 up to 4 x 4: large images
# pass anyres_max_9's limit of 1.1² x 9 crops of features.
ONEVISION_PINPOINTS = [[42, 42], [42, 84], [84, 42], [84, 84], [42, 126], [126, 42], [126, 126],
                       [168, 168], [84, 168], [168, 84]]


def make_tiny_llava_onevision(folder: Path, *, builtin_tokenizer: bool = False, tied: bool = False,
                              vision_hidden: int = 32, init_std: float = 0.08, **weights) -> Path:
    """LLaVA-OneVision's tiny checkpoint (SigLIP on 42-px crops, Qwen2, tied embeddings on request),
    image_newline drawn, with its image processor and tokenizer, saved in fp16; the tokenizer is
    OneVision's from ../shared when it is there."""
    dims = tiny_dims("llava_onevision",
                     vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                                 image_size=42),
                     text=dict(QWEN_TEST, initializer_range=init_std, tie_word_embeddings=tied),
                     pinpoints=ONEVISION_PINPOINTS,
                     config=dict(initializer_range=init_std, tie_word_embeddings=tied))
    return make_tiny("llava_onevision", folder, dims, init_std=init_std, dtype=torch.float16,
                     spread_ranks=(2,), extra={"model.image_newline": 0.5},
                     tokenizer_dir=_shared(SHARED_ONEVISION_TOKENIZER, builtin_tokenizer),
                     **weights)


def make_tiny_internvl(folder: Path, *, builtin_tokenizer: bool = False, tied: bool = False,
                       vision_hidden: int = 32, init_std: float = 0.08, feature_layer: int = -1,
                       language: str = "qwen2", **weights) -> Path:
    """InternVL3-hf's tiny checkpoint (InternViT on 56-px tiles: 4 x 4 patches, 4 tokens per tile
    after the pixel shuffle; up to 6 tiles + a thumbnail; Qwen2, or Qwen3 as InternVL3.5-hf's, tied
    embeddings on request) with its image processor and tokenizer, saved in fp16; the tokenizer is
    InternVL3-8B-hf's from ../shared when it is there. Layer scales and the projector's LayerNorm
    are drawn too, so that a model ignoring them differs."""
    extra = {f"model.vision_tower.encoder.layer.{i}.{name}": 0.5
             for i in range(2) for name in ("lambda_1", "lambda_2")}
    extra.update({f"model.{name}": 0.5 for name in (
        "multi_modal_projector.layer_norm.bias", "vision_tower.embeddings.cls_token",
        "vision_tower.embeddings.position_embeddings")})
    dims = tiny_dims("internvl",
                     vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                                 image_size=56),
                     text=dict(QWEN_TEST, model_type=language, initializer_range=init_std),
                     max_patches=6,
                     config=dict(initializer_range=init_std, tie_word_embeddings=tied,
                                 vision_feature_layer=feature_layer))
    return make_tiny("internvl", folder, dims, init_std=init_std, dtype=torch.float16,
                     spread_ranks=(2,), extra=extra,
                     tokenizer_dir=_shared(SHARED_INTERNVL_TOKENIZER, builtin_tokenizer), **weights)


def make_tiny_instructblip(folder: Path, *, vision_hidden: int = 32, qformer_hidden: int = 32,
                           init_std: float = 0.08, builtin_tokenizer: bool = False,
                           **weights) -> Path:
    """InstructBLIP's tiny checkpoint (EVA-style ViT of 28 px, a Q-Former of 4 queries, LLaMA),
    query_tokens drawn, with its processor files; the tokenizers are Vicuna's and bert-base-uncased
    from ../shared when there."""
    dims = tiny_dims("instructblip",
                     vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                                 image_size=28),
                     qformer=dict(hidden_size=qformer_hidden, intermediate_size=2 * qformer_hidden,
                                  encoder_hidden_size=vision_hidden),
                     text=dict(LLAMA_TEST, initializer_range=init_std), queries=4,
                     config=dict(initializer_range=init_std))
    return make_tiny("instructblip", folder, dims, init_std=init_std, extra={"query_tokens": 0.5},
                     tokenizer_dir=_shared(SHARED_LLAVA_TOKENIZER, builtin_tokenizer),
                     qformer_tokenizer_dir=_shared(SHARED_BERT_TOKENIZER, builtin_tokenizer),
                     **weights)


def make_tiny_qwen2_vl(folder: Path, *, vision_dim: int = 32, init_std: float = 0.08,
                       builtin_tokenizer: bool = False, **weights) -> Path:
    """Qwen2-VL's tiny checkpoint (a 2-block ViT `vision_dim` wide, Qwen2 with M-RoPE sections
    [2, 3, 3] of its 8 frequencies); the tokenizer is Qwen2-VL's from ../shared when it is there."""
    dims = tiny_dims("qwen2_vl", vision=dict(embed_dim=vision_dim, hidden_size=64),
                     processor=QWEN2_PIXELS, text=dict(QWEN2_VL_TEST, initializer_range=init_std))
    return make_tiny("qwen2_vl", folder, dims, init_std=init_std,
                     tokenizer_dir=_shared(SHARED_QWEN2_TOKENIZER, builtin_tokenizer), **weights)


def make_tiny_qwen2_5_vl(folder: Path, *, layers: int = 2, vision_dim: int = 32,
                         init_std: float = 0.08, builtin_tokenizer: bool = False,
                         **weights) -> Path:
    """Qwen2.5-VL's tiny checkpoint: its 4-block windowed ViT (whole-image attention in blocks 1 and
    3) `vision_dim` wide, on windows of 56 px (2 x 2 merged tokens); Qwen2 with M-RoPE sections
    [2, 3, 3]; the tokenizer is Qwen2.5-VL's from ../shared when it is there."""
    dims = tiny_dims("qwen2_5_vl",
                     vision=dict(hidden_size=vision_dim, intermediate_size=2 * vision_dim,
                                 out_hidden_size=64, window_size=56),
                     processor=QWEN2_PIXELS,
                     text=dict(QWEN2_VL_TEST, num_hidden_layers=layers, initializer_range=init_std))
    return make_tiny("qwen2_5_vl", folder, dims, init_std=init_std,
                     tokenizer_dir=_shared(SHARED_QWEN2_5_TOKENIZER, builtin_tokenizer), **weights)


def _qwen3_vl(model_type: str, vision_dim: int, init_std: float, **text) -> dict:
    """Qwen3-VL's tiny dims for the tests: the tower `vision_dim` wide, a 4 x 4 learned position
    grid (resampled to each image's), DeepStack from blocks 0 and 2 (their features enter after
    language-model layers 0 and 1 of 3)."""
    return tiny_dims(model_type,
                     vision=dict(hidden_size=vision_dim, intermediate_size=2 * vision_dim,
                                 out_hidden_size=64, num_position_embeddings=16,
                                 deepstack_visual_indexes=[0, 2]),
                     text=dict(QWEN_TEST, initializer_range=init_std, **text),
                     processor=QWEN3_PIXELS)


def make_tiny_qwen3_vl(folder: Path, *, vision_dim: int = 32, init_std: float = 0.08,
                       builtin_tokenizer: bool = False, **weights) -> Path:
    """Qwen3-VL's tiny checkpoint (_qwen3_vl's dims), q_norm and k_norm drawn so that a model
    ignoring them differs; the tokenizer is Qwen3-VL's from ../shared when it is there."""
    extra = {f"model.language_model.layers.{i}.self_attn.{n}_norm.weight": 0.5
             for i in range(3) for n in "qk"}
    return make_tiny("qwen3_vl", folder, _qwen3_vl("qwen3_vl", vision_dim, init_std),
                     init_std=init_std, extra=extra,
                     tokenizer_dir=_shared(SHARED_QWEN3_TOKENIZER, builtin_tokenizer), **weights)


def make_tiny_qwen3_vl_moe(folder: Path, *, vision_dim: int = 32, init_std: float = 0.08,
                           builtin_tokenizer: bool = False, **weights) -> Path:
    """Qwen3-VL-MoE's tiny checkpoint: make_tiny_qwen3_vl's, with 6 experts 48 wide (not 2 x 64 / 2:
    the fused tensors' two layouts then differ in shape), 2 of them a token, on every layer but 1 (a
    dense MLP there)."""
    dims = _qwen3_vl("qwen3_vl_moe", vision_dim, init_std, moe_intermediate_size=48, num_experts=6)
    extra = {f"model.language_model.layers.{i}.self_attn.{n}_norm.weight": 0.5
             for i in range(3) for n in "qk"}
    # a router whose logits spread (std ~4 over unit-RMS hidden states): a token's k-th and k+1-th
    # experts are then far apart, so the one-ulp differences of fp16 attention cannot swap them
    # (test_qwen3_vl_moe checks the gap); at the model's 0.08 they came within 6e-5 and an fp16 run
    # routed one token differently from transformers
    extra.update({f"model.language_model.layers.{i}.mlp.gate.weight": 0.5 for i in (0, 2)})
    return make_tiny("qwen3_vl_moe", folder, dims, init_std=init_std, extra=extra,
                     tokenizer_dir=_shared(SHARED_QWEN3_TOKENIZER, builtin_tokenizer), **weights)


def make_tiny_qwen3_5(folder: Path, *, model_type: str = "qwen3_5", **weights) -> Path:
    """Qwen3.5's tiny checkpoint, engine/synthetic/qwen3_5.py's (layers DeltaNet, gated attention,
    DeltaNet; the stand-in tokenizer at the published special ids), with the one-dimensional weights
    transformers starts at one constant (the q/k norms, the gated norm, dt_bias) drawn too, so that
    a model misreading any of them differs. model_type qwen3_5_moe: the same layers, each MLP 4
    experts (2 a token) and a shared expert (engine/synthetic/qwen3_5_moe.py), saved by transformers
    one tensor an expert."""
    extra = {f"model.language_model.layers.1.self_attn.{n}_norm.weight": 0.5 for n in "qk"}
    extra.update({f"model.language_model.layers.{i}.linear_attn.{n}": 0.5 for i in (0, 2)
                  for n in ("norm.weight", "dt_bias")})
    return make_tiny(model_type, folder, extra=extra, **weights)


make_tiny_qwen3_5_moe = functools.partial(make_tiny_qwen3_5, model_type="qwen3_5_moe")


def make_tiny_gemma3(folder: Path, *, builtin_tokenizer: bool = False, vision_hidden: int = 32,
                     init_std: float = 0.08, **weights) -> Path:
    """Gemma 3's tiny checkpoint at the tests' image size (SigLIP on 64-px images, 8 x 8 patches
    pooled to 16 tokens; four layers local, local, global, local with two RoPE bases, head_dim 32
    against a query_pre_attn_scalar of 24) with Gemma3Processor's files; every RMSNorm weight is
    drawn too (Gemma's scale by 1 + w, so a model scaling by w differs). The tokenizer is
    gemma-3-4b-it's from ../shared when it is there, else the built-in stand-in at Gemma's
    special-token ids."""
    dims = tiny_dims("gemma3",
                     vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                                 image_size=64, patch_size=8),
                     text=dict(initializer_range=init_std), mm_tokens=16,
                     config=dict(initializer_range=init_std))
    extra = {f"model.language_model.layers.{i}.{name}.weight": 0.5 for i in range(4) for name in (
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
        "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm")}
    extra.update({"model.language_model.norm.weight": 0.5,
                  "model.multi_modal_projector.mm_soft_emb_norm.weight": 0.5})
    return make_tiny("gemma3", folder, dims, init_std=init_std, extra=extra,
                     tokenizer_dir=_shared(SHARED_GEMMA3_TOKENIZER, builtin_tokenizer), **weights)


def make_tiny_gemma4(folder: Path, **weights) -> Path:
    """Gemma 4's tiny checkpoint (gemma4's VISION_TINY and TEXT_TINY: a 2-layer tower, at most 70
    soft tokens an image; five layers, the last two KV-shared, per-layer inputs, a 24-token window
    inside every image's run) with the built-in stand-in tokenizer; every RMSNorm weight with one is
    drawn too (Gemma 4 scales by w, Gemma 3 by 1 + w, so either mistaken for the other differs)."""
    extra = {f"model.language_model.layers.{i}.{name}.weight": 0.5 for i in range(5) for name in (
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
        "post_feedforward_layernorm", "self_attn.q_norm", "post_per_layer_input_norm")}
    extra.update({f"model.language_model.layers.{i}.self_attn.k_norm.weight": 0.5
                  for i in range(3)})  # unshared
    extra.update({"model.language_model.norm.weight": 0.5,
                  "model.language_model.per_layer_projection_norm.weight": 0.5})
    return make_tiny("gemma4", folder, spread_ranks=(2, 3), extra=extra, **weights)


def write_pope_set(root: Path, n_images: int = 3, sizes=((90, 70), (64, 64), (50, 120)),
                   splits=("random", "adversarial"),
                   questions_per_image: int = 4) -> tuple[Path, list[Path]]:
    """Synthetic images and POPE-format question files; the splits share their yes-questions, as
    COCO's do."""
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


def eval_args(checkpoint, images, files, out, *extra) -> list[str]:
    """`pope-fast eval`'s arguments over a write_pope_set: the model, images, each question file,
    out, on the CPU."""
    args = ["eval", "--model", checkpoint, "--images", images, "--out", out, "--device", "cpu",
            *extra]
    for f in files:
        args += ["--questions", f]
    return [str(a) for a in args]


def worst_difference(ours: dict[int, float], theirs: torch.Tensor) -> tuple[float, int]:
    """The largest |ours - theirs| over our candidate ids, and the id where it is."""
    diffs = {i: abs(v - float(theirs[i])) for i, v in ours.items()}
    worst = max(diffs, key=diffs.get)
    return diffs[worst], worst


def with_generation_config(checkpoint: Path, folder: Path, fields: dict) -> Path:
    """A copy of `checkpoint` whose generation_config.json also sets `fields` (what generate reads
    from it)."""
    import json
    import shutil

    folder = Path(shutil.copytree(checkpoint, folder))
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, **fields}))
    return folder


def generate_each(model, inputs_of, image, prompts: list[str], **generate) -> list[list[int]]:
    """transformers' generate for each prompt about `image`, one prompt at a time, without sampling:
    the new tokens (an oracle's continuations; `generate` gives the length, beams, and the rest)."""
    out = []
    for prompt in prompts:
        inputs = inputs_of(image, prompt)
        with torch.no_grad():
            out.append(model.generate(**inputs, do_sample=False, **generate)
                       [0, inputs["input_ids"].shape[1]:].tolist())
    return out


def generated_text(engine, generated: list[int]) -> str:
    """What the engine's text readouts must see of transformers' generate output: the new tokens up
    to the first stop id, decoded without specials."""
    stop = next((k for k, t in enumerate(generated) if t in engine.model.stop_ids), len(generated))
    return engine.model.tokenizer.decode(generated[:stop], skip_special_tokens=True)


def bnb_nf4_oracle(model_class, checkpoint: Path):
    """transformers + bitsandbytes NF4 as the paper ran it (double quant, fp16 compute), on CPU,
    with bitsandbytes' CPU-only bf16-scale repack switched off so it computes the GPU path's
    numerics (see engine/test_engine_nf4)."""
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.float16)
    model = model_class.from_pretrained(str(checkpoint), quantization_config=config,
                                        dtype=torch.float16, device_map="cpu").eval()
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
    return model


def assert_matches_nf4_oracle(engine, answer, theirs: torch.Tensor) -> None:
    """An NF4 answer against the oracle's answer-position logits: candidate logits within a few fp16
    steps (both round to fp16; attention and norms accumulate in another order), the same first
    token, and identical decisions under every logit readout, near-ties included."""
    from pope_fast.readout import LOGIT_READOUTS
    from pope_fast.readout.readouts import compare_max_logits

    ids = list(engine.readout.candidate_ids)
    ours = torch.tensor([answer.candidate_logits[i] for i in ids])
    step = float(torch.finfo(torch.float16).eps) * max(1.0, float(theirs[ids].abs().max()))
    diff = (ours - theirs[ids]).abs()
    assert float(diff.max()) <= 4 * step, \
        f"{answer.question}: id {ids[int(diff.argmax())]} off by {diff.max()}"
    assert answer.first_token_id == int(theirs.argmax())
    for name in LOGIT_READOUTS:
        logits = {i: float(theirs[i]) for i in engine.readout.token_sets[name].ids}
        assert answer.predictions[name] == \
            compare_max_logits(logits, engine.readout.token_sets[name]), (name, answer.question)


def edited_eager_attention(edit_scores):
    """A transformers attention function (for AttentionInterface.register): eager attention with
    `edit_scores(module, scores)` applied to the raw scores [B, H, Q, K] before the mask and
    softmax."""
    from transformers.models.llama.modeling_llama import repeat_kv

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = getattr(module, "num_key_value_groups", 1)
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        scores = edit_scores(module, torch.matmul(query, key.transpose(2, 3)) * scaling)
        # A registered attention function may get a boolean mask, or none and causality left to it
        # (as sdpa).
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        elif attention_mask is not None:
            scores = scores + attention_mask
        elif getattr(module, "is_causal", False):
            q_len, k_len = scores.shape[-2:]
            scores = scores.masked_fill(
                ~torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len), float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    return attention


@functools.cache
def qwen_processors(checkpoint: Path):
    """(tokenizer, image processor) of a Qwen-VL family checkpoint; its full processor also wants a
    video processor, which needs torchvision."""
    from transformers import AutoImageProcessor, AutoTokenizer

    return (AutoTokenizer.from_pretrained(str(checkpoint)),
            AutoImageProcessor.from_pretrained(str(checkpoint)))


def qwen_inputs(checkpoint: Path, image, prompt: str, processors: tuple | None = None) -> dict:
    """What Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's processors make for one image (the image pad
    expanded to the merged grid, mm_token_type_ids), without their video half; `processors`:
    qwen_processors' already made."""
    tokenizer, image_processor = processors or qwen_processors(checkpoint)
    pixels = image_processor(images=image, return_tensors="pt")
    tokens = int(pixels["image_grid_thw"].prod()) // 4
    text = tokenizer(prompt.replace("<|image_pad|>", "<|image_pad|>" * tokens), return_tensors="pt")
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return dict(text, **pixels, mm_token_type_ids=(text["input_ids"] == image_id).int())
