"""AvisC (Woo et al., "Don't Miss the Forest for the Trees: Attentional Vision Calibration for Large
Vision Language Models", 2024; sangminwoo/AvisC): the logits contrasted with a pass in which the
image tokens the answer position attends to little, in its most image-attentive layers, are zeroed,
leaving the few it over-attends ("blind" tokens)."""
from __future__ import annotations

import torch

from ..layers.interventions import Intervention
from .base import ALPHA, BETA, Method, Param, Pass
from .contrastive import contrast


def avisc_masked(weights: torch.Tensor, layer_gamma: float, lamb: float) -> torch.Tensor:
    """weights [L, N]: one question's answer-position attention over its N image tokens per layer,
    heads averaged → [N] bool, the tokens AvisC zeroes (avisc_sample.py:160-179): each layer's share
    of the image attention; the fewest layers, largest share first, whose cumulative share reaches
    layer_gamma (count_top_p, :138-145: those below it plus one); their weights averaged over those
    layers; every token below mean + lamb * std (the unbiased std, torch's default) of that
    average."""
    share = weights.sum(dim=1)
    share = share / share.sum()
    ranked = torch.sort(share / share.sum(), descending=True).values
    top = (torch.cumsum(ranked, 0) < layer_gamma).sum() + 1
    chosen = torch.topk(share, int(top)).indices
    image = weights[chosen].mean(dim=0)
    return image < image.mean() + image.std() * lamb


class AttentionRecorder(Intervention):
    """AvisC's first pass: the prompts run whole as they are, each row's answer-position attention
    over its image tokens kept per layer (heads averaged), by (image, prompt) of the call."""

    whole_prompt = True

    def __init__(self):
        self.seen: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.batch: list = []

    def rows(self, rows):
        self.batch = rows

    def attended(self, layer, weights, image):
        marked = image if image is not None else [None] * len(weights)
        for row, w, marks in zip(self.batch, weights, marked):
            if marks is not None and marks.any():
                self.seen.setdefault((row.item, row.prompt), []).append(w[marks].float())


class ImageTokenZeroing(Intervention):
    """AvisC's contrast pass (experiments/llava/model/language_model/llava_llama.py:93-112,
    masking_scheme "zeros"): the input embeddings of each row's masked image tokens ([N] bool per
    (image, prompt), in image-token order) set to 0 before the first layer, the prompt otherwise as
    it is; run whole, on the prompt only."""

    whole_prompt = True

    def __init__(self, masks: dict[tuple[int, int], torch.Tensor]):
        self.masks, self.batch = masks, []

    def rows(self, rows):
        self.batch = rows

    def embedded(self, x, image):
        out = x.clone()
        for b, row in enumerate(self.batch):
            mask = self.masks.get((row.item, row.prompt))
            if mask is not None and image is not None:
                slots = torch.nonzero(image[b])[:, 0]
                out[b, slots[mask.to(slots.device)]] = 0
        return out


class AvisC(Method):
    """AvisC as its POPE script sets it (eval_bench/scripts/pope_eval_batch.sh: layer_gamma 0.5,
    lamb 1.0, masking "zeros", cd_alpha 1.0, cd_beta 0.1): the first pass's attention weights pick
    the tokens (avisc_masked), the second pass zeroes them (ImageTokenZeroing), and the logits
    combine as avisc_sample.py:203-208 does: (1 + alpha) l - alpha l_masked where l >= log(beta) +
    max l, else -inf (l_masked falls back to l where it holds a NaN, :200-201). Its script samples
    (pope_eval_llavab.py:268); the answer position's logits are what it samples from. Both passes
    run whole prompts: the tokens zeroed depend on the question, and the first pass's attention over
    every image token is taken from its own queries and keys (the engine's image prefix holds the
    keys only)."""

    name = "avisc"
    reference = ("Woo et al., Don't Miss the Forest for the Trees: Attentional Vision Calibration "
                 "for Large Vision Language Models, 2024 (sangminwoo/AvisC): (1 + alpha) l - alpha "
                 "l_masked where l >= log(beta) + max l, else -inf, l_masked with the image tokens "
                 "below mean + lamb std of the answer position's attention (over the layers "
                 "holding layer_gamma of its image attention) zeroed; layer_gamma 0.5, lamb 1.0, "
                 "alpha 1.0, beta 0.1 as its POPE script (eval_bench/scripts/pope_eval_batch.sh)")
    defaults = {"layer_gamma": 0.5, "lamb": 1.0, "alpha": 1.0, "beta": 0.1}
    params = {"layer_gamma": Param(float, 0.0, 1.0, low_open=True), "lamb": Param(float),
              "alpha": ALPHA, "beta": BETA}
    text_only_refusal = ("it contrasts the prompt with itself with most of its image's tokens "
                         "zeroed, and there is no image to zero")

    def passes(self, num_layers):
        self._recorder = AttentionRecorder()  # what `later` reads: this run's first pass
        return {"main": Pass(edit=self._recorder, edit_name=f"avisc:attention:{id(self)}")}

    def later(self, results):
        gamma, lamb = float(self.settings["layer_gamma"]), float(self.settings["lamb"])
        masks = {key: avisc_masked(torch.stack(weights), gamma, lamb)
                 for key, weights in self._recorder.seen.items()}
        settings = ":".join(str(self.settings[k]) for k in ("layer_gamma", "lamb"))
        return {"masked": Pass(edit=ImageTokenZeroing(masks),
                               edit_name=f"avisc:{settings}:{id(self)}")}

    def combine(self, logits):
        main, other = logits["main"], logits["masked"]
        other = torch.where(torch.isnan(other).any(dim=-1, keepdim=True), main, other)
        return contrast(main, other, float(self.settings["alpha"]), float(self.settings["beta"]))
