"""ClearSight's Visual Amplification Fusion: in the middle layers, the queries after the image weigh
the image's keys up and the system prompt's down."""
from __future__ import annotations

from ..layers.interventions import VisualAmplification
from .base import LayerSpan, Method, Param, Pass, layer_range


class ClearSight(Method):
    """VAF as ClearSight's POPE inference runs it (ustc-hyin/ClearSight
    visaug/inference/infer_pope.sh: --use-visaug --enh-para 1.15 --sup-para 0.95; greedy generate,
    infer_pope.py:91-96): AttnAdapter (AttnAdapter.py:68-78) in layers 9..14 (infer_pope.py:53-58,
    `i > 8 and i < 15` of LLaVA-1.5-7B's 32), each query after the image multiplying the image keys'
    attention logits by enh_para and the system prompt's (every key before the image) by sup_para
    (engine.layers.interventions.VisualAmplification). One pass, read at the answer position: its
    continuation would need the edit in every decode step (AttnAdapter applies it there too), which
    the engine's decode does not."""

    name = "clearsight"
    reference = ("Yin et al., ClearSight: Visual Signal Enhancement for Object Hallucination "
                 "Mitigation in Multimodal Large Language Models, CVPR 2025 "
                 "(ustc-hyin/ClearSight): in layers 9-14, the queries after the image scale the "
                 "image keys' attention logits by enh_para and the system prompt's by sup_para; "
                 "1.15 and 0.95 as its POPE script (visaug/inference/infer_pope.sh, "
                 "infer_pope.py:53-58)")
    defaults = {"enh_para": 1.15, "sup_para": 0.95, "layers": "9-14"}
    params = {"enh_para": Param(float), "sup_para": Param(float), "layers": LayerSpan("9-14")}
    text_only_refusal = ("it amplifies the attention to the image; with no image it would record "
                         "the baseline under ClearSight's name")

    def passes(self, num_layers):
        try:
            layers = layer_range(self.settings["layers"], num_layers)
        except ValueError as err:
            raise ValueError(f"method clearsight: {err}") from None
        enh, sup = float(self.settings["enh_para"]), float(self.settings["sup_para"])
        edit = VisualAmplification(layers, enh, sup)
        return {"main": Pass(edit=edit,
                             edit_name=f"clearsight:{enh}:{sup}:{layers[0]}-{layers[1]}")}

    def combine(self, logits):
        """Its one pass's logits, as they are: a method read at the answer
        position only (see the class)."""
        return logits["main"]
