"""The experiment API: the one place an experiment adjusts the forward pass (`Intervention`), its
one edit type for the image keys' attention logits (`AttentionEdit`), and ready-made edits: PAI's
own (`PAIAttention`), an amplification and a temperature of the image's attention, applied on the
engine's one-step path from the question and answer positions."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class AttentionEdit:
    """An edit of the image keys' attention logits s in one layer: s becomes scale * s + magnitude *
    |s| + bias (each a number, or one per query head [Hq]). Seen from every query after the image
    (question, answer and generated positions), or with answer_only from the answer position only
    (the last prompt token, and each generated token in turn): PAI's own edit is s + alpha * |s|
    there. An edit with a magnitude term must be answer_only: the fused prefix kernel applies affine
    edits."""

    scale: float | torch.Tensor = 1.0
    bias: float | torch.Tensor = 0.0
    magnitude: float | torch.Tensor = 0.0
    answer_only: bool = False

    def per_head(self, heads: int, device: torch.device) -> "AttentionEdit":
        """The same edit with each term an fp32 [Hq] tensor on `device` (what the attention
        applies)."""
        scale, bias, magnitude = (
            torch.as_tensor(t, dtype=torch.float32, device=device).expand(heads).contiguous()
            for t in (self.scale, self.bias, self.magnitude))
        return AttentionEdit(scale, bias, magnitude, self.answer_only)

    def apply(self, scores: torch.Tensor,
              heads: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """scores with every entry edited (a per_head edit); `heads` shapes an [Hq] term to
        broadcast against them."""
        edited = scores * heads(self.scale) + heads(self.bias)
        if self.has_magnitude:
            edited = edited + heads(self.magnitude) * scores.abs()
        return edited

    @property
    def has_magnitude(self) -> bool:
        return bool((torch.as_tensor(self.magnitude) != 0).any())

    @property
    def is_identity(self) -> bool:
        return bool((torch.as_tensor(self.scale) == 1).all()) \
            and bool((torch.as_tensor(self.bias) == 0).all()) and not self.has_magnitude


class Intervention:
    """The one place an experiment adjusts the forward pass (subclass and override any method).

    `hidden` sees each decoder layer's output: part "prefix" is the image prefixes [G, P, H] of the
    images run together (computed once per image; layers 0 .. L-2, since the last layer's prefix
    output feeds nothing), part "suffix" a batch of question suffixes [B, S, H] (right-padded; rows
    grouped by image, and a batch may span images; for InstructBLIP, whose image tokens depend on
    the question, whole prompts and no "prefix" part), part "decode" one generated token per row
    [B, 1, H] (string readouts only); return a tensor of the same shape to replace it, or None to
    leave it. `mlp` sees each decoder layer's MLP output before the residual adds it (VTI's steering
    acts there). `image_attention` edits the attention logits of the image keys per layer and head
    (see there). `logits` sees the candidate logits [B, n] (fp32, columns in `ids` order) before the
    logit readouts decide; return the adjusted tensor or None. The first token and any continuation
    come from the model's own logits (hidden-state changes reach them, logit adjustments do not), so
    first_token and the text readouts ignore `logits`. Engine.answer runs one image at a time, so
    there G = 1 and every suffix row is that image's. `whole_prompt` True: its passes run each
    prompt whole, sharing no image prefix (what it does to the image tokens depends on the question:
    ImageTokenDrop). `rows` is told each question batch's rows before it runs, for an edit that
    differs per question (VISTA's steering vector). `lens_layers` (first, last): the pass also gives
    the mean of those layers' logits at the answer position (PromptResult.lens_logits;
    DecoderLM.lens_logits).
    """

    whole_prompt = False
    lens_layers: tuple[int, int] | None = None

    def rows(self, rows: list) -> None:
        """The batch about to run: its Rows (`item`, the image's index in the call; `prompt`, the
        prompt's)."""
        return None

    def hidden(self, layer: int, hidden: torch.Tensor, part: str) -> torch.Tensor | None:
        return None

    def mlp(self, layer: int, out: torch.Tensor, part: str) -> torch.Tensor | None:
        """Each decoder layer's MLP output before the residual adds it (Gemma 3's before its
        post-feedforward norm), parts as `hidden`'s: return a tensor of the same shape to replace
        it, or None to leave it."""
        return None

    def logits(self, logits: torch.Tensor, ids: list[int]) -> torch.Tensor | None:
        return None

    def prompt_stream(self, lm, batch):
        """A whole_prompt intervention's own step of each layer for one batch of whole prompts
        (ONLY's and MemVR's, engine/methods): an object whose `layer(i, layer, x, qkv, attn)`
        returns layer i's output [B, S, H] in place of `layer.finish(x, attn)` (q, k, v as the layer
        made them, attn its attention output). None (the default): every layer's step is the plain
        one."""
        return None

    def embedded(self, x: torch.Tensor, image: torch.Tensor | None) -> torch.Tensor | None:
        """A whole_prompt pass's input embeddings [B, S, H] (the image's features in its slots,
        image [B, S] marking them) before the first layer: return a tensor of the same shape to
        replace them (AvisC's zeroed tokens), or None to leave them."""
        return None

    def attended(self, layer: int, weights: torch.Tensor, image: torch.Tensor | None) -> None:
        """Told, in a whole_prompt pass, each layer's attention weights of the answer position over
        every key [B, S], averaged over heads (fp32, as transformers' eager attention returns them),
        before the layer's output."""
        return None

    def key_scale(self, layer: int,
                  image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A whole_prompt pass's factor on every key's attention logit in this layer, [B, S], and
        the queries [B, S] bool that take it (ClearSight's VAF: the image's and the system prompt's
        keys, from the queries after the image), or None (the default) to leave the layer alone.
        image [B, S] marks the image tokens."""
        return None

    def image_attention(self, layer: int) -> AttentionEdit | None:
        """This layer's AttentionEdit of the image keys' logits s (q.k / sqrt(d)), or None (the
        default) to leave the layer alone. AttentionEdit(bias=log(alpha)) multiplies the image's
        attention weights by alpha before the softmax renormalizes, AttentionEdit(scale=1/T) is a
        temperature on them (AdaptVis), bias -inf masks them; the image's own positions attend as
        before."""
        return None


def layer_edit(intervention: Intervention | None, layer: int, heads: int, device: torch.device
               ) -> AttentionEdit | None:
    """The intervention's edit of one layer as fp32 [Hq] tensors, None where it leaves the layer as
    it is (the identity edit too: the unedited path, bit for bit)."""
    edit = None if intervention is None else intervention.image_attention(layer)
    if edit is None:
        return None
    if not isinstance(edit, AttentionEdit):
        raise TypeError(f"{type(intervention).__name__}.image_attention({layer}) returned "
                        f"{type(edit).__name__}; return an AttentionEdit(scale=, bias=, "
                        "magnitude=, answer_only=) or None")
    edit = edit.per_head(heads, device)
    if edit.is_identity:
        return None
    if edit.has_magnitude and not edit.answer_only:
        raise ValueError(f"layer {layer}: an attention edit with a magnitude term (s + m|s|) must "
                         "be answer_only; the fused prefix attention applies affine edits to "
                         "every query")
    return edit


def hidden_hook(intervention: Intervention | None, layer: int, x: torch.Tensor,
                part: str) -> torch.Tensor:
    """x, or what the intervention's `hidden` puts in its place (checked to keep its shape)."""
    if intervention is None:
        return x
    out = intervention.hidden(layer, x, part)
    if out is None:
        return x
    if out.shape != x.shape:
        raise ValueError(f"Intervention.hidden returned shape {tuple(out.shape)} for layer {layer} "
                         f"{part}, expected {tuple(x.shape)}")
    return out


def mlp_hook(intervention: Intervention | None, layer: int,
             part: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What a layer's MLP output goes through (the intervention's `mlp`, its shape checked), or None
    where the intervention leaves MLPs alone."""
    if intervention is None or type(intervention).mlp is Intervention.mlp:
        return None

    def hook(out: torch.Tensor) -> torch.Tensor:
        new = intervention.mlp(layer, out, part)
        if new is not None and new.shape != out.shape:
            raise ValueError(f"Intervention.mlp returned shape {tuple(new.shape)} for layer "
                             f"{layer} {part}, expected {tuple(out.shape)}")
        return out if new is None else new

    return hook


def key_scaling(intervention: Intervention | None, layer: int, image: torch.Tensor | None,
                whole: bool, bidirectional: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The intervention's key_scale of this layer, None where it has none (or the prompts hold no
    image)."""
    if intervention is None or type(intervention).key_scale is Intervention.key_scale \
            or image is None:
        return None
    scaled = intervention.key_scale(layer, image)
    if scaled is not None and not whole:
        raise ValueError(f"{type(intervention).__name__} scales keys before the image: run its "
                         "prompts whole (whole_prompt = True), not against a shared image prefix")
    if scaled is not None and bidirectional:
        raise ValueError(f"{type(intervention).__name__}: this family's image tokens attend to "
                         "each other both ways, which the key-scaled attention does not compute")
    return scaled


def overrides(intervention: Intervention | None, hook: str) -> bool:
    """Whether the intervention defines its own `hook` (a method of Intervention)."""
    return intervention is not None \
        and getattr(type(intervention), hook) is not getattr(Intervention, hook)


def changes_prefix(intervention: Intervention | None) -> bool:
    """Whether an intervention may change an image prefix's KV: only a hidden-state or MLP hook can
    (attention edits act after the image)."""
    return intervention is not None and (type(intervention).hidden is not Intervention.hidden
                                         or type(intervention).mlp is not Intervention.mlp)


class PAIAttention(Intervention):
    """PAI's own edit (Liu et al., ECCV 2024, "Paying More Attention to Image"; LALBJ/PAI
    attention.py): at the answer position only (the last query, and each generated token in turn),
    the image keys' logits s become s + alpha * |s| in layers first..last (inclusive). Its POPE
    commands use alpha 0.2 and layers 2..31 of LLaMA-7B's 32 (range(2, 32)); `layers=None` takes 2
    .. the model's last layer, which is that range on 32 layers. The full PAI method adds a contrast
    with the text-only prompt: engine.methods' `pai`."""

    def __init__(self, alpha: float = 0.2, layers: tuple[int, int] | None = None,
                 num_layers: int | None = None):
        if layers is None:
            if num_layers is None:
                raise ValueError("PAIAttention needs layers=(first, last) or the model's "
                                 "num_layers")
            layers = (2, num_layers - 1)
        self.alpha, self.layers = alpha, layers

    def image_attention(self, layer: int):
        if self.layers[0] <= layer <= self.layers[1]:
            return AttentionEdit(magnitude=self.alpha, answer_only=True)
        return None


class ImageAttentionAmplification(Intervention):
    """Image attention multiplied by `alpha` before the softmax renormalizes it (bias log(alpha) on
    the image keys' logits) in layers first..last (inclusive), from every query after the image: the
    amplification PAI argues for, as an affine edit; PAIAttention is PAI's own (non-affine) edit."""

    def __init__(self, alpha: float, layers: tuple[int, int]):
        if alpha <= 0:
            raise ValueError(f"alpha must be positive, not {alpha}")
        self.bias, self.layers = math.log(alpha), layers

    def image_attention(self, layer: int):
        return AttentionEdit(bias=self.bias) if self.layers[0] <= layer <= self.layers[1] else None


class ImageAttentionTemperature(Intervention):
    """The image keys' attention logits divided by `temperature` in layers first..last (inclusive):
    a sharper (T < 1) or flatter (T > 1) attention over the image, as AdaptVis (Chen et al., 2025)
    adapts it; AdaptVis picks T per question from the attention's confidence, which this fixed T
    does not."""

    def __init__(self, temperature: float, layers: tuple[int, int]):
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, not {temperature}")
        self.scale, self.layers = 1.0 / temperature, layers

    def image_attention(self, layer: int):
        return AttentionEdit(scale=self.scale) if self.layers[0] <= layer <= self.layers[1] \
            else None


class ImageTokenDrop(Intervention):
    """SID's contrast pass (Huo et al., Self-Introspective Decoding, ICLR 2025; huofushuo/SID
    minigpt4/models/modeling_llama.py:650-670): layer `layer - 1`'s attention of the answer position
    over the image tokens, averaged over heads, picks the `keep` tokens it attends to least; from
    layer `layer` on, every other image token is dropped for every query (a key mask; the positions
    of the tokens kept stay theirs, as in the official mask and in its in-place variant, :608-631,
    which drops the hidden states). The tokens dropped depend on the question, so the pass runs
    whole prompts (no image prefix shared), and on the prompt only (no continuation)."""

    whole_prompt = True

    def __init__(self, layer: int, keep: int):
        if layer < 1 or keep < 1:
            # the official code draws tokens at random for layer 0 (:672-682), not here
            raise ValueError("ImageTokenDrop: layer and keep must be at least 1, "
                             f"not {layer} and {keep}")
        self.layer, self.keep = layer, keep

    def kept(self, attention: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """attention [B, Hq, S] (the answer row's, layer - 1's), image [B, S] → [B, S] bool: the
        keys every query of the later layers may see: the text, and each row's `keep` least-attended
        image tokens (all of them where a row holds no more)."""
        # non-image keys are never chosen first
        mean = attention.mean(dim=1).masked_fill(~image, float("inf"))
        chosen = torch.zeros_like(image)
        fewest = mean.topk(min(self.keep, mean.shape[1]), dim=-1, largest=False).indices
        chosen.scatter_(1, fewest, True)
        return ~image | chosen


class VisualAmplification(Intervention):
    """ClearSight's Visual Amplification Fusion (Yin et al., CVPR 2025; ustc-hyin/ClearSight
    visaug/inference/AttnAdapter.py:68-78): in layers first..last, every query after the image
    multiplies the attention logits of the image's keys by `enhance` and of the keys before the
    image (its system prompt: LLaVA-1.5's first 35 tokens there, BOS to "USER: ") by `suppress`,
    before the mask and softmax. The image's and the system prompt's own queries attend as they are,
    so the image's prefix is the model's; the edit reaches keys before the image, which the engine's
    image-key edits do not, so the pass runs whole prompts, on the prompt only (no continuation)."""

    whole_prompt = True

    def __init__(self, layers: tuple[int, int], enhance: float, suppress: float):
        self.layers, self.enhance, self.suppress = layers, enhance, suppress

    def key_scale(self, layer, image):
        if not self.layers[0] <= layer <= self.layers[1]:
            return None
        before = image.long().cumsum(-1) == 0  # no image token at or before the key
        # no image token at or after the query
        after = image.long().flip(-1).cumsum(-1).flip(-1) == 0
        scale = torch.where(image, self.enhance, torch.where(before, self.suppress, 1.0))
        return scale, after & image.any(-1, keepdim=True)
