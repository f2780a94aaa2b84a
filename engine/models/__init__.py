"""The model families, one module each, and the registry that finds one by the checkpoint's
`model_type`. A family module is imported only when its model_type is asked for, so adding a family is
its module here, one line in FAMILIES and its test file."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from pathlib import Path

import json

from ...readout.protocols import PROTOCOLS, Coverage, coverage, get_template
from ..loader import CheckpointError, check_config, checkpoint_dtype, read_config
from ..settings import DTYPES, Settings
from .base import Family, TextOnlyRefused as TextOnlyRefused  # re-exported: engine and core import it here

# model_type → "module:class" within this package, in the order tables list them.
FAMILIES: dict[str, str] = {
    "llava": "llava:LlavaModel",
    "llava_next": "llava_next:LlavaNextModel",
    "instructblip": "instructblip:InstructBlipModel",
    "qwen2_vl": "qwen2_vl:Qwen2VLModel",
    "mplug_owl2": "mplug_owl2:MplugOwl2Model",
    "qwen2_5_vl": "qwen2_5_vl:Qwen2_5_VLModel",
    "llava_onevision": "llava_onevision:LlavaOnevisionModel",
    "internvl": "internvl:InternVLModel",
    "qwen3_vl": "qwen3_vl:Qwen3VLModel",
    "qwen3_vl_moe": "qwen3_vl_moe:Qwen3VLMoeModel",
    "gemma3": "gemma3:Gemma3Model",
}
DEMO = "llava"  # the family of the built-in demo's random checkpoint

# Vision-language classes transformers has whose pieces no family here implements: what is missing, so a
# user knows whether a family module would do or the language model itself needs new parts.
_MOE = ("mixture-of-experts MLP layers (the engine's are Qwen3-VL-MoE's: a softmax top-k router over fused experts, "
        "no shared experts)")
NOT_IMPLEMENTED: dict[str, str] = {
    "mllama": "cross-attention layers (its language model reads the image through gated cross-attention to the "
              "vision features, not as tokens of its own sequence)",
    "paligemma": "prefix-LM attention (the image and the whole prompt attend to each other bidirectionally)",
    "fuyu": "a tower-free image path (patches enter the decoder through one linear layer) and Persimmon's decoder "
            "(LayerNorm, partial rotary)",
    "chameleon": "images as discrete VQ codebook tokens (no vision features)",
    "emu3": "images as discrete VQ codebook tokens (no vision features)",
    "idefics2": "the Perceiver resampler between the vision tower and the language model",
    "idefics3": "the pixel-shuffle connector over image splits",
    "smolvlm": "the pixel-shuffle connector over image splits",
    "gemma3n": "per-layer embeddings, AltUp and the MobileNet vision tower",
    "llama4": _MOE + " and chunked attention",
    "qwen3_5_moe": _MOE,
    "aria": _MOE,
    "glm4v_moe": _MOE,
    "ernie4_5_vl_moe": _MOE,
}


def unsupported(model_type: str | None) -> str:
    """Why a model_type has no family, in words for a one-line error: what the engine lacks where that is
    known, or that no family module implements transformers' class for it; the supported ones after."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as CLASSES

    why = f"model_type {model_type!r} is not supported"
    if model_type in CLASSES:
        missing = NOT_IMPLEMENTED.get(model_type)
        why += f" ({CLASSES[model_type]}): " + (f"the engine does not implement {missing}" if missing
                                                  else "no family module implements it yet")
    return f"{why} (supported: {', '.join(FAMILIES)})"


def family_class(model_type: str) -> type[Family]:
    """The family of a model_type; ValueError saying why any other has none."""
    if model_type not in FAMILIES:
        raise ValueError(unsupported(model_type))
    module, _, name = FAMILIES[model_type].partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def family_of(model_type: str | None) -> type[Family] | None:
    """The family of a model_type, or None where the engine has none (the transformers backend runs it)."""
    return family_class(model_type) if model_type in FAMILIES else None


def load_model(folder: str | Path, settings: Settings) -> Family:
    """The family object for a local checkpoint folder (never the hub)."""
    folder = Path(folder).expanduser().resolve()
    config = read_config(folder)
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{folder}/config.json: {unsupported(model_type)}")
    check_config(config, folder / "config.json")
    return family_class(model_type)(folder, settings)


@dataclass(frozen=True)
class ReferenceFacts:
    """What a protocol reads of a model the engine has no family for (protocols.base.FamilyFacts), which the
    transformers backend runs: its model_type, and its default template (the backend's: the checkpoint's chat
    template, else the question as its processor takes it)."""

    family: str
    name: str
    seed_model: str
    default_template: str


def model_facts(folder: Path, config: dict):
    """The family of the checkpoint's model_type, or its ReferenceFacts where the engine has none."""
    model_type = config.get("model_type")
    if (family := family_of(model_type)) is not None:
        return family
    template = "reference_chat" if _has_chat_template(folder) else "reference_plain"
    return ReferenceFacts(model_type, f"{model_type} (transformers)", str(model_type), template)


def protocol_for(folder: str | Path, name: str) -> Coverage:
    """How protocol `name` runs the checkpoint in `folder` (its tool's room says, by the family), proven from its
    files before it loads: ValueError (one line) where the protocol does not cover its family or the checkpoint
    lacks the chat template the protocol's prompt is rendered with."""
    folder = Path(folder).expanduser().resolve()
    config = read_config(folder)
    covered = coverage(name, model_facts(folder, config), config)
    if get_template(covered.template).chat and not _has_chat_template(folder):
        raise CheckpointError(f"{folder}: protocol {name} renders its prompt ({covered.template}) with the "
                              "tokenizer's chat template, and the checkpoint has none (tokenizer_config.json's "
                              "chat_template, chat_template.json or chat_template.jinja)")
    if covered.dtype == "auto":  # the tool loads the checkpoint's own dtype: named as --dtype names it
        own = checkpoint_dtype(folder, config)
        named = {dtype: name for name, dtype in DTYPES.items()}
        covered = replace(covered, dtype=named.get(own, "fp32"))  # fp64 or none found: torch's default
    return covered


def protocol_coverage(folder: str | Path) -> dict[str, dict]:
    """Every protocol's coverage of this checkpoint, as meta.json records it (so that `score --protocol`
    can say, without the checkpoint, whether a run asked the protocol's prompt at its length)."""
    out = {}
    for name in PROTOCOLS:
        try:
            out[name] = protocol_for(folder, name).to_json()
        except ValueError as why:
            out[name] = {"not_covered": str(why)}
    return out


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError):
        return False
