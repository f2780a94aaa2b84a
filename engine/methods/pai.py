"""PAI: the image's attention amplified at the answer position, contrasted with
the prompt without its image."""
from __future__ import annotations

import torch

from ..layers.interventions import PAIAttention
from .base import ALPHA, BETA, LayerSpan, Method, Param, Pass, layer_range, plausible


class PAI(Method):
    name = "pai"
    reference = ("Liu et al., Paying More Attention to Image, ECCV 2024 (LALBJ/PAI): image logits "
                 "s + alpha |s| at the answer position in layers 2..31, then gamma (log p - log "
                 "p_text) + log p_text where log p >= log(beta) + max log p, else -inf; alpha 0.2, "
                 "gamma 1.1, beta 0.1 as its POPE command")
    defaults = {"alpha": 0.2, "gamma": 1.1, "beta": 0.1, "layers": None}
    text_only_refusal = ("it scales attention to the image and contrasts the prompt with itself "
                         "without the image; with no image it would record the baseline under "
                         "PAI's name")
    params = {"alpha": ALPHA, "gamma": Param(float, 0.0), "beta": BETA, "layers": LayerSpan("2-31")}

    def passes(self, num_layers):
        layers = layer_range(self.settings["layers"], num_layers)
        edit = PAIAttention(float(self.settings["alpha"]), layers)
        name = f"pai:{self.settings['alpha']}:{layers[0]}-{layers[1]}"
        return {"main": Pass(edit=edit, edit_name=name), "text": Pass("none")}

    def resolved(self, num_layers):
        if num_layers is None or self.settings["layers"] is not None:
            return dict(self.settings)
        first, last = layer_range(None, num_layers)
        return {**self.settings, "layers": f"{first}-{last}"}

    def combine(self, logits):
        main, text = (torch.log_softmax(logits[k], dim=-1) for k in ("main", "text"))
        gamma = float(self.settings["gamma"])
        out = gamma * (main - text) + text
        return out.masked_fill(~plausible(main, float(self.settings["beta"])), float("-inf"))
