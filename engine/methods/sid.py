"""SID: the logits contrasted with a pass that keeps, after an early layer, only the image tokens
the answer position attends to least."""
from __future__ import annotations

from ..layers.interventions import ImageTokenDrop
from .base import ALPHA, Method, Param, Pass
from .contrastive import contrast


class SID(Method):
    """Self-Introspective Decoding as its code runs POPE (huofushuo/SID; README.md:35, `pope_eval.py
    --use-cd --use-fast-v --sample --sample-greedy`). The contrast pass is the same image and prompt
    (pope_eval.py:302-303) run with FastV's attention-mask variant (`--fast-v-inplace` is False,
    pope_eval.py:90): at layer `layer` (--fast-v-agg-layer 2, :93) the answer position's attention
    of the layer before, averaged over heads, keeps the `keep` image tokens it attends to least
    (--fast-v-attention-rank 100, :91; minigpt4/models/modeling_llama.py :650-670, `topk(...,
    largest=False)`), and every other image token is masked for every query from there on
    (engine.layers.interventions.ImageTokenDrop; a whole-prompt pass, since the tokens kept depend
    on the question). The logits combine as vcd_sample.py:177-184 does: (1 + alpha) l - alpha l_cd
    where l >= log(beta) + max l, else -inf; alpha 0.5 and beta 0.1 are its defaults there
    (:168-169): pope_eval.py's --cd-alpha 1 (:106) never reaches it (the argument is commented out,
    :329-330). Its greedy POPE answer is the argmax of the uncut contrast (:190-191): beta=0 records
    that (no cut). A row with no more than `keep` image tokens keeps them all (the official topk
    would fail there), its contrast pass then the main pass."""

    name = "sid"
    reference = ("Huo et al., Self-Introspective Decoding: Alleviating Hallucinations for Large "
                 "Vision-Language Models, ICLR 2025 (huofushuo/SID): (1 + alpha) l - alpha l_cd, "
                 "l_cd with only the keep image tokens least attended by the answer position in "
                 "layer - 1 (heads averaged) left from layer on, where l >= log(beta) + max l, "
                 "else -inf (beta 0: no cut, its greedy argmax); alpha 0.5, beta 0.1, layer 2, "
                 "keep 100 as its POPE command runs (vcd_sample.py:168-169, pope_eval.py:91-93)")
    defaults = {"alpha": 0.5, "beta": 0.1, "layer": 2, "keep": 100}
    text_only_refusal = ("it contrasts the prompt with itself with most of its image's tokens "
                         "dropped, and there is no image to drop")
    params = {"alpha": ALPHA, "beta": Param(float, 0.0, 1.0), "layer": Param(int, 1),
              "keep": Param(int, 1)}

    def passes(self, num_layers):
        layer, keep = int(self.settings["layer"]), int(self.settings["keep"])
        if layer >= num_layers:
            raise ValueError(f"method sid: layer {layer} is not within the model's {num_layers} "
                             "layers")
        return {"main": Pass(),
                "contrast": Pass(edit=ImageTokenDrop(layer, keep), edit_name=f"sid:{layer}:{keep}")}

    def combine(self, logits):
        main, other = logits["main"], logits["contrast"]
        alpha, beta = float(self.settings["alpha"]), float(self.settings["beta"])
        if beta == 0:
            return (1 + alpha) * main - alpha * other
        return contrast(main, other, alpha, beta)
