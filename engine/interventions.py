"""Ready-made attention interventions: the image keys' attention logits edited per layer (see
Intervention.image_attention), from the question and answer positions, on the engine's one-step path."""
from __future__ import annotations

import math

from .llama import Intervention


class ImageAttentionAmplification(Intervention):
    """Image attention multiplied by `alpha` before the softmax renormalizes it (bias log(alpha) on the
    image keys' logits) in layers first..last (inclusive): the amplification PAI (Liu et al., 2024,
    "Paying More Attention to Image") argues for, not PAI's own edit. PAI's code (LALBJ/PAI
    attention.py) changes the image logits of the last position only into s + alpha * |s|, in layers
    range(start_layer, end_layer), with alpha 0.2 and layers 2..31 in its POPE commands; that edit is
    not affine in s and is not reproduced here."""

    def __init__(self, alpha: float, layers: tuple[int, int]):
        if alpha <= 0:
            raise ValueError(f"alpha must be positive, not {alpha}")
        self.bias, self.layers = math.log(alpha), layers

    def image_attention(self, layer: int):
        return (1.0, self.bias) if self.layers[0] <= layer <= self.layers[1] else None


class ImageAttentionTemperature(Intervention):
    """The image keys' attention logits divided by `temperature` in layers first..last (inclusive): a
    sharper (T < 1) or flatter (T > 1) attention over the image, as AdaptVis (Chen et al., 2025) adapts
    it; AdaptVis picks T per question from the attention's confidence, which this fixed T does not."""

    def __init__(self, temperature: float, layers: tuple[int, int]):
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, not {temperature}")
        self.scale, self.layers = 1.0 / temperature, layers

    def image_attention(self, layer: int):
        return (self.scale, 0.0) if self.layers[0] <= layer <= self.layers[1] else None
