"""`pope-fast verify`: a user's own proof, on their checkpoint and their device, that the engine
(or, with backend "transformers", the transformers backend's batched, left-padded run) computes what
transformers' class of the checkpoint computes one prompt at a time. A few questions (POPE-shaped,
on synthetic images or the user's) go through both: the candidate logits at the answer position, the
argmax, every logit readout's decision and the greedy continuation (both applying the checkpoint's
generation_config.json, as transformers' generate does).

They agree when every candidate logit is within four steps of the dtype at the logits' scale (fp32:
1e-4 of it; rounding in another order is all that may differ), the argmaxes and decisions are equal
(a decision between two logits closer than that bound is a near-tie, reported, not failed) and the
continuations are the same text. A candidate logit that is not finite on either side is a
disagreement (no bound holds a NaN). The exit status says which: 0 agree, 1 disagree,
NOTHING_VERIFIED where no engine family or no transformers class holds the model, so a gate on it
never passes having checked nothing.
"""
from __future__ import annotations

import gc
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from .engine import Settings, load_engine
from .engine.utils.loader import read_config
from .engine.models import engine_refusal, family_class
from .engine.transformers_model import TransformersModel
from .engine.synthetic import builtin_questions, write_images
from .readout import LOGIT_READOUTS
from .readout.readouts import compare_max_logits

# the relative bound per dtype: four steps of its significand (fp32: 1e-4, what the suite holds on
# tiny models)
BOUND = {torch.float32: 1e-4, torch.float16: 4 * 2.0**-10, torch.bfloat16: 4 * 2.0**-7}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
# verify's exit status where there was nothing to compare (1 is a disagreement or an error)
NOTHING_VERIFIED = 3


@dataclass
class Verdict:
    """What verify found; `agrees` decides the exit status."""

    model: str
    questions: int = 0
    worst_logit: float = 0.0  # the largest |ours - theirs| over every candidate logit
    scale: float = 1.0  # the largest |candidate logit| transformers gave (at least 1)
    bound: float = 0.0  # what worst_logit may reach: BOUND of the dtype, times the scale
    argmax_equal: int = 0
    decisions: dict[str, int] = field(default_factory=dict)  # readout -> questions decided alike
    near_ties: list[str] = field(default_factory=list)
    continuations_equal: int = 0
    disagreements: list[str] = field(default_factory=list)
    nothing_to_compare: str | None = None
    ours: str = "the engine"  # what was held against the class

    @property
    def agrees(self) -> bool:
        return not self.disagreements

    @property
    def exit_status(self) -> int:
        return NOTHING_VERIFIED if self.nothing_to_compare else 0 if self.agrees else 1

    def summary(self) -> str:
        if self.nothing_to_compare:
            return (f"{self.model}: nothing to compare ({self.nothing_to_compare}); "
                    f"nothing verified (exit status {NOTHING_VERIFIED})")
        n = self.questions
        lines = [f"{self.model}: {n} questions through {self.ours} and transformers' class",
                 f"worst candidate-logit difference {self.worst_logit:.3g} "
                 f"(bound {self.bound:.3g})",
                 f"argmax equal {self.argmax_equal}/{n}; "
                 f"continuations equal {self.continuations_equal}/{n}",
                 "decisions equal: " + ", ".join(f"{r} {k}/{n}" for r, k in self.decisions.items())]
        lines += [f"near-tie (not counted): {t}" for t in self.near_ties]
        count = len(self.disagreements)
        lines.append("agree" if self.agrees else f"DISAGREE: {self.disagreements[0]}"
                     + (f" (and {count - 1} more)" if count > 1 else ""))
        return "\n".join(lines)


def verify(model_dir: Path, *, n_questions: int = 8, images_dir: str | Path | None = None,
           dtype: str | None = None, quant: str = "none", device: str | None = None,
           max_new_tokens: int = 8, backend: str = "engine") -> Verdict:
    """The engine (backend "transformers": the transformers backend, its questions about an image
    batched) against transformers' class one prompt at a time on `model_dir`, in `dtype` (default:
    fp32 on CPU, fp16 on CUDA and with NF4) and `quant`, on `device` (default: cuda when
    available)."""
    verdict = Verdict(str(model_dir),
                      ours="the engine" if backend == "engine" else "the transformers backend")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    images_dir = None if images_dir is None else Path(images_dir)
    config = read_config(Path(model_dir))
    if backend == "engine" and (why := engine_refusal(config)) is not None:  # no family that fits
        verdict.nothing_to_compare = (f"{why}; --backend transformers holds the backend that runs "
                                      "it against the class")
        return verdict
    family = family_class(config["model_type"]) if backend == "engine" else None
    if family is not None and family.reference_unavailable:
        verdict.nothing_to_compare = family.reference_unavailable
        return verdict
    # both sides apply the checkpoint's generation rules, and read a thinking checkpoint's prompt
    # with thinking off (the one prompt the class is handed; a checkpoint that does not think
    # renders as it does without it)
    settings = Settings(device=device, dtype=dtype, quant=quant, max_new_tokens=max_new_tokens,
                        generation_config="greedy", thinking="off")
    engine = load_engine(model_dir, settings, backend=backend, readouts="all")
    with tempfile.TemporaryDirectory() as tmp:
        asked = _questions(n_questions, images_dir, Path(tmp))
        ours = {(path, q): answer for path, texts in asked.items()
                for q, answer in zip(texts, engine.answer(path, texts))}
        prompts = {q: engine.prompt(q) for _, q in ours}
        side = Ours(engine.readout.token_sets, engine.model.stop_ids, engine.model.tokenizer,
                    settings.torch_dtype)
        del engine  # its weights go before transformers' come: one model on the device at a time
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        reference = TransformersModel(Path(model_dir).expanduser().resolve(), settings)
        for (path, question), answer in ours.items():
            logits, generated = reference.answer(Image.open(path), prompts[question],
                                                 max_new_tokens)
            compare_one(verdict, side, question, answer, logits, generated)
    verdict.bound = BOUND[settings.torch_dtype] * verdict.scale
    # NaN where a logit was not finite: failed per question, in compare_one
    if verdict.worst_logit > verdict.bound:
        verdict.disagreements.insert(0, f"a candidate logit differs by {verdict.worst_logit:.3g}, "
                                        f"over the bound {verdict.bound:.3g}")
    return verdict


def _questions(n: int, images_dir: Path | None, tmp: Path) -> dict[Path, list[str]]:
    """Image path -> the questions asked of it: the built-in POPE-shaped ones (six an image), on
    synthetic images, or on the first images of `images_dir` in name order."""
    questions = builtin_questions(n)
    names = list(dict.fromkeys(q.image for q in questions))
    if images_dir is None:
        folder = write_images(tmp, names)
        paths = [folder / name for name in names]
    else:
        images = sorted(p for p in Path(images_dir).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        paths = images[:len(names)]
        if len(paths) < len(names):
            raise ValueError(f"--images {images_dir}: {len(names)} images wanted (JPEG or PNG), "
                             f"{len(paths)} found")
    by_name = dict(zip(names, paths))
    asked: dict[Path, list[str]] = {}
    for q in questions:
        asked.setdefault(by_name[q.image], []).append(q.text)
    return asked


@dataclass(frozen=True)
class Ours:
    """What the comparison reads of the engine once its weights are gone."""

    token_sets: dict
    stop_ids: set[int]
    tokenizer: object
    dtype: torch.dtype


def compare_one(verdict: Verdict, engine: Ours, question: str, answer, logits: torch.Tensor,
                generated: list[int]):
    """One question's four comparisons, added to the verdict."""
    verdict.questions += 1
    ids = sorted(answer.candidate_logits)
    bad = {side: {i: v for i, v in values.items() if not math.isfinite(v)} for side, values in (
        ("here", answer.candidate_logits), ("in transformers", {i: float(logits[i]) for i in ids}))}
    # max() and > read past a NaN (max(0.0, nan) is 0.0): named, and the worst is NaN
    if any(bad.values()):
        verdict.worst_logit = math.nan
        verdict.disagreements.append(f"{question!r}: candidate logits not finite " + "; ".join(
            f"{side} ({', '.join(f'{i}: {v}' for i, v in list(values.items())[:4])})"
            for side, values in bad.items() if values))
        return
    scale = float(logits[ids].abs().max())
    verdict.scale = max(verdict.scale, scale)
    difference = max(abs(answer.candidate_logits[i] - float(logits[i])) for i in ids)
    worst = verdict.worst_logit
    verdict.worst_logit = worst if math.isnan(worst) else max(worst, difference)
    if answer.first_token_id == int(logits.argmax()):
        verdict.argmax_equal += 1
    else:
        verdict.disagreements.append(f"{question!r}: argmax {answer.first_token_id} here, "
                                     f"{int(logits.argmax())} in transformers")
    step = BOUND[engine.dtype] * max(1.0, scale)
    for name in LOGIT_READOUTS:
        if name not in engine.token_sets:
            continue
        sets = engine.token_sets[name]
        theirs = compare_max_logits({i: float(logits[i]) for i in sets.ids}, sets)
        if answer.predictions.get(name) == theirs:
            verdict.decisions[name] = verdict.decisions.get(name, 0) + 1
            continue
        margin = abs(max(float(logits[i]) for i in sets.yes_ids)
                     - max(float(logits[i]) for i in sets.no_ids))
        (verdict.near_ties if margin <= 2 * step else verdict.disagreements).append(
            f"{question!r}: {name} says {answer.predictions.get(name)} here, "
            f"{theirs} in transformers "
            f"(yes - no margin {margin:.3g})")
    stop = next((k for k, t in enumerate(generated) if t in engine.stop_ids), len(generated))
    text = engine.tokenizer.decode(generated[:stop], skip_special_tokens=True)
    if (answer.decoded or "") == text:
        verdict.continuations_equal += 1
    else:
        verdict.disagreements.append(f"{question!r}: continuation {answer.decoded!r} here, "
                                     f"{text!r} in transformers")
