"""The logit contrasts within the plausible tokens: (1 + alpha) l - alpha l_other against a noised
image (VCD) or a disturbing instruction (ICD), and M3ID's against the prompt without its image."""
from __future__ import annotations

import math

import torch

from .base import ALPHA, BETA, Method, Param, Pass, plausible
from .noise import DIFFUSION_STEPS, VCD_NOISE_STEP


def contrast(main: torch.Tensor, other: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    out = (1 + alpha) * main - alpha * other
    return out.masked_fill(~plausible(main, beta), float("-inf"))


class VCD(Method):
    name = "vcd"
    reference = ("Leng et al., Mitigating Object Hallucinations in Large Vision-Language Models "
                 "through Visual Contrastive Decoding, CVPR 2024 (DAMO-NLP-SG/VCD): (1 + alpha) l "
                 "- alpha l_noised where l >= log(beta) + max l, else -inf; noise step 500, alpha "
                 "1, beta 0.1 as its POPE scripts")
    defaults = {"alpha": 1.0, "beta": 0.1, "noise_step": VCD_NOISE_STEP, "seed": 0}
    text_only_refusal = ("it contrasts the image with a noised copy of it, and there is no image "
                         "to noise")
    params = {"alpha": ALPHA, "beta": BETA, "noise_step": Param(int, 0, DIFFUSION_STEPS - 1),
              "seed": Param(int, 0)}

    def passes(self, num_layers):
        s = self.settings
        return {"main": Pass(),
                "noised": Pass("noised", noise_step=int(s["noise_step"]), seed=int(s["seed"]))}

    def combine(self, logits):
        a = float(self.settings["alpha"])
        main, other = logits["main"], logits["noised"]
        return contrast(main, other, a, float(self.settings["beta"]))


class ICD(Method):
    """Chosen as the second contrastive family before M3ID came (below): M3ID weights its text-only
    contrast by (1 - exp(-lambda t)) / exp(-lambda t), about 0.02 at the first token with its lambda
    0.02, so on POPE's one position it is nearly the baseline; ICD contrasts at full strength there,
    and its pass (the same image under another system instruction) exercises what VCD's and PAI's do
    not."""

    name = "icd"
    reference = ("Wang et al., Mitigating Hallucinations in Large Vision-Language Models with "
                 "Instruction Contrastive Decoding, ACL Findings 2024 (p1k0pan/ICD): (1 + alpha) l "
                 "- alpha l_disturbed, the disturbance instruction as the system prompt, alpha 1, "
                 "beta 0.1")
    defaults = {"alpha": 1.0, "beta": 0.1,
                "instruction": "You are a confused objects detector to provide a fuzzy overview or "
                               "impression of the image."}
    params = {"alpha": ALPHA, "beta": BETA, "instruction": Param(str)}

    def passes(self, num_layers):
        return {"main": Pass(), "disturbed": Pass(system=str(self.settings["instruction"]))}

    def combine(self, logits):
        return contrast(logits["main"], logits["disturbed"], float(self.settings["alpha"]),
                         float(self.settings["beta"]))


# The step M3ID's gamma_t = exp(-lambda t) is taken at for the first generated token: t starts at 1
# and grows by one per token in the transcription (AvisC's avisc_utils/avisc_sample.py:94, t = 1;
# :248-250, gamma_t then t += 1).
M3ID_FIRST_STEP = 1


class M3ID(Method):
    """M3ID weights its text-only contrast by (1 - gamma_t) / gamma_t with gamma_t = exp(-lambda t),
    about 0.0202 at the first token with its lambda 0.02: on POPE's one position it is nearly the
    baseline (docs/methods.md). It is here for the comparison the field prints. The authors released
    no code; the arithmetic is the paper's equation as AvisC's authors transcribed it for their
    comparison (sangminwoo/AvisC avisc_utils/avisc_sample.py :246-269): l_c + (1 - gamma_t) /
    gamma_t (l_c - l_u) on log-probabilities, the unconditioned pass the prompt with its image token
    removed (experiments/llava/model/language_model/llava_llama.py:224-245), the plausibility cut
    beta 0.1 on the conditioned pass's logits."""

    name = "m3id"
    reference = ("Favero et al., Multi-Modal Hallucination Control by Visual Information "
                 "Grounding, CVPR 2024: log p + (1 - gamma) / gamma (log p - log p_text), gamma = "
                 "exp(-lambda t) at the first token (t = 1), where l >= log(beta) + max l, else "
                 "-inf; lambda 0.02, beta 0.1 (as sangminwoo/AvisC transcribes it)")
    defaults = {"lambda": 0.02, "beta": 0.1}
    text_only_refusal = ("it contrasts the prompt with itself without the image; with no image it "
                         "would record the baseline under M3ID's name")
    params = {"lambda": Param(float, 0.0, low_open=True), "beta": BETA}

    def passes(self, num_layers):
        return {"main": Pass(), "text": Pass("none")}

    def combine(self, logits):
        main, text = (torch.log_softmax(logits[k], dim=-1) for k in ("main", "text"))
        gamma = math.exp(-float(self.settings["lambda"]) * M3ID_FIRST_STEP)
        out = main + (1 - gamma) / gamma * (main - text)
        cut = ~plausible(logits["main"], float(self.settings["beta"]))
        return out.masked_fill(cut, float("-inf"))
