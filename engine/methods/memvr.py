"""MemVR (Zou et al., "Look Twice Before You Answer: Memory-Space Visual Retracing for Hallucination
Mitigation in Multimodal Large Language Models", ICML 2025, arXiv 2410.03577; 1zhou-Wang/MemVR):
where an early exit at the answer position is uncertain, the image's tokens are fed again, once, as
a key-value memory in the next layer's MLP."""
from __future__ import annotations

import math

import torch

from ..layers.decoder import DecoderLayer
from ..layers.interventions import Intervention
from .base import Method, Param, Pass
from .only import mlp_input, plain_layers

# memvr.py:213-215: the entropy of the softmax over the early exit's 10 largest logits, over log(10)
TOP = 10


def top_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[B]: the entropy of the softmax over each row's TOP largest logits, divided by
    log(TOP) (memvr.py:213-215)."""
    p = torch.softmax(logits.topk(TOP, dim=-1).values, dim=-1)
    return -(p * torch.log(p)).sum(dim=-1) / math.log(TOP)


class VisualRetracing(Intervention):
    """MemVR's pass (memvr.py:156-257 the layer loop, :83-90 the MLP): after each layer l with
    starting < l < ending, the final norm and lm_head at the answer position give an early exit; the
    first whose top-10 entropy exceeds `threshold` makes layer l + 1's MLP output, at every position
    of the prompt, (1 - ratio) f + ratio (mean|f| / mean|a|) a, f its own output and a = (x v^T) v,
    x the MLP's input (after the post-attention norm) and v the image's tokens as the language model
    takes them [N, H] (:458, the projector's output); the means run over the prompt's positions and
    the hidden size (:89). The official code scales v by mean|W_up| / mean|v| and mean|W_down| /
    mean|v| first (:248-249): factors that a / mean|a| cancels, so they are left out. Once per
    prompt (:240); the image's rows change too, so every prompt runs whole, and on the prompt only
    (no continuation)."""

    whole_prompt = True

    def __init__(self, ratio: float, threshold: float, starting: int, ending: int):
        self.ratio, self.threshold, self.starting, self.ending = ratio, threshold, starting, ending

    def prompt_stream(self, lm, batch):
        return _Retracing(self, lm, batch)


class _Retracing:
    def __init__(self, method: VisualRetracing, lm, batch):
        self.m, self.lm, self.batch = method, lm, batch
        rows = batch.ids.shape[0]
        self.rows = torch.arange(rows, device=batch.ids.device)
        counts = [0] * rows if batch.image_mask is None else batch.image_mask.sum(dim=1).tolist()
        empty = torch.zeros(0, lm.dims.hidden_size, device=batch.ids.device, dtype=lm.dtype)
        self.visual = (list(torch.split(batch.features, counts)) if batch.features is not None
                       else [empty] * rows)
        self.done = torch.zeros(rows, dtype=torch.bool, device=batch.ids.device)
        self.now = torch.zeros_like(self.done)  # the rows whose retracing this layer's MLP carries

    def layer(self, i: int, layer: DecoderLayer, x: torch.Tensor, qkv,
              attn: torch.Tensor) -> torch.Tensor:
        hook = None
        if bool(self.now.any()):
            b, _, s, _ = attn.shape
            # what finish adds before its MLP
            inner = x + layer.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
            hook = lambda out: self._retrace(layer, inner, out)  # noqa: E731
        out = layer.finish(x, attn, mlp=hook)
        self.now = torch.zeros_like(self.done)
        if self.m.starting < i < self.m.ending:
            exit_logits = self.lm.vocab_logits(out[self.rows, self.batch.lengths - 1])
            self.now = (top_entropy(exit_logits) > self.m.threshold) & ~self.done
            self.done |= self.now
        return out

    def _retrace(self, layer: DecoderLayer, inner: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        x = mlp_input(layer, inner)
        out = out.clone()
        r = float(self.m.ratio)
        for b in torch.nonzero(self.now)[:, 0].tolist():
            n, v = int(self.batch.lengths[b]), self.visual[b].float()
            f = out[b, :n].float()
            a = (x[b, :n].float() @ v.T) @ v
            out[b, :n] = (f * (1 - r) + (f.abs().mean() / a.abs().mean()) * a * r).to(out.dtype)
        return out


class MemVR(Method):
    """MemVR as its LLaVA-1.5 scripts run it (eval_scripts/llava/mme.sh:8-15: greedy,
    --retracing-ratio 0.12, --entropy-threshold 0.75, --starting-layer 5, --ending-layer 16;
    README.md:104-107 the same); its Qwen-VL-Chat POPE script (eval/qwen/pope.sh) takes ratio 0.28
    and starting layer 9 for that model. Not a contrast: its records are its own pass's, read at the
    answer position only (the retracing acts inside each decode step's layers, which the engine's
    decode loop does not run)."""

    name = "memvr"
    reference = ("Zou et al., Look Twice Before You Answer: Memory-Space Visual Retracing for "
                 "Hallucination Mitigation in Multimodal Large Language Models, ICML 2025 "
                 "(1zhou-Wang/MemVR): after the first layer l, starting < l < ending, whose early "
                 "exit's top-10 entropy / log 10 exceeds threshold, layer l + 1's MLP output f "
                 "becomes (1 - ratio) f + ratio (mean|f| / mean|a|) a, a = (x v^T) v with v the "
                 "image's tokens; ratio 0.12, threshold 0.75, starting 5, ending 16 as its "
                 "LLaVA-1.5 scripts")
    defaults = {"ratio": 0.12, "threshold": 0.75, "starting": 5, "ending": 16}
    text_only_refusal = "it feeds the image's tokens again, and there is no image"
    params = {"ratio": Param(float, 0.0, 1.0), "threshold": Param(float, 0.0, 1.0),
              "starting": Param(int, -1), "ending": Param(int, 1)}

    def passes(self, num_layers):
        s = self.settings
        starting, ending = int(s["starting"]), int(s["ending"])
        if not starting < ending <= num_layers - 1:
            raise ValueError(f"method memvr: starting {starting} and ending {ending} must have "
                             f"starting < ending <= {num_layers - 1} (the model's last layer: the "
                             "retracing enters the layer after the one whose exit triggers it)")
        edit = VisualRetracing(float(s["ratio"]), float(s["threshold"]), starting, ending)
        name = f"memvr:{s['ratio']}:{s['threshold']}:{starting}:{ending}"
        return {"main": Pass(edit=edit, edit_name=name)}

    def check_model(self, lm) -> None:
        super().check_model(lm)
        plain_layers(lm, self.name)

    def combine(self, logits):
        # one pass, read at the answer position only (not a contrast: no decode runs it)
        return logits["main"]
