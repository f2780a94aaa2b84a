"""ONLY (Wan et al., "ONLY: One-Layer Intervention Sufficiently Mitigates Hallucinations in Large
Vision-Language Models", ICCV 2025, arXiv 2507.00898; zifuwan/ONLY): one layer's attention, its
heads of low text-to-image entropy ratio dropped, carried to the last layer's MLP beside the plain
stream; the logits contrasted with the plain ones or added to them, by how far the two distributions
lie apart."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers.attention import answer_key_attention
from ..layers.decoder import DecoderLayer
from ..layers.interventions import Intervention
from .base import ALPHA, BETA, Method, Param, Pass, plausible

# transformers/src/transformers/models/llama/modeling_llama.py (ONLY's patched copy): the weight of
# the plain stream's input to the last layer in the enhanced stream (:658, `0.2 * residual +
# hidden_states_cd`), and the floor inside each entropy's log (:501-502)
RESIDUAL_WEIGHT, LOG_FLOOR = 0.2, 1e-6


def plain_layers(lm, method: str) -> None:
    """ValueError unless every decoder layer is the plain LLaMA layer (one input norm, attention,
    one post-attention norm, a dense MLP): the methods that rebuild a layer's step (ONLY's, MemVR's)
    are written for it."""
    for i, layer in enumerate(getattr(lm, "layers", ())):
        if type(layer) is not DecoderLayer or layer.experts is not None:
            kind = "experts" if type(layer) is DecoderLayer else type(layer).__name__
            raise ValueError(f"method {method}: decoder layer {i} is {kind}, and the method "
                             "rebuilds the plain LLaMA layer's step (input norm, attention, "
                             "post-attention norm, dense MLP)")


def mlp_input(layer: DecoderLayer, x: torch.Tensor) -> torch.Tensor:
    """x [.., H] through the layer's post-attention norm: what its MLP takes."""
    return layer.norm(x, "post")


def dense_mlp(layer: DecoderLayer, x: torch.Tensor) -> torch.Tensor:
    """The layer's MLP block on x [.., H]: its post-attention norm, then down(silu(gate) * up)."""
    h = mlp_input(layer, x)
    return layer.down_proj(F.silu(layer.gate_proj(h)) * layer.up_proj(h))


def outliers_zeroed(weights: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """weights [B, Hq, S] with each row's member keys (member [B, S]) above their mean + std
    (unbiased, over the members) set to 0, as :486-496 do to the text keys and then the image
    keys."""
    count = member.sum(dim=-1)[:, None, None].float()
    inside = weights * member[:, None]
    mean = inside.sum(dim=-1, keepdim=True) / count
    std = (((weights - mean) ** 2 * member[:, None]).sum(dim=-1, keepdim=True) / (count - 1)).sqrt()
    return weights.masked_fill(member[:, None] & (weights > mean + std), 0.0)


def entropy(weights: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """[B, Hq]: the entropy of the member keys' weights renormalized, -sum q log(q + 1e-6)
    (:497-502; NaN where every member weight is 0)."""
    kept = weights * member[:, None]
    q = kept / kept.sum(dim=-1, keepdim=True)
    return -(q * torch.log(q + LOG_FLOOR)).sum(dim=-1)


class OnlyEnhanced(Intervention):
    """ONLY's enhanced stream (modeling_llama.py:483-522, :651-660, :949-993). In layer `layer`, the
    answer position's attention weights (softmax in fp32, modeling_llama.py's rounding to the model
    dtype kept) have their text keys' (every key but the first and the image's) and their image
    keys' outliers above mean + std zeroed (:486-496), and every head whose text-to-image ratio of
    entropies lies below the heads' mean loses all its weights (:497-518); those weights times the
    values, through o_proj, are the stream (:519-522). It skips the layers between and enters the
    last: its input norm, plus 0.2 times that layer's plain input, then its MLP block with its
    residual (:651-660); the final norm and lm_head give its logits. The last layer's output at the
    answer position is the stream's, so the pass's answer-position logits are ONLY's l_cd. The
    weights depend on the question: whole prompts.

    """

    whole_prompt = True

    def __init__(self, layer: int):
        self.layer = layer

    def prompt_stream(self, lm, batch):
        return _OnlyStream(self.layer, lm, batch)


class _OnlyStream:
    def __init__(self, at: int, lm, batch):
        self.at, self.last_layer, self.batch = at, len(lm.layers) - 1, batch
        self.rows = torch.arange(batch.ids.shape[0], device=batch.ids.device)
        self.stream: torch.Tensor | None = None  # [B, H]: layer `at`'s edited attention output

    def layer(self, i: int, layer: DecoderLayer, x: torch.Tensor, qkv,
              attn: torch.Tensor) -> torch.Tensor:
        out = layer.finish(x, attn)
        if i == self.at:
            self.stream = self._attention(layer, *qkv)
        if i == self.last_layer:
            plain = x[self.rows, self.batch.lengths - 1]
            h = layer.norm(self.stream, "input") + RESIDUAL_WEIGHT * plain
            out[self.rows, self.batch.lengths - 1] = h + dense_mlp(layer, h)
        return out

    def _attention(self, layer: DecoderLayer, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> torch.Tensor:
        b = self.batch
        weights = answer_key_attention(q, b.lengths, k).to(q.dtype).float()  # [B, Hq, S]
        keys = torch.arange(weights.shape[-1], device=weights.device)[None]
        valid = keys < b.lengths[:, None]
        image = b.image_mask if b.image_mask is not None else torch.zeros_like(valid)
        text, image = valid & ~image & (keys > 0), valid & image
        weights = outliers_zeroed(outliers_zeroed(weights, text), image)
        ratio = (entropy(weights, text).nan_to_num(nan=0.0)
                 / entropy(weights, image).nan_to_num(nan=float("inf")))
        dropped = ratio < ratio.mean(dim=-1, keepdim=True)  # [B, Hq]
        weights = weights.masked_fill(dropped[..., None], 0.0)
        group = q.shape[1] // v.shape[1]
        values = v.float().repeat_interleave(group, dim=1)  # [B, Hq, S, D]
        out = (weights[:, :, None] @ values)[:, :, 0]  # [B, Hq, D]
        return layer.o_proj(out.reshape(out.shape[0], -1).to(q.dtype))


class ONLY(Method):
    """ONLY as its POPE script runs it (eval_bench/scripts/pope_eval.sh:29-35: use_only,
    ritual_alpha_pos 3.0, ritual_alpha_neg 1.0, ritual_beta 0.1, js_gamma 0.2, enhance_layer_index
    0; pope_eval_llava.py:83's default gamma is 0.6). only_utils/only_sample.py:183-232: with tvd
    the summed absolute difference of the two softmaxes (:200), l + alpha_pos l_cd where tvd < gamma
    (:220-222), else (1 + alpha_neg) l - alpha_neg l_cd (:229), then -inf where l < log(beta) + max
    l (:183, :232). Its script samples from that (do_sample=True, pope_eval_llava.py:288); the
    records hold the logits and their argmax. The enhanced stream enters the last layer where the
    official code names layer 31 (modeling_llama.py:961), LLaVA-1.5-7B's last."""

    name = "only"
    reference = ("Wan et al., ONLY: One-Layer Intervention Sufficiently Mitigates Hallucinations "
                 "in Large Vision-Language Models, ICCV 2025 (zifuwan/ONLY): l_cd from layer "
                 "`layer`'s attention with its low text-to-image entropy ratio heads dropped, "
                 "through the last layer's MLP; l + alpha_pos l_cd where the softmaxes' total "
                 "variation sum < gamma, else (1 + alpha_neg) l - alpha_neg l_cd; -inf where l < "
                 "log(beta) + max l; alpha_pos 3, alpha_neg 1, beta 0.1, gamma 0.2, layer 0 as its "
                 "POPE script")
    defaults = {"alpha_pos": 3.0, "alpha_neg": 1.0, "beta": 0.1, "gamma": 0.2, "layer": 0}
    text_only_refusal = "it contrasts the image's attention with the text's, and there is no image"
    params = {"alpha_pos": ALPHA, "alpha_neg": ALPHA, "beta": BETA, "gamma": Param(float, 0.0),
              "layer": Param(int, 0)}

    def passes(self, num_layers):
        layer = int(self.settings["layer"])
        if layer >= num_layers - 1:
            raise ValueError(f"method only: layer {layer} must lie before the model's last layer "
                             f"({num_layers - 1}), where its stream enters")
        return {"main": Pass(),
                "enhanced": Pass(edit=OnlyEnhanced(layer), edit_name=f"only:{layer}")}

    def check_model(self, lm) -> None:
        super().check_model(lm)
        plain_layers(lm, self.name)

    def combine(self, logits):
        main, cd = logits["main"], logits["enhanced"]
        s = self.settings
        gap = torch.softmax(main, dim=-1) - torch.softmax(cd, dim=-1)
        tvd = gap.abs().sum(dim=-1, keepdim=True)
        out = torch.where(tvd < float(s["gamma"]), main + float(s["alpha_pos"]) * cd,
                          (1 + float(s["alpha_neg"])) * main - float(s["alpha_neg"]) * cd)
        return out.masked_fill(~plausible(main, float(s["beta"])), float("-inf"))
