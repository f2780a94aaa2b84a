"""The pipeline the paper ran, as the benchmark's reference: the transformers model itself, one
question at a time, `generate(max_new_tokens=1, output_scores=True)` with the logits read from
`scores[0]` (bitsandbytes NF4 on CUDA, as published). It shares nothing with pope-fast but the
readout plan that turns logits into decisions."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from ..engine import PromptResult, Settings
from ..engine.transformers_model import TransformersModel
from ..readout import Question
from ..readout.readout_plan import ReadoutPlan
from .measure import median_run, peak_memory_mb, reset_peak_memory


@dataclass
class ReferenceSpec:
    """What the reference needs of the engine (so the engine's weights can be freed first): each
    question's prompt as the engine renders it, and the readouts to decide."""

    prompts: dict[str, str]
    readout: ReadoutPlan


def run_reference(checkpoint: Path, spec: ReferenceSpec, questions: list[Question], images: Path,
                  settings: Settings, repeat: int,
                  progress: Callable[[int], None] | None) -> tuple[dict, dict]:
    """The reference over `questions`, `repeat` timed runs after one untimed question; its figures
    (the median run's) and its decisions per (split, question id)."""
    from PIL import Image

    device = settings.torch_device
    reset_peak_memory(device)
    # the checkpoint's generation rules as generate applies them (the backend's model,
    # under "greedy")
    reference = TransformersModel(checkpoint, replace(settings, generation_config="greedy"))

    def answer(q: Question):
        inputs = reference.inputs([Image.open(images / q.image).convert("RGB")],
                                  [spec.prompts[q.text]])
        with torch.inference_mode():
            return reference.model.generate(**inputs, max_new_tokens=1, do_sample=False,
                                            output_scores=True, return_dict_in_generate=True)

    # untimed, as pope-fast's warmup: one-time costs are not per-question costs
    answer(questions[0])
    walls = []
    for _ in range(repeat):
        decisions = {}
        start = time.perf_counter()
        for q in questions:
            out = answer(q)
            scores = out.scores[0][0].float()
            logits = {i: float(scores[i]) for i in spec.readout.candidate_ids}
            result = PromptResult(first_token_id=int(out.sequences[0, -1]), candidate_logits=logits)
            decisions[q.split, q.key] = spec.readout.decide(result)
            if progress:
                progress(1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        walls.append(time.perf_counter() - start)
    wall = median_run(walls)
    figures = {"questions": len(questions), "wall_s": round(wall, 3),
               "questions_per_s": round(len(questions) / wall, 2),
               "runs_s": [round(w, 3) for w in walls],
               "peak_memory_mb": round(peak_memory_mb(device), 1)}
    return figures, decisions

