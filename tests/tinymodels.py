"""The engine tests' tiny random checkpoints (each family's writer on the synthetic side,
engine/synthetic/<model_type>.py, at test dimensions, weights through the transformers class), synthetic POPE sets and oracle helpers.

The tokenizers are the real ones from ../shared when they are there; elsewhere the built-in
word-level ones stand in, so these tests run on any clone.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from pope_fast.engine.synthetic import Weights, synthetic_image, write_checkpoint
from pope_fast.engine.synthetic.gemma3 import GEMMA3_TINY, SIGLIP_TINY

SHARED_LLAVA_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/llama2/llava-1.5-7b-hf"
SHARED_BERT_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/bert/bert-base-uncased"
SHARED_QWEN2_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/qwen2/qwen2-vl-7b-instruct"
SHARED_QWEN2_5_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/qwen2_5_vl/qwen2.5-vl-7b-instruct"
SHARED_QWEN3_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/qwen3_vl/qwen3-vl-8b-instruct"
SHARED_MISTRAL_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/mistral/llava-v1.6-mistral-7b-hf"
SHARED_ONEVISION_TOKENIZER = (Path(__file__).resolve().parents[2]
                              / "shared/tokenizers/llava_onevision/llava-onevision-qwen2-7b-ov-hf")
SHARED_INTERNVL_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/internvl3/internvl3-8b-hf"
# Under the Gemma Terms of Use: read from ../shared, never copied into the repository.
SHARED_GEMMA3_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/tokenizers/gemma3/gemma-3-4b-it"
QUESTIONS = ["Is there a dog in the image?", "Is there a person in the image?", "Is there a car in the image?",
             "Is there a dining table in the image?", "Is there a skis in the image?",
             "Is there a traffic light in the image?"]


def _shared(folder: Path, builtin: bool) -> Path | None:
    return folder if folder.is_dir() and not builtin else None


def make_tiny_llava(folder: Path, *, seed: int = 0, image_size: int = 42, layers: int = 2, kv_heads: int = 2,
                    hidden: int = 64, vision_hidden: int = 32, init_std: float = 0.08, dtype=torch.float32,
                    builtin_tokenizer: bool = False, vocab_size: int | None = None, feature_layer=-2) -> Path:
    """A random LLaVA-1.5-shaped checkpoint saved with save_pretrained, with its processor files.

    vocab_size: lm_head rows (default 32064, at least the tokenizer's length).
    init_std is larger than transformers' 0.02 so the random model's logits spread out and yes/no
    decisions are not coin-flips decided in the last bit (the lm_head rows too, so answers vary
    between questions).
    """
    dims = dict(vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=2,
                            num_attention_heads=4, image_size=image_size, patch_size=14, projection_dim=vision_hidden),
                text=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=vocab_size or 32064,
                          max_position_embeddings=2048, initializer_range=init_std),
                config=dict(initializer_range=init_std, vision_feature_layer=feature_layer))
    return write_checkpoint("llava", folder, dims, tokenizer_dir=_shared(SHARED_LLAVA_TOKENIZER, builtin_tokenizer),
                            weights=Weights("model", seed=seed, std=init_std, dtype=dtype))


# Crops of 28 px, 2 x 2 patches each: every grid shape and both unpad directions at test sizes.
TINY_PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]


def make_tiny_llava_next(folder: Path, *, seed: int = 0, layers: int = 2, kv_heads: int = 2, hidden: int = 64,
                         vision_hidden: int = 32, init_std: float = 0.08, dtype=torch.float32,
                         builtin_tokenizer: bool = False) -> Path:
    """A random LLaVA-NeXT checkpoint (CLIP tower, Mistral language model) with its processor files;
    the tokenizer is LLaVA-1.6-Mistral's from ../shared when it is there."""
    dims = dict(vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=2,
                            num_attention_heads=4, image_size=28, patch_size=14, projection_dim=vision_hidden),
                text=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=32064,
                          max_position_embeddings=2048, initializer_range=init_std, sliding_window=None,
                          rope_theta=1e6),
                pinpoints=TINY_PINPOINTS, config=dict(initializer_range=init_std))
    return write_checkpoint(
        "llava_next", folder, dims, tokenizer_dir=_shared(SHARED_MISTRAL_TOKENIZER, builtin_tokenizer),
        weights=Weights("model", seed=seed, std=init_std, dtype=dtype, extra={"model.image_newline": 0.5}))


# OneVision's crops of 42 px (3 x 3 SigLIP patches), in grids of 1 x 1 up to 4 x 4: large images pass
# anyres_max_9's limit of 1.1² x 9 crops of features.
ONEVISION_PINPOINTS = [[42, 42], [42, 84], [84, 42], [84, 84], [42, 126], [126, 42], [126, 126], [168, 168],
                       [84, 168], [168, 84]]


def make_tiny_llava_onevision(folder: Path, *, seed: int = 0, builtin_tokenizer: bool = False, tied: bool = False,
                              vision_hidden: int = 32, init_std: float = 0.08) -> Path:
    """A random LLaVA-OneVision checkpoint (2-layer SigLIP, 2-layer Qwen2, tied embeddings on request) with
    its image processor and tokenizer; the tokenizer is OneVision's from ../shared when it is there."""
    dims = dict(vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=2,
                            num_attention_heads=4, image_size=42, patch_size=14, vision_use_head=False),
                text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=32064, max_position_embeddings=4096, rope_theta=1e6,
                          initializer_range=init_std, tie_word_embeddings=tied),
                pinpoints=ONEVISION_PINPOINTS, config=dict(initializer_range=init_std, tie_word_embeddings=tied))
    return write_checkpoint(
        "llava_onevision", folder, dims, tokenizer_dir=_shared(SHARED_ONEVISION_TOKENIZER, builtin_tokenizer),
        weights=Weights("model", seed=seed, std=init_std, extra={"model.image_newline": 0.5}))


def make_tiny_internvl(folder: Path, *, seed: int = 0, builtin_tokenizer: bool = False, tied: bool = False,
                       vision_hidden: int = 32, tile: int = 56, max_patches: int = 6, init_std: float = 0.08,
                       feature_layer: int = -1, language: str = "qwen2") -> Path:
    """A random InternVL3-hf checkpoint (2-layer InternViT on 56-px tiles: 4 x 4 patches, 4 tokens per tile
    after the pixel shuffle; up to 6 tiles + a thumbnail; 2-layer Qwen2, or Qwen3 as InternVL3.5-hf's, tied
    embeddings on request) with its image processor and tokenizer; the tokenizer is InternVL3-8B-hf's from
    ../shared when it is there. Layer scales and the projector's LayerNorm are drawn too, so that a model ignoring
    them differs."""
    layers = 2
    extra = {f"model.vision_tower.encoder.layer.{i}.{name}": 0.5
             for i in range(layers) for name in ("lambda_1", "lambda_2")}
    extra.update({f"model.{name}": 0.5 for name in (
        "multi_modal_projector.layer_norm.bias", "vision_tower.embeddings.cls_token",
        "vision_tower.embeddings.position_embeddings")})
    dims = dict(vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=layers,
                            num_attention_heads=4, image_size=tile, patch_size=14, use_mean_pooling=True,
                            attention_bias=True),
                text=dict(model_type=language, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=32064, max_position_embeddings=4096,
                          rope_theta=1e6, initializer_range=init_std),
                max_patches=max_patches,
                config=dict(initializer_range=init_std, tie_word_embeddings=tied, vision_feature_layer=feature_layer))
    return write_checkpoint(
        "internvl", folder, dims, tokenizer_dir=_shared(SHARED_INTERNVL_TOKENIZER, builtin_tokenizer),
        weights=Weights("model", seed=seed, std=init_std, extra=extra))


def make_tiny_instructblip(folder: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64, vision_hidden: int = 32,
                           qformer_hidden: int = 32, queries: int = 4, init_std: float = 0.08, dtype=torch.float32,
                           builtin_tokenizer: bool = False) -> Path:
    """A random InstructBLIP checkpoint (EVA-style ViT of 28 px, 2-layer Q-Former, LLaMA) with its
    processor files; the tokenizers are Vicuna's and bert-base-uncased from ../shared when there."""
    dims = dict(vision=dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=2,
                            num_attention_heads=4, image_size=28, patch_size=14),
                qformer=dict(hidden_size=qformer_hidden, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=2 * qformer_hidden, encoder_hidden_size=vision_hidden),
                text=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=4, vocab_size=32064,
                          max_position_embeddings=2048, initializer_range=init_std),
                queries=queries, config=dict(initializer_range=init_std))
    return write_checkpoint(
        "instructblip", folder, dims, tokenizer_dir=_shared(SHARED_LLAVA_TOKENIZER, builtin_tokenizer),
        qformer_tokenizer_dir=_shared(SHARED_BERT_TOKENIZER, builtin_tokenizer),
        weights=Weights("model", seed=seed, std=init_std, dtype=dtype, spread_ranks=(2, 3, 4, 5),
                        extra={"query_tokens": 0.5}))


def make_tiny_qwen2_vl(folder: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64, vision_dim: int = 32,
                       init_std: float = 0.08, dtype=torch.float32, builtin_tokenizer: bool = False) -> Path:
    """A random Qwen2-VL checkpoint (2-block native-resolution ViT, 2-layer Qwen2 with M-RoPE sections
    [2, 3, 3] of its 8 frequencies) whose processor keeps images between 4 and 30 merged tokens; the
    tokenizer is Qwen2-VL's from ../shared when it is there."""
    dims = dict(vision=dict(depth=2, embed_dim=vision_dim, hidden_size=hidden, num_heads=4, mlp_ratio=2),
                text=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=32064, max_position_embeddings=4096,
                          rope_theta=1e6, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                          initializer_range=init_std),
                processor=dict(min_pixels=4 * 28 * 28, max_pixels=30 * 28 * 28, patch_size=14, merge_size=2,
                               temporal_patch_size=2))
    return write_checkpoint("qwen2_vl", folder, dims, tokenizer_dir=_shared(SHARED_QWEN2_TOKENIZER, builtin_tokenizer),
                            weights=Weights("model", seed=seed, std=init_std, dtype=dtype,
                                            spread_ranks=(2, 3, 4, 5)))


def make_tiny_qwen2_5_vl(folder: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64, vision_dim: int = 32,
                         window_size: int = 56, init_std: float = 0.08, dtype=torch.float32,
                         builtin_tokenizer: bool = False) -> Path:
    """A random Qwen2.5-VL checkpoint: a 4-block windowed ViT (windows of window_size px, 2 x 2 merged tokens
    at 56; whole-image attention in blocks 1 and 3), 2-layer Qwen2 with M-RoPE sections [2, 3, 3], the
    processor keeping images between 4 and 30 merged tokens; the tokenizer is Qwen2.5-VL's from ../shared
    when it is there."""
    dims = dict(vision=dict(depth=4, hidden_size=vision_dim, intermediate_size=2 * vision_dim, num_heads=4,
                            out_hidden_size=hidden, window_size=window_size, fullatt_block_indexes=[1, 3],
                            tokens_per_second=2, hidden_act="silu"),
                text=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=32064, max_position_embeddings=4096,
                          rope_theta=1e6, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                          initializer_range=init_std),
                processor=dict(min_pixels=4 * 28 * 28, max_pixels=30 * 28 * 28, patch_size=14, merge_size=2,
                               temporal_patch_size=2))
    return write_checkpoint(
        "qwen2_5_vl", folder, dims, tokenizer_dir=_shared(SHARED_QWEN2_5_TOKENIZER, builtin_tokenizer),
        weights=Weights("model", seed=seed, std=init_std, dtype=dtype, spread_ranks=(2, 3, 4, 5)))


def make_tiny_qwen3_vl(folder: Path, *, seed: int = 0, layers: int = 3, hidden: int = 64, vision_dim: int = 32,
                       deepstack=(0, 2), init_std: float = 0.08, dtype=torch.float32,
                       builtin_tokenizer: bool = False) -> Path:
    """A random Qwen3-VL checkpoint: a 4-block ViT of 16-px patches (a 4 x 4 learned position grid, resampled
    to each image's) with DeepStack mergers on blocks `deepstack`, whose features enter after language-model
    layers 0 and 1 of 3; Qwen3 (q_norm and k_norm drawn, so that a model ignoring them differs) with
    interleaved M-RoPE sections [6, 5, 5] of its 16 frequencies; the processor keeps images between 4 and 30
    merged tokens; the tokenizer is Qwen3-VL's from ../shared when it is there."""
    dims = dict(vision=dict(depth=4, hidden_size=vision_dim, intermediate_size=2 * vision_dim, num_heads=4,
                            out_hidden_size=hidden, patch_size=16, num_position_embeddings=16,
                            deepstack_visual_indexes=list(deepstack), hidden_act="gelu_pytorch_tanh"),
                text=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=32064,
                          max_position_embeddings=4096, initializer_range=init_std,
                          rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5],
                                           "mrope_interleaved": True}),
                processor=dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                               image_std=[0.5] * 3, min_pixels=4 * 32 * 32, max_pixels=30 * 32 * 32))
    extra = {f"model.language_model.layers.{i}.self_attn.{n}_norm.weight": 0.5 for i in range(layers) for n in "qk"}
    return write_checkpoint(
        "qwen3_vl", folder, dims, tokenizer_dir=_shared(SHARED_QWEN3_TOKENIZER, builtin_tokenizer),
        weights=Weights("model", seed=seed, std=init_std, dtype=dtype, spread_ranks=(2, 3, 4, 5), extra=extra))


def make_tiny_qwen3_vl_moe(folder: Path, *, seed: int = 0, layers: int = 3, hidden: int = 64, vision_dim: int = 32,
                           experts: int = 6, per_token: int = 2, dense_layers=(1,), init_std: float = 0.08,
                           dtype=torch.float32, builtin_tokenizer: bool = False) -> Path:
    """A random Qwen3-VL-MoE checkpoint: make_tiny_qwen3_vl's tower, DeepStack and Qwen3 attention, with
    `experts` experts 48 wide (not 2 x 64 / 2: the fused tensors' two layouts then differ in shape), `per_token`
    of them a token, on every layer but `dense_layers` (a dense MLP there, as mlp_only_layers makes it)."""
    dims = dict(vision=dict(depth=4, hidden_size=vision_dim, intermediate_size=2 * vision_dim, num_heads=4,
                            out_hidden_size=hidden, patch_size=16, num_position_embeddings=16,
                            deepstack_visual_indexes=[0, 2], hidden_act="gelu_pytorch_tanh"),
                text=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=32064,
                          max_position_embeddings=4096, initializer_range=init_std, moe_intermediate_size=48,
                          num_experts=experts, num_experts_per_tok=per_token, decoder_sparse_step=1,
                          mlp_only_layers=list(dense_layers),
                          rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5],
                                           "mrope_interleaved": True}),
                processor=dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                               image_std=[0.5] * 3, min_pixels=4 * 32 * 32, max_pixels=30 * 32 * 32))
    extra = {f"model.language_model.layers.{i}.self_attn.{n}_norm.weight": 0.5 for i in range(layers) for n in "qk"}
    # a router whose logits spread (std ~4 over unit-RMS hidden states): a token's k-th and k+1-th experts are
    # then far apart, so the one-ulp differences of fp16 attention cannot swap them (test_qwen3_vl_moe checks the
    # gap); at the model's 0.08 they came within 6e-5 and an fp16 run routed one token differently from transformers
    extra.update({f"model.language_model.layers.{i}.mlp.gate.weight": 0.5 for i in range(layers) if i not in dense_layers})
    return write_checkpoint(
        "qwen3_vl_moe", folder, dims, tokenizer_dir=_shared(SHARED_QWEN3_TOKENIZER, builtin_tokenizer),
        weights=Weights("model", seed=seed, std=init_std, dtype=dtype, spread_ranks=(2, 3, 4, 5), extra=extra))


def make_tiny_qwen3_5(folder: Path, *, seed: int = 0, init_std: float = 0.08, dtype=torch.float32,
                      model_type: str = "qwen3_5") -> Path:
    """A random Qwen3.5 checkpoint, engine/synthetic/qwen3_5.py's tiny size (layers DeltaNet, gated attention,
    DeltaNet; the stand-in tokenizer at the published special ids), with the one-dimensional weights transformers
    starts at one constant (the q/k norms, the gated norm, dt_bias) drawn too, so that a model misreading any of them
    differs. model_type qwen3_5_moe: the same layers, each MLP 4 experts (2 a token) and a shared expert
    (engine/synthetic/qwen3_5_moe.py), saved by transformers one tensor an expert."""
    extra = {f"model.language_model.layers.1.self_attn.{n}_norm.weight": 0.5 for n in "qk"}
    extra.update({f"model.language_model.layers.{i}.linear_attn.{n}": 0.5 for i in (0, 2)
                  for n in ("norm.weight", "dt_bias")})
    return write_checkpoint(model_type, folder, "tiny",
                            weights=Weights("model", seed=seed, std=init_std, dtype=dtype, spread_ranks=(2, 3, 4, 5),
                                            extra=extra))


make_tiny_qwen3_5_moe = functools.partial(make_tiny_qwen3_5, model_type="qwen3_5_moe")


def make_tiny_gemma3(folder: Path, *, seed: int = 0, builtin_tokenizer: bool = False, vision_hidden: int = 32,
                     init_std: float = 0.08, dtype=torch.float32, text: dict | None = None,
                     config: dict | None = None) -> Path:
    """A random Gemma 3 checkpoint (gemma3's SIGLIP_TINY and GEMMA3_TINY: a 2-layer SigLIP on 64-px images,
    8 x 8 patches pooled to 16 tokens; four layers local, local, global, local with two RoPE bases, head_dim 32 against a
    query_pre_attn_scalar of 24; `text` / `config` override its fields) with Gemma3Processor's files; every
    RMSNorm weight is drawn too (Gemma's scale by 1 + w, so a model scaling by w differs). The tokenizer is
    gemma-3-4b-it's from ../shared when it is there, else the built-in stand-in at Gemma's special-token ids."""
    dims = dict(vision=dict(SIGLIP_TINY, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden),
                text=dict(GEMMA3_TINY, initializer_range=init_std, **(text or {})), mm_tokens=16,
                config=dict(initializer_range=init_std, **(config or {})))
    layers = dims["text"]["num_hidden_layers"]
    extra = {f"model.language_model.layers.{i}.{name}.weight": 0.5 for i in range(layers) for name in (
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
        "self_attn.q_norm", "self_attn.k_norm")}
    extra.update({"model.language_model.norm.weight": 0.5, "model.multi_modal_projector.mm_soft_emb_norm.weight": 0.5})
    return write_checkpoint(
        "gemma3", folder, dims, tokenizer_dir=_shared(SHARED_GEMMA3_TOKENIZER, builtin_tokenizer),
        weights=Weights("model", seed=seed, std=init_std, dtype=dtype, spread_ranks=(2, 3, 4, 5), extra=extra))


def make_tiny_gemma4(folder: Path, *, seed: int = 0, init_std: float = 0.08, dtype=torch.float32) -> Path:
    """A random Gemma 4 checkpoint (gemma4's VISION_TINY and TEXT_TINY: a 2-layer tower, at most 70 soft tokens an
    image; five layers, the last two KV-shared, per-layer inputs, a 24-token window inside every image's run) with
    the built-in stand-in tokenizer; every RMSNorm weight with one is drawn too (Gemma 4 scales by w, Gemma 3 by
    1 + w, so either mistaken for the other differs)."""
    extra = {f"model.language_model.layers.{i}.{name}.weight": 0.5 for i in range(5) for name in (
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
        "self_attn.q_norm", "post_per_layer_input_norm")}
    extra.update({f"model.language_model.layers.{i}.self_attn.k_norm.weight": 0.5 for i in range(3)})  # unshared
    extra.update({"model.language_model.norm.weight": 0.5, "model.language_model.per_layer_projection_norm.weight": 0.5})
    return write_checkpoint("gemma4", folder, "tiny",
                            weights=Weights("model", seed=seed, std=init_std, dtype=dtype, spread_ranks=(2, 3),
                                            extra=extra))


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


def eval_args(checkpoint, images, files, out, *extra) -> list[str]:
    """`pope-fast eval`'s arguments over a write_pope_set: the model, images, each question file, out, on the CPU."""
    args = ["eval", "--model", checkpoint, "--images", images, "--out", out, "--device", "cpu", *extra]
    for f in files:
        args += ["--questions", f]
    return [str(a) for a in args]


def worst_difference(ours: dict[int, float], theirs: torch.Tensor) -> tuple[float, int]:
    """The largest |ours - theirs| over our candidate ids, and the id where it is."""
    diffs = {i: abs(v - float(theirs[i])) for i, v in ours.items()}
    worst = max(diffs, key=diffs.get)
    return diffs[worst], worst


def with_generation_config(checkpoint: Path, folder: Path, fields: dict) -> Path:
    """A copy of `checkpoint` whose generation_config.json also sets `fields` (what generate reads from it)."""
    import json
    import shutil

    folder = Path(shutil.copytree(checkpoint, folder))
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, **fields}))
    return folder


def generate_each(model, inputs_of, image, prompts: list[str], **generate) -> list[list[int]]:
    """transformers' generate for each prompt about `image`, one prompt at a time, without sampling: the new tokens
    (an oracle's continuations; `generate` gives the length, beams, and the rest)."""
    out = []
    for prompt in prompts:
        inputs = inputs_of(image, prompt)
        with torch.no_grad():
            out.append(model.generate(**inputs, do_sample=False, **generate)[0, inputs["input_ids"].shape[1]:].tolist())
    return out


def generated_text(engine, generated: list[int]) -> str:
    """What the engine's text readouts must see of transformers' generate output: the new tokens up
    to the first stop id, decoded without specials."""
    stop = next((k for k, t in enumerate(generated) if t in engine.model.stop_ids), len(generated))
    return engine.model.tokenizer.decode(generated[:stop], skip_special_tokens=True)


def bnb_nf4_oracle(model_class, checkpoint: Path):
    """transformers + bitsandbytes NF4 as the paper ran it (double quant, fp16 compute), on CPU, with
    bitsandbytes' CPU-only bf16-scale repack switched off so it computes the GPU path's numerics
    (see engine/test_engine_nf4)."""
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
    from pope_fast.readout.readouts import compare_max_logits

    ids = list(engine.readout.candidate_ids)
    ours = torch.tensor([answer.candidate_logits[i] for i in ids])
    step = float(torch.finfo(torch.float16).eps) * max(1.0, float(theirs[ids].abs().max()))
    diff = (ours - theirs[ids]).abs()
    assert float(diff.max()) <= 4 * step, f"{answer.question}: id {ids[int(diff.argmax())]} off by {diff.max()}"
    assert answer.first_token_id == int(theirs.argmax())
    for name in LOGIT_READOUTS:
        logits = {i: float(theirs[i]) for i in engine.readout.token_sets[name].ids}
        assert answer.predictions[name] == compare_max_logits(logits, engine.readout.token_sets[name]), (name, answer.question)


def edited_eager_attention(edit_scores):
    """A transformers attention function (for AttentionInterface.register): eager attention with
    `edit_scores(module, scores)` applied to the raw scores [B, H, Q, K] before the mask and softmax."""
    from transformers.models.llama.modeling_llama import repeat_kv

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = getattr(module, "num_key_value_groups", 1)
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        scores = edit_scores(module, torch.matmul(query, key.transpose(2, 3)) * scaling)
        # A registered attention function may get a boolean mask, or none and causality left to it (as sdpa).
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        elif attention_mask is not None:
            scores = scores + attention_mask
        elif getattr(module, "is_causal", False):
            q_len, k_len = scores.shape[-2:]
            scores = scores.masked_fill(~torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len), float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    return attention


@functools.cache
def qwen_processors(checkpoint: Path):
    """(tokenizer, image processor) of a Qwen-VL family checkpoint; its full processor also wants a video
    processor, which needs torchvision."""
    from transformers import AutoImageProcessor, AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint)), AutoImageProcessor.from_pretrained(str(checkpoint))


def qwen_inputs(checkpoint: Path, image, prompt: str, processors: tuple | None = None) -> dict:
    """What Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's processors make for one image (the image pad expanded to
    the merged grid, mm_token_type_ids), without their video half; `processors`: qwen_processors' already made."""
    tokenizer, image_processor = processors or qwen_processors(checkpoint)
    pixels = image_processor(images=image, return_tensors="pt")
    tokens = int(pixels["image_grid_thw"].prod()) // 4
    text = tokenizer(prompt.replace("<|image_pad|>", "<|image_pad|>" * tokens), return_tensors="pt")
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return dict(text, **pixels, mm_token_type_ids=(text["input_ids"] == image_id).int())
