"""VISTA (Li et al., "The Hidden Life of Tokens: Reducing Hallucination of Large Vision-Language
Models via Visual Information Steering", ICML 2025; LzVv123456/VISTA): each question's own visual
steering vector, the answer position's residual streams with its image minus without it, turns every
layer's MLP output toward it; the logits then mix with the mean logits of a window of late layers
(self-logits augmentation)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers.interventions import Intervention
from .base import LayerSpan, Method, Param, Pass, layer_range


def steering_vector(with_image: torch.Tensor, without: torch.Tensor) -> torch.Tensor:
    """One question's visual steering vector [L, H] from its answer position's residual streams [L,
    H] with and without its image, as obtain_vsv computes it from one pair
    (steering_vector.py:113-129): the difference, flattened, through a rank-1 PCA fitted on that one
    row (myutils.py:114-130), then the component plus the mean. With one row the mean is the
    difference and the centred data is zero, whose first right singular vector LAPACK's SVD (on the
    CPU, where its hidden states are: :107) returns as the first unit vector, sign kept by svd_flip:
    so the vector is the difference with 1 added to the first layer's first coordinate."""
    vector = with_image.float() - without.float()
    vector[0, 0] += 1
    return vector


def default_lens(num_layers: int) -> tuple[int, int]:
    """The window of the logits augmentation where none is given: 25-30 on LLaVA-1.5-7B's 32 layers
    (pope_eval.py:36), the same place from the end elsewhere (the last layer's index - 6 to - 1,
    within the model)."""
    return max(0, num_layers - 7), max(0, num_layers - 2)


class VISTASteering(Intervention):
    """VISTA's steered pass (VSVLayer.forward, llm_layers.py:15-34, wrapped around every decoder
    layer's MLP at :148-150): row r's MLP output x becomes ||x|| normalize(normalize(x) + lam (1 +
    max(0, cos(x, -v_l))) normalize(v_l)) at every position, v_l its question's vector in layer l,
    in fp32 and back to the model's dtype (VISTA returns fp16, its model's). The vector depends on
    the question, so the pass runs whole prompts; `vectors` holds it per (image, prompt) of the
    call, and `rows` picks each batch's. lens_layers: the augmentation's window."""

    whole_prompt = True

    def __init__(self, vectors: dict[tuple[int, int], torch.Tensor], lam: float,
                 lens: tuple[int, int]):
        self.vectors, self.lam, self.lens_layers = vectors, lam, lens
        self.batch: torch.Tensor | None = None

    def rows(self, rows: list) -> None:
        try:
            # [B, L, H]
            self.batch = torch.stack([self.vectors[row.item, row.prompt] for row in rows])
        except KeyError as err:
            raise ValueError(f"VISTASteering: no steering vector for image {err.args[0][0]}, "
                             f"prompt {err.args[0][1]} of the call") from None

    def mlp(self, layer: int, out: torch.Tensor, part: str) -> torch.Tensor:
        if part == "prefix" or self.batch is None or self.batch.shape[0] != out.shape[0]:
            raise ValueError("VISTASteering steers each question with its own vector: run its "
                             f"prompts whole, one batch of rows at a time (got a {part} of "
                             f"{out.shape[0]} rows)")
        vector = self.batch[:, layer, None, :].to(out.device)  # [B, 1, H]
        x = out.float()
        weight = 1 + F.cosine_similarity(x, -vector, dim=-1).clamp(min=0).unsqueeze(-1)
        turned = F.normalize(F.normalize(x, dim=-1)
                             + self.lam * weight * F.normalize(vector, dim=-1), dim=-1)
        return (turned * x.norm(dim=-1, keepdim=True)).to(out.dtype)


class VISTA(Method):
    """VISTA as its POPE script runs it (run_pope.sh: --vsv --vsv-lambda 0.01 --logits-aug
    --logits-alpha 0.3; greedy, pope_eval.py:41): per question, the steering vector from the
    baseline pass and the prompt without its image tokens (model_loader.py:368-424, the null
    prompt), both unsteered (pope_eval.py:116-122); then the steered pass, whose logits are
    logits_alpha times the mean of layers logits_layers' lm_head outputs (no final norm but the last
    layer's: llava_llama.py:93-103 over transformers' hidden_states) plus (1 - logits_alpha) times
    its own."""

    name = "vista"
    reference = ("Li et al., The Hidden Life of Tokens: Reducing Hallucination of Large "
                 "Vision-Language Models via Visual Information Steering, ICML 2025 "
                 "(LzVv123456/VISTA): every MLP output x -> ||x|| normalize(normalize(x) + lambda "
                 "(1 + max(0, cos(x, -v))) normalize(v)), v the question's residual streams with "
                 "minus without its image; then alpha mean(lm_head(h_l), l in logits_layers) + (1 "
                 "- alpha) l; vsv_lambda 0.01, logits_alpha 0.3, logits_layers 25-30 as "
                 "run_pope.sh and pope_eval.py:31-37")
    defaults = {"vsv_lambda": 0.01, "logits_alpha": 0.3, "logits_layers": None}
    params = {"vsv_lambda": Param(float, 0.0), "logits_alpha": Param(float, 0.0, 1.0),
              "logits_layers": LayerSpan("25-30")}
    residuals = True
    text_only_refusal = ("its steering vector is what the image adds to the residual stream; with "
                         "no image it would record the baseline under VISTA's name")

    def lens(self, num_layers: int) -> tuple[int, int]:
        spec = self.settings["logits_layers"]
        if spec is None:
            return default_lens(num_layers)
        try:
            return layer_range(spec, num_layers)
        except ValueError as err:
            raise ValueError(f"method vista: logits_{err}") from None

    def passes(self, num_layers):
        self.lens(num_layers)  # refused here, before any pass runs
        return {"main": Pass(), "text": Pass("none")}

    def later(self, results):
        vectors = {(i, j): steering_vector(main.residuals, text.residuals)
                   for i, (mains, texts) in enumerate(zip(results["main"], results["text"]))
                   for j, (main, text) in enumerate(zip(mains, texts))}
        layers = next(iter(vectors.values())).shape[0] if vectors else 1
        lam, lens = float(self.settings["vsv_lambda"]), self.lens(layers)
        edit = VISTASteering(vectors, lam, lens)
        return {"steered": Pass(edit=edit, edit_name=f"vista:{lam}:{lens[0]}-{lens[1]}")}

    def combine(self, logits):
        alpha = float(self.settings["logits_alpha"])
        return alpha * logits["steered:lens"] + (1 - alpha) * logits["steered"]

    def resolved(self, num_layers):
        if num_layers is None or self.settings["logits_layers"] is not None:
            return dict(self.settings)
        first, last = default_lens(num_layers)
        return {**self.settings, "logits_layers": f"{first}-{last}"}
