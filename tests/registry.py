"""The families under test, one entry each (vLLM's tests/models/registry.py): how to make the tiny
checkpoint, the transformers class that is its oracle, what its processor makes of a prompt, and
which of test_battery's shared checks apply with which cases. A family file keeps only its quirks;
adding a family adds one entry here.

`Tiny` builds each family's checkpoint, transformers model and oracle once a session, on first use,
for the battery, the family files and the other folders' tests alike (tests/conftest.py hands it
out).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable

import torch
from familychecks import transformers_oracle
from tinymodels import (QUESTIONS, make_tiny_gemma3, make_tiny_gemma4, make_tiny_instructblip,
                        make_tiny_internvl, make_tiny_llava, make_tiny_llava_next,
                        make_tiny_llava_onevision, make_tiny_qwen2_5_vl, make_tiny_qwen2_vl,
                        make_tiny_qwen3_5, make_tiny_qwen3_5_moe, make_tiny_qwen3_vl,
                        make_tiny_qwen3_vl_moe, make_tiny, synthetic_image, tiny_dims)

from pope_fast.engine import Engine, Settings
from pope_fast.engine.models import family_class
from pope_fast.engine.transformers_model import TransformersInputs

# InternVL: (width, height) → tiles: 2 x 1 + thumbnail, 1 x 3 + thumbnail, square 2 x 2 (the tie
# with 1 x 1 goes to more tiles for an image this large) + thumbnail, one tile, 5 x 1 + thumbnail,
# 3 x 2 + thumbnail
INTERNVL_SIZES = [(200, 100), (100, 300), (120, 120), (56, 56), (300, 60), (333, 251)]
TILES = [3, 4, 5, 1, 6, 7]
PER_TILE = 4  # (56 / 14 * 0.5)²: tokens per tile after the pixel shuffle
# Qwen2.5-VL: merged token grids 2 x 3 and 3 x 2 (one prefix length, two position layouts, windows
# of 2 x 2 and a ragged one), 2 x 2 (exactly one window), 1 x 7 (four windows, the last of one
# token) and 5 x 5 (nine windows, ragged on both sides). Qwen3-VL: the same grids in 32-px units.
GRIDS = [(2, 3), (3, 2), (2, 2), (1, 7), (5, 5)]


# Llama 3.1's RoPE scaling (Idefics3-8B's language model) over 64 original positions: of the tiny
# model's 8 frequencies one is kept, two are blended and five divided by the factor, and the
# prompts' positions reach past 40
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def make_tiny_idefics3(folder: Path, *, seed: int = 0) -> Path:
    """engine/synthetic's tiny Idefics3 with its image processor's resize off: an image that fits
    one 56-px tile stays the global view alone (rows = cols = 0), a larger one is split, so one
    checkpoint has both prompt shapes; its language model's RoPE Llama 3.1's."""
    dims = tiny_dims("idefics3", text=dict(rope_parameters=LLAMA3_ROPE),
                     images={"do_resize": False})
    return make_tiny("idefics3", folder, dims, seed=seed, init_std=0.2, spread_ranks=(2,))


@lru_cache(maxsize=None)
def _reference_inputs(checkpoint: Path, name: str) -> TransformersInputs:
    """A checkpoint's reference inputs, its processor loaded once a session (a qwen stand-in's
    tokenizer and image processor take about a second to load, and the checks ask for them dozens of
    times)."""
    return TransformersInputs(checkpoint, Settings(), family_class(name))


@dataclass(frozen=True)
class NF4:
    """The NF4 check: the checkpoint's make_tiny_* arguments, the images (indices) it runs on, and
    what the family checks of the engine against the transformers + bitsandbytes model besides the
    decisions."""
    make: dict
    images: tuple[int, ...]
    check: Callable | None = None


@dataclass(frozen=True)
class Family:
    name: str                      # model_type
    make: Callable[..., Path]      # tinymodels.make_tiny_*(folder, **kwargs)
    model_class: str               # the transformers class of the oracle
    images: list
    questions: int                 # the oracle's questions: QUESTIONS[:questions]
    template: str | None = None    # the engine's default template, where the logits check
                                   # asserts it
    prompt: Callable | None = None      # question -> the oracle's prompt; None: the engine's
                                        # default prompt
    # (prefix_reuse, batch_size) of the logits check. engine.answer cuts one image's questions into
    # batches of batch_size and nothing else (inputs/plan.py make_plan): of three questions b2 runs
    # a batch of two rows and one of one, what b1 and b3 (or b32) run, so a further case of a path
    # would run its code again.
    logits: tuple = ((True, 2), (False, 3))
    counts_image_tokens: bool = False   # features as long as the oracle's run of image tokens
    run: tuple = ()                # (prefix_reuse, batch_size) of the one-run check over every
                                   # image
    run_items: Callable | None = None   # what the family asserts of that run's items
    continuations: tuple = ({},)   # Settings fields of the continuation check (each adds
                                   # max_new_tokens=4)
    continuation_images: int | None = None
    text_readouts: str = "string_parse"
    probe: tuple = ()              # image indices of the probe check
    nf4: NF4 | None = None
    methods: tuple = ()            # (prefix_reuse, batch_size) of test_methods' check
    tied: int | None = None        # the image index of the tied-head check
    pad_refusal: str | None = None  # what image_aspect="pad" is refused with
    notes: str = field(default="", compare=False)

    @property
    def oracle_questions(self) -> list[str]:
        return QUESTIONS[:self.questions]

    def transformers_class(self):
        import transformers

        return getattr(transformers, self.model_class)

    def inputs_of(self, checkpoint: Path):
        """(image, prompt) -> the transformers model's inputs, as the transformers backend makes
        them (the family's reference processor: engine/transformers_model.py TransformersInputs, the
        one reference path)."""
        inputs = _reference_inputs(checkpoint, self.name)
        return lambda image, prompt: inputs([image], [prompt])

    def oracle(self, checkpoint: Path, model=None) -> dict:
        """familychecks' oracle on the family's images and questions (the prompt its own or the
        engine's)."""
        prompt = self.prompt or Engine.load(checkpoint, Settings()).prompt
        model = model or self.transformers_class().from_pretrained(str(checkpoint),
                                                                   dtype=torch.float32).eval()
        return transformers_oracle(model, self.inputs_of(checkpoint), prompt, self.images,
                                   self.oracle_questions)


def _newline_is_fp16_source(engine, model) -> None:
    assert torch.equal(engine.model.newline, model.model.image_newline.data)


def _quantized(depth: int, expected: set[str]):
    def check(engine, model) -> None:
        import bitsandbytes as bnb

        quantized = {n.split(".")[depth] for n, m in model.named_modules()
                     if isinstance(m, bnb.nn.Linear4bit)}
        assert quantized == expected
    return check


def _projector_norm_is_kept(engine, model) -> None:
    assert torch.equal(engine.model.projector_norm[0],
                       model.model.multi_modal_projector.layer_norm.weight.data)


def _packed_when_asked(engine, model) -> None:
    assert engine.model.lm.layers[0].q_proj.packed is not None \
        or engine.model.settings.nf4_weights != "packed"


def _at_least_three_lengths(items) -> None:
    assert len({item.features.shape[0] for item in items}) >= 3


def _one_length_per_image(items) -> None:
    assert len({item.features.shape[0] for item in items}) == len(items)


def _two_grids_of_one_length(items) -> None:
    """2 x 3 and 3 x 2 grids: one prefix length, different M-RoPE positions, one prefill."""
    assert items[0].features.shape[:2] == (2, 3) and items[1].features.shape[:2] == (3, 2)


def _tiles_and_global_view(items) -> None:
    """Idefics3's features [rows + 1, cols, ...]: 2 x 2 tiles, 2 x 1, the global view alone (three
    prefix lengths)."""
    assert [tuple(item.features.shape[:2]) for item in items] == [(3, 2), (3, 1), (1, 1)]


def _the_grids(items) -> None:
    assert [tuple(item.features.shape[:2]) for item in items] == GRIDS


_QWEN_NF4 = NF4(dict(vision_dim=64, seed=9), (3, 4), _quantized(1, {"visual", "language_model"}))
# prefix batches of 2 and of 1; whole ones of 1 and of 3
_THREE_CASES = ((True, 2), (False, 1), (False, 3))

REGISTRY = {f.name: f for f in [
    Family("llava", make_tiny_llava, "LlavaForConditionalGeneration",
           [synthetic_image(i, size) for i, size in enumerate([(90, 70), (42, 42), (50, 120)])], 6,
           prompt=lambda q: f"USER: <image>\n{q}\nASSISTANT:",
           logits=((True, 1), (True, 4), (False, 3)), continuations=({"batch_size": 4},),
           text_readouts="string_parse,exact_match",
           notes="its run over every image (prefix counts, texts) is test_llava's; NF4 is "
                 "engine/test_engine_nf4's"),
    # (width, height): wide (unpad rows), tall (unpad columns), square, very wide (a 1 x 3 grid),
    # tiny
    Family("llava_next", make_tiny_llava_next, "LlavaNextForConditionalGeneration",
           [synthetic_image(i + 11, size)
            for i, size in enumerate([(90, 40), (40, 90), (60, 60), (120, 30), (20, 18)])], 3,
           template="mistral_inst",
           prompt="[INST] <image>\n{} Answer yes or no only. [/INST]".format,
           counts_image_tokens=True,
           run=((True, 4),), run_items=_at_least_three_lengths, continuation_images=3,
           nf4=NF4(dict(vision_hidden=64, seed=5), (0, 1, 2), _newline_is_fp16_source),
           pad_refusal="LLaVA-NeXT tiles every image"),
    # (width, height): square on a 4 x 4 grid (reduced), wide on 4 x 4 (unpad rows, then reduced),
    # wide and tall on 2-crop grids (unpad rows / columns), one crop, very wide (a 1 x 3 grid)
    Family("llava_onevision", make_tiny_llava_onevision, "LlavaOnevisionForConditionalGeneration",
           [synthetic_image(i + 11, size)
            for i, size in enumerate([(200, 200), (220, 170), (90, 40), (40, 90), (30, 30),
                                      (300, 100)])], 3,
           template="llava_onevision_chat",
           counts_image_tokens=True, run=((True, 4),), run_items=_one_length_per_image,
           continuations=({"prefix_reuse": True, "batch_size": 2},
                          {"prefix_reuse": False, "batch_size": 2}),
           probe=(0, 2), nf4=NF4(dict(vision_hidden=64, seed=5), (1, 3), _newline_is_fp16_source),
           methods=((True, 2),), tied=2, pad_refusal="LLaVA-OneVision tiles every image"),
    Family("internvl", make_tiny_internvl, "InternVLForConditionalGeneration",
           [synthetic_image(i + 21, size) for i, size in enumerate(INTERNVL_SIZES)], 3,
           template="internvl_chat", logits=_THREE_CASES,
           run=((True, 4),), run_items=_one_length_per_image,
           continuations=({"prefix_reuse": True, "batch_size": 2},
                          {"prefix_reuse": False, "batch_size": 2}),
           probe=(5, 3), nf4=NF4(dict(vision_hidden=64, seed=5), (3, 5), _projector_norm_is_kept),
           methods=((True, 2),), tied=3, pad_refusal="InternVL3 tiles every image"),
    Family("instructblip", make_tiny_instructblip, "InstructBlipForConditionalGeneration",
           [synthetic_image(i + 31, size)
            for i, size in enumerate([(90, 40), (40, 90), (60, 60)])], 4,
           template="instructblip",
           prompt=lambda q: f"Question: {q} Answer yes or no only. Answer:",
           logits=((True, 1), (True, 5)), run=((True, 7),),
           nf4=NF4(dict(vision_hidden=64, qformer_hidden=64, seed=7), (0, 1),
                   _quantized(0, {"vision_model", "qformer", "language_projection",
                                  "language_model"})),
           notes="no text-only path: its image tokens are the Q-Former's, read per prompt"),
    # Merged token grids 2 x 3 and 3 x 2 (six tokens each: one prefix length, two position layouts),
    # 2 x 2, and 1 x 7 (the text after it moves on by 7, its token count; the others by their longer
    # side).
    Family("qwen2_vl", make_tiny_qwen2_vl, "Qwen2VLForConditionalGeneration",
           [synthetic_image(i + 41, size)
            for i, size in enumerate([(90, 40), (40, 90), (60, 60), (200, 30)])], 3,
           template="qwen2_vl_chat", run=((True, 4),), run_items=_two_grids_of_one_length,
           nf4=NF4(dict(vision_dim=64, seed=9), (0, 1),
                   _quantized(1, {"visual", "language_model"}))),
    Family("qwen2_5_vl", make_tiny_qwen2_5_vl, "Qwen2_5_VLForConditionalGeneration",
           [synthetic_image(i + 51, size)
            for i, size in enumerate([(90, 40), (40, 90), (60, 60), (200, 30), (140, 140)])], 3,
           template="qwen2_vl_chat", logits=_THREE_CASES, run=((True, 8),), run_items=_the_grids,
           nf4=_QWEN_NF4),
    Family("qwen3_vl", make_tiny_qwen3_vl, "Qwen3VLForConditionalGeneration",
           [synthetic_image(i + 61, size)
            for i, size in enumerate([(100, 60), (60, 100), (64, 64), (230, 35), (160, 160)])], 3,
           template="qwen2_vl_chat", logits=_THREE_CASES, run=((True, 8),), run_items=_the_grids,
           continuations=({"prefix_reuse": True}, {"prefix_reuse": False}), probe=(0, 4),
           nf4=_QWEN_NF4),
    Family("qwen3_vl_moe", make_tiny_qwen3_vl_moe, "Qwen3VLMoeForConditionalGeneration",
           [synthetic_image(i + 71, size)
            for i, size in enumerate([(100, 60), (60, 100), (64, 64), (230, 35), (160, 160)])], 3,
           template="qwen2_vl_chat", logits=_THREE_CASES, run=((True, 8),), run_items=_the_grids,
           continuations=({"prefix_reuse": True}, {"prefix_reuse": False}), probe=(0, 3),
           nf4=_QWEN_NF4),
    # Grids 2 x 3 and 3 x 2 (one prefix length, two position layouts); the stand-in tokenizer (no
    # Qwen3.5 one is in ../shared). Small: its 248,320-row lm_head makes each step of generate slow.
    # No probe, methods or NF4: the hybrid decoder refuses interventions and the probe; NF4 is not
    # checked yet.
    Family("qwen3_5", make_tiny_qwen3_5, "Qwen3_5ForConditionalGeneration",
           [synthetic_image(i + 81, size) for i, size in enumerate([(100, 60), (60, 100)])], 2,
           template="qwen3_5_chat", logits=((True, 1), (False, 2)), run=((True, 8),),
           run_items=_two_grids_of_one_length, continuations=(),
           nf4=NF4(dict(seed=5), (0, 1), _quantized(1, {"visual", "language_model"})),
           notes="its continuations are test_qwen3_5's, token for token (the stand-in decodes most "
                 "ids to nothing)"),
    # Qwen3.5's images and cases, every MLP a mixture of experts with a shared one (its fused
    # layout: test_qwen3_5_moe)
    Family("qwen3_5_moe", make_tiny_qwen3_5_moe, "Qwen3_5MoeForConditionalGeneration",
           [synthetic_image(i + 81, size) for i, size in enumerate([(100, 60), (60, 100)])], 2,
           template="qwen3_5_chat", logits=((True, 1), (False, 2)), run=((True, 8),),
           run_items=_two_grids_of_one_length, continuations=(),
           nf4=NF4(dict(seed=5), (0, 1), _quantized(1, {"visual", "language_model"})),
           notes="its continuations are test_qwen3_5's (the same decoder but for the MLP)"),
    # The built-in stand-in tokenizer (Gemma's special-token ids, Yes/No and turn format):
    # gemma-3-4b-it's real one takes seconds to load on 2 cores, once per engine, processor and
    # checkpoint. The checks of what the real tokenizer renders are test_gemma3's, on a checkpoint
    # of their own.
    Family("gemma3", partial(make_tiny_gemma3, builtin_tokenizer=True),
           "Gemma3ForConditionalGeneration",
           [synthetic_image(i + 31, size)
            for i, size in enumerate([(90, 70), (40, 90), (64, 64)])], 3,
           template="gemma3_chat",
           logits=((True, 1), (True, 32), (False, 3)),
           run=((True, 4), (False, 4)),
           continuations=({"prefix_reuse": True, "batch_size": 2},
                          {"prefix_reuse": False, "batch_size": 2}),
           probe=(0, 1), nf4=NF4(dict(vision_hidden=64, seed=5), (0, 1), _packed_when_asked),
           methods=((True, 2), (False, 3)),
           pad_refusal="Gemma 3 resizes every image to its square"),
    # Every prompt outgrows the 24-token sliding window (inside each image's run of soft tokens), so
    # each check runs the window on prompts, prefixes and continuations; the probe and methods,
    # which refuse prompts past the window, are not run. Three aspect ratios: three soft-token
    # counts (test_gemma4 checks them against the class's; the one-run check over every image is
    # left out for the suite's time: the logits check answers each image).
    Family("gemma4", make_tiny_gemma4, "Gemma4ForConditionalGeneration",
           [synthetic_image(i + 41, size)
            for i, size in enumerate([(90, 70), (40, 90), (64, 64)])], 2,
           template="gemma4_chat", logits=((True, 2), (False, 3)), counts_image_tokens=True,
           continuations=({"prefix_reuse": True, "batch_size": 2},),
           nf4=NF4(dict(seed=5), (0, 1),
                   _quantized(1, {"vision_tower", "language_model", "embed_vision"})),
           pad_refusal="Gemma 4 resizes every image within its patch budget"),
    # (width, height) → tiles: 2 x 2 + the global view, 2 rows x 1 column + the global view, the
    # global view alone (it fits one tile: unsplit)
    Family("idefics3", make_tiny_idefics3, "Idefics3ForConditionalGeneration",
           [synthetic_image(i + 91, size)
            for i, size in enumerate([(90, 60), (50, 110), (40, 40)])], 3,
           template="idefics3_chat", run=((True, 4),), run_items=_tiles_and_global_view,
           probe=(0, 2), methods=((True, 2),), pad_refusal="Idefics3 tiles every image",
           nf4=NF4(dict(seed=5), (0, 1),
                   _quantized(1, {"vision_model", "connector", "text_model"}))),
]}
# A registered family outside the battery, with the reason
# (test_every_registered_family_is_in_the_battery).
EXEMPT = {"mplug_owl2": "no transformers class; test_mplug_owl2 checks the engine against "
                        "upstream's outputs stored in ../shared/fixtures/mplug_owl2_tiny, so none "
                        "of the battery's checks apply"}


class Tiny:
    """Each family's tiny checkpoint, fp32 transformers model and oracle, made on first use, kept
    for the session."""

    def __init__(self, root: Path):
        self.root, self._checkpoints, self._models, self._oracles = root, {}, {}, {}

    def checkpoint(self, name: str) -> Path:
        if name not in self._checkpoints:
            self._checkpoints[name] = REGISTRY[name].make(self.root / f"tiny_{name}" / "ckpt")
        return self._checkpoints[name]

    def model(self, name: str):
        if name not in self._models:
            cls = REGISTRY[name].transformers_class()
            self._models[name] = cls.from_pretrained(str(self.checkpoint(name)),
                                                     dtype=torch.float32).eval()
        return self._models[name]

    def oracle(self, name: str) -> dict:
        if name not in self._oracles:
            family = REGISTRY[name]
            self._oracles[name] = family.oracle(self.checkpoint(name), self.model(name))
        return self._oracles[name]
