"""What every model family is and shares: the contract the engine, the benchmark and the demo ask of
a family (`Family`), and the scaffold every family's constructor would otherwise repeat (the NF4
choice, the language model, the feature fingerprint, the stop ids, loading a processor with a
one-line error).

A family is one module of this package: a `Family` subclass built from a checkpoint folder and
the engine's Settings, owning the checkpoint's tokenizer, processor, vision side and language
model (a DecoderLM), and declaring the facts the rest of the code needs about it: its default
template and image marker, its vision FLOPs, and its transformers reference pipeline (or why it
has none). Its random checkpoints (their shapes, the writer, stand-in tokenizers) are the
synthetic side's: engine/synthetic/<model_type>.py.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import torch
from PIL import Image

from ..layers.ops import Linear, make_linear, replace_linears
from ..layers.decoder import DecoderDims, DecoderLayer, DecoderLM
from ..utils.loader import (CheckpointError, generation_config, load_grouped, quiet_fallback,
                            rename, stop_ids, tensor_files)
from ..inputs.plan import PromptLayout
from ..utils.settings import Settings
from ..utils.stats import Counts
from ..inputs.vision_cache import vision_fingerprint


# The tokenizers and processors loaded last (Family.shared), by loader, folder and its files' (name,
# size, mtime_ns): a file written anew is a new key. A few tens of MB each; a process loads one or
# two checkpoints, the tests a dozen.
_SHARED: OrderedDict = OrderedDict()
SHARED_KEPT = 16


def shared_pretrained(loader, folder: Path, load):
    """load(), or what it gave for the same loader and folder whose files are unchanged since:
    one object per version of the folder's files, the last SHARED_KEPT kept. A load that raises
    is not kept."""
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    key = (loader, str(Path(folder).resolve()),
           tuple((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                 for p in files))
    if key not in _SHARED:
        _SHARED[key] = load()
        while len(_SHARED) > SHARED_KEPT:
            _SHARED.popitem(last=False)
    _SHARED.move_to_end(key)
    return _SHARED[key]


def processor_with_video(checkpoint: Path):
    """transformers' AutoProcessor of a checkpoint whose processor holds a video half, or None where
    it cannot be built: that half needs torchvision, and without it transformers fails only after
    loading the tokenizer (two seconds of CPU for a Qwen one), so the attempt is not made."""
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        return None
    try:
        return AutoProcessor.from_pretrained(str(checkpoint))
    except (ImportError, AttributeError, OSError, ValueError):
        return None


class TextOnlyRefused(ValueError):
    """A text-only question a family (or a method) cannot answer; the message is one line
    saying why."""


def refusal(who: str, why: str) -> str:
    """The one-line message of a text-only question that `who` (a family or a method)
    cannot answer."""
    return f"{who} cannot answer a text-only question (no image): {why}"


class Family:
    """One model family's checkpoint, as the engine sees it.

    Subclasses set the class facts below and, in __init__ (after super().__init__), `tokenizer`,
    `lm`, `image_token_id` and `feature_fingerprint`; they implement the methods that raise here. A
    question asked without an image runs through `text_layout` (the prompt rendered without the
    image marker, its ids `text_ids`): a family overrides text_ids where its processor tokenizes
    text otherwise, or sets `text_only_refusal` where its transformers class cannot answer without
    an image."""

    family: ClassVar[str]  # the checkpoint's config.json model_type
    name: ClassVar[str]  # what messages call it
    seed_model: ClassVar[str]  # the published model its random checkpoints stand for
    # also the prompt of the protocols that prescribe none (paper, pope-official)
    default_template: ClassVar[str]
    # where the image goes in a rendered prompt ("" when it enters otherwise)
    image_marker: ClassVar[str]
    features_per_prompt: ClassVar[bool] = False  # True when the image tokens depend on the prompt
    # Why a question asked without an image cannot be run as the family's transformers class runs it
    # (None: it can, through text_layout).
    text_only_refusal: ClassVar[str | None] = None
    # How the family's own preprocessing shapes an image, for refusing Settings.image_aspect "pad"
    # (original LLaVA's pad to square); None where pad applies.
    own_aspect: ClassVar[str | None] = "keeps the processor's own resizing"
    # The Settings bounds its image processor takes, each → the processor's keyword arguments
    # it sets
    processor_bounds: ClassVar[dict[str, tuple[str, str]]] = {}
    # why bench has no transformers pipeline to time
    reference_unavailable: ClassVar[str | None] = None
    # what runs it (meta.json's model.backend; the other: transformers_model.TransformersModel)
    backend: ClassVar[str] = "engine"
    # The model_types of the sub-configs the family implements (text_config, vision_config), as
    # transformers' config class builds them from config.json (its default where the file names
    # none): a checkpoint of the family's model_type with another language model or tower inside
    # (llava-interleave: a llava of Qwen2 and SigLIP) is not the family's, and runs on the
    # transformers backend. Empty: the family reads its own config (no such class).
    inner_types: ClassVar[dict[str, tuple[str, ...]]] = {}

    tokenizer: object
    lm: DecoderLM
    image_token_id: int
    feature_fingerprint: str  # everything besides the pixels that the cached features depend on

    def __init__(self, folder: Path, settings: Settings):
        if settings.image_aspect != "processor" and self.own_aspect is not None:
            raise ValueError("image_aspect 'pad' is original LLaVA's pad to square; "
                             f"{self.name} {self.own_aspect}")
        for name, what in (("processor_pixels", "pixel bounds (the Qwen-VL families' have)"),
                           ("processor_patches", "tile bounds (InternVL3's has)")):
            if getattr(settings, name) is not None and name not in self.processor_bounds:
                raise ValueError(f"{name} {getattr(settings, name)}: {self.name}'s processor has "
                                 f"no {what} to set")
        self.folder, self.settings = folder, settings
        self.device, self.dtype = settings.torch_device, settings.torch_dtype
        self.quantize, self.packed = settings.quant == "nf4", settings.nf4_weights == "packed"

    @classmethod
    def protocol_variants(cls) -> dict[str, dict]:
        """The kinds of this family's checkpoints a tool may run differently, by name → a
        config.json standing for them (what `pope-fast protocols` lists each tool's coverage of,
        readout/protocols/<tool>.py). Which kinds a family has (LLaVA-NeXT's Vicuna and Mistral
        language models) is the family's fact; how each tool picks among them is the tool's."""
        return {cls.name: {}}

    # --- the scaffold ---------------------------------------------------------------------------

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               quantize: bool | None = None) -> Linear:
        """A checkpoint weight as a Linear in the compute dtype, NF4 under quant (transformers
        quantizes every Linear but lm_head under load_in_4bit, the vision side's and the
        projector's too)."""
        return make_linear(weight, bias, dtype=self.dtype, device=self.device,
                           quantize=self.quantize if quantize is None else quantize,
                           keep_packed=self.packed, kernels=self.settings.kernels)

    def borrowed(self, module: torch.nn.Module) -> torch.nn.Module:
        """A transformers module (a vision tower, a Q-Former) on the device in the compute dtype,
        its Linears NF4 under quant."""
        module = module.to(device=self.device, dtype=self.dtype).eval()
        if self.quantize:
            replace_linears(module, dtype=self.dtype, device=self.device, keep_packed=self.packed,
                            kernels=self.settings.kernels)
        return module

    def language_model(self, dims: DecoderDims, weights: dict[str, torch.Tensor],
                       layer_class: type[DecoderLayer] = DecoderLayer) -> DecoderLM:
        # a tool's attention that drops the model's image mask
        if self.settings.image_mask == "causal":
            dims = replace(dims, image_bidirectional=False)
        return DecoderLM(dims, weights, dtype=self.dtype, device=self.device,
                         quantize=self.quantize, keep_packed=self.packed,
                         quantize_lm_head=self.settings.quantize_lm_head,
                         kernels=self.settings.kernels, layer_class=layer_class)


    def auto_config(self):
        """The checkpoint's transformers config: its config.json through AutoConfig (never
        the hub)."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self.folder), local_files_only=True)

    def tied(self) -> bool:
        """Whether the checkpoint reads its logits off the embedding matrix and stores no lm_head:
        its config's tie_word_embeddings, false where absent (a family whose class ties otherwise
        says so)."""
        return bool(getattr(self.config, "tie_word_embeddings", False))

    def stores_lm_head(self, rules: list[tuple[str, str]]) -> bool:
        """Whether the checkpoint stores an lm_head (named by `rules`, the family's renames), which
        transformers 5 then keeps untied whatever the config says."""
        return any(rename(name, rules) == "lm.lm_head.weight" for name in tensor_files(self.folder))

    def load_parts(self, rules: list[tuple[str, str]], expected: dict[str, tuple[int, ...]],
                   **kwargs) -> dict[str, dict[str, torch.Tensor]]:
        """load_grouped of this checkpoint (kwargs: its optional, ignore); where tied(), no lm_head
        is read and the language model's is its embedding matrix."""
        tied = self.tied()
        if tied:
            expected = {k: v for k, v in expected.items() if k != "lm.lm_head.weight"}
        parts = load_grouped(self.folder, rules, expected, **kwargs)
        if tied:
            parts["lm"]["lm_head.weight"] = parts["lm"]["embed_tokens.weight"]
        return parts

    def fingerprint(self, tensors: dict[str, torch.Tensor], **extra) -> str:
        """The cached features' dependence on the weights that make them, the compute settings
        and `extra`."""
        return vision_fingerprint(tensors, self.settings, **extra)

    def pretrained(self, loader, what: str, **kwargs):
        """loader.from_pretrained of this folder (never the hub), or a one-line CheckpointError
        naming `what`."""
        try:
            with quiet_fallback():
                return loader.from_pretrained(str(self.folder), local_files_only=True, **kwargs)
        except (OSError, ValueError) as err:
            # transformers' messages run to several lines of advice
            reason = " ".join(str(err).split())
            reason = reason if len(reason) <= 200 else reason[:197] + "..."
            raise CheckpointError(f"{self.folder}: no usable {what} ({reason})") from None

    def shared(self, loader, what: str):
        """pretrained(loader, what) of a tokenizer or processor, shared read-only by the engines of
        one checkpoint in a process (shared_pretrained): the engine never adds tokens to it or sets
        its padding side, and what a family sets on it is the folder's own (OneVision's
        chat_template.json), so every engine of these files sets the same. A Qwen tokenizer takes
        about a second of CPU to build; bench and `verify` load a checkpoint twice."""
        return shared_pretrained(loader, self.folder, lambda: self.pretrained(loader, what))

    def image_processor_kwargs(self) -> dict:
        """The bounds the settings give the image processor, as the keyword arguments it is made
        with (a tool that passes them per call, as lmms-eval's classes do, gets the same pixels)."""
        kwargs = {}
        for name, keys in self.processor_bounds.items():
            bounds = self.settings.processor_bounds(name)
            kwargs |= {} if bounds is None else dict(zip(keys, bounds))
        return kwargs

    @cached_property
    def generation_config(self) -> dict:
        """The checkpoint's generation_config.json, as generate() reads it ({} where there
        is none)."""
        return generation_config(self.folder)

    @cached_property
    def stop_ids(self) -> set[int]:
        """What ends a greedy continuation (generate's eos ids)."""
        return stop_ids(self.generation_config, self.tokenizer)

    # --- what each family implements -------------------------------------------------------------

    def preprocess_settings(self) -> dict:
        """What decides the pixels (part of the feature-cache key)."""
        raise NotImplementedError

    def preprocess(self, image: Image.Image) -> object:
        """One image → what encode_images takes; NumPy only (it runs in worker threads, where
        torch ops would start a second OpenMP team that spins against the model's threads)."""
        raise NotImplementedError

    def vision_tokens(self, pixels: object) -> int:
        """Tokens one preprocess() output sends through the vision tower (for FLOP counts)."""
        raise NotImplementedError

    def encode_images(self, pixels: list) -> list[torch.Tensor]:
        """preprocess() outputs → per image, the features the cache keeps."""
        raise NotImplementedError

    def image_tokens(self, features: torch.Tensor) -> int:
        return features.shape[0]

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        raise NotImplementedError

    def text_ids(self, prompt: str) -> list[int]:
        """A text-only prompt's ids: what the processor makes of text without images (its
        tokenizer's ids, specials added)."""
        return list(self.tokenizer(prompt)["input_ids"])

    def text_layout(self, prompt: str) -> PromptLayout:
        """The layout of a prompt rendered without an image: no image slots, nothing shared (it runs
        whole), positions 0 .. L-1, on all three streams where the model has M-RoPE
        (get_rope_index's text-only positions). TextOnlyRefused where the family cannot run one."""
        if self.text_only_refusal is not None:
            raise TextOnlyRefused(refusal(self.name, self.text_only_refusal))
        ids = self.text_ids(prompt)
        if self.image_token_id in ids:
            raise ValueError(f"a text-only prompt holds the image token {self.image_token_id}: "
                             f"{prompt!r}")
        mrope = self.lm.dims.mrope_section is not None
        return PromptLayout.of(ids, self.image_token_id, share_prefix=False,
                               positions=torch.arange(len(ids)).expand(3, -1) if mrope else None)

    def prompt_features(self, items: list) -> list[list[torch.Tensor]]:
        """Only where features_per_prompt: per image, per prompt, the features of its
        image slots."""
        raise NotImplementedError

    def vision_flops(self, counts: Counts) -> float:
        """The vision side's weight-matmul FLOPs for the work in `counts` (bench's floor)."""
        raise NotImplementedError

    def matmul_flops(self, counts: Counts) -> float:
        """FLOPs of the weight matmuls a sweep could not avoid (attention scores excluded, a few %):
        the vision side's, the language model over every prefix and suffix token, and per prompt the
        candidate rows and one argmax pass of lm_head."""
        lm = self.lm.dims
        h = lm.hidden_size
        # a sparse layer: the experts one token runs
        per_token = 2 * sum(h * lm.head_dim * (2 * lm.num_heads + 2 * lm.num_kv_heads)
                            + 3 * h * lm.mlp_width(layer) for layer in range(lm.num_layers))
        return (self.vision_flops(counts)
                + per_token * (counts.prefix_tokens + counts.suffix_tokens)
                + 2 * counts.prompts * h * lm.vocab_size)


    @classmethod
    def reference_processor(cls, checkpoint: Path):
        """The processor bench's transformers pipeline calls as processor(images=,
        text=, return_tensors=)."""
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(str(checkpoint))
