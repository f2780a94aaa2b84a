"""Ready-made attention interventions: the image keys' attention logits edited per layer (see
Intervention.image_attention), from the question and answer positions, on the engine's one-step path."""
from __future__ import annotations

import math

from .llama import AttentionEdit, Intervention


class PAIAttention(Intervention):
    """PAI's own edit (Liu et al., ECCV 2024, "Paying More Attention to Image"; LALBJ/PAI attention.py):
    at the answer position only (the last query, and each generated token in turn), the image keys'
    logits s become s + alpha * |s| in layers first..last (inclusive). Its POPE commands use alpha 0.2
    and layers 2..31 of LLaMA-7B's 32 (range(2, 32)); `layers=None` takes 2 .. the model's last layer,
    which is that range on 32 layers. The full PAI method adds a contrast with the text-only prompt:
    engine.methods' `pai`."""

    def __init__(self, alpha: float = 0.2, layers: tuple[int, int] | None = None, num_layers: int | None = None):
        if layers is None:
            if num_layers is None:
                raise ValueError("PAIAttention needs layers=(first, last) or the model's num_layers")
            layers = (2, num_layers - 1)
        self.alpha, self.layers = alpha, layers

    def image_attention(self, layer: int):
        if self.layers[0] <= layer <= self.layers[1]:
            return AttentionEdit(magnitude=self.alpha, answer_only=True)
        return None


class ImageAttentionAmplification(Intervention):
    """Image attention multiplied by `alpha` before the softmax renormalizes it (bias log(alpha) on the
    image keys' logits) in layers first..last (inclusive), from every query after the image: the
    amplification PAI argues for, as an affine edit; PAIAttention is PAI's own (non-affine) edit."""

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
