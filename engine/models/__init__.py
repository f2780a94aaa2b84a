"""The model families, one module each, and the registry that finds one by the checkpoint's
`model_type`. A family module is imported only when its model_type is asked for, so adding a family
is its module here, one line in FAMILIES and its test file."""
from __future__ import annotations

import functools
import importlib
from pathlib import Path

import json

from ..utils.loader import CheckpointError, check_config, quiet_fallback, read_config
from ..utils.settings import Settings
from .base import Family, TextOnlyRefused  # noqa: F401 (re-exported: the engine's public refusal)

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
    "qwen3_5": "qwen3_5:Qwen3_5Model",
    "qwen3_5_moe": "qwen3_5_moe:Qwen3_5MoeModel",
    "gemma3": "gemma3:Gemma3Model",
    "gemma4": "gemma4:Gemma4Model",
    "idefics3": "idefics3:Idefics3Model",
}
DEMO = "llava"  # the family of the built-in demo's random checkpoint

# Vision-language classes transformers has whose pieces no family here implements: what is missing,
# so a user knows whether a family module would do or the language model itself needs new parts.
_MOE = ("mixture-of-experts MLP layers (the engine's are Qwen3-VL-MoE's and Qwen3.5-MoE's: a "
        "softmax top-k router, renormalised, and at most one shared expert under a sigmoid gate)")
NOT_IMPLEMENTED: dict[str, str] = {
    "mllama": "cross-attention layers (its language model reads the image through gated "
              "cross-attention to the vision features, not as tokens of its own sequence)",
    "paligemma": "prefix-LM attention (the image and the whole prompt attend to each other "
                 "bidirectionally)",
    "fuyu": "a tower-free image path (patches enter the decoder through one linear layer) and "
            "Persimmon's decoder (LayerNorm, partial rotary)",
    "chameleon": "images as discrete VQ codebook tokens (no vision features)",
    "emu3": "images as discrete VQ codebook tokens (no vision features)",
    "idefics2": "the Perceiver resampler between the vision tower and the language model",
    "smolvlm": "the pixel-shuffle connector over image splits",
    "gemma3n": "per-layer embeddings, AltUp and the MobileNet vision tower",
    "llama4": _MOE + " and chunked attention",
    "aria": _MOE,
    "glm4v_moe": _MOE,
    "ernie4_5_vl_moe": _MOE,
}


def unsupported(model_type: str | None) -> str:
    """Why a model_type has no family, in words for a one-line error: what the engine lacks where
    that is known, or that no family module implements transformers' class for it; the supported
    ones after."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as CLASSES)

    why = f"model_type {model_type!r} is not supported"
    if model_type in CLASSES:
        missing = NOT_IMPLEMENTED.get(model_type)
        why += f" ({CLASSES[model_type]}): " + (
            f"the engine does not implement {missing}" if missing
            else "no family module implements it yet")
    return f"{why} (supported: {', '.join(FAMILIES)})"


def family_class(model_type: str) -> type[Family]:
    """The family of a model_type; ValueError saying why any other has none."""
    if model_type not in FAMILIES:
        raise ValueError(unsupported(model_type))
    module, _, name = FAMILIES[model_type].partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def inner_types(config: dict) -> dict[str, str] | None:
    """The model_type of each sub-config of a checkpoint's config.json (text_config, vision_config,
    ...) as transformers' config class of its model_type builds them, the class's default where the
    file names none; None where transformers has no such class or cannot build it (the family's own
    loading then names what is wrong)."""
    built = _built_inner_types(json.dumps(config, sort_keys=True))
    return None if built is None else dict(built)


# one checkpoint's config is asked for by the backend's choice, each protocol, the load
@functools.lru_cache(maxsize=8)
def _built_inner_types(text: str) -> tuple[tuple[str, str], ...] | None:
    # why: the config classes are transformers', which a checkpoint with no sub-configs to check
    # never loads
    from huggingface_hub.errors import StrictDataclassError
    from transformers import CONFIG_MAPPING

    config = json.loads(text)
    try:
        with quiet_fallback():
            built = CONFIG_MAPPING[config["model_type"]].from_dict(config)
    except (KeyError, ValueError, TypeError, ArithmeticError, AttributeError,
            StrictDataclassError):
        # a config its class cannot build: the family's loading names the field
        # (loader.check_config)
        return None
    return tuple((name, getattr(getattr(built, name, None), "model_type", None))
                 for name in built.sub_configs)


def misfit(config: dict) -> str | None:
    """Why the engine's family of a checkpoint's model_type does not run it, in words for one line:
    a sub-config of a model_type the family does not implement (llava-interleave: a llava of a
    Qwen2 language model and a SigLIP tower, which LLaVA-1.5's code would load as Vicuna and CLIP);
    None where it fits or no family has the model_type."""
    model_type = config.get("model_type")
    family = family_class(model_type) if model_type in FAMILIES else None
    found = inner_types(config) if family is not None and family.inner_types else None
    if found is None or all(found.get(name) in types
                            for name, types in family.inner_types.items()):
        return None
    held = " and ".join(f"{name} {found.get(name)!r}" for name in family.inner_types)
    runs = " and ".join(f"{name} {' or '.join(map(repr, types))}"
                        for name, types in family.inner_types.items())
    return f"model_type {model_type!r} with {held}: the engine's {family.name} implements {runs}"


def engine_refusal(config: dict) -> str | None:
    """Why the engine does not run a checkpoint (no family for its model_type, or a family its
    sub-configs do not fit), in words for one line; None where it does."""
    model_type = config.get("model_type")
    return unsupported(model_type) if model_type not in FAMILIES else misfit(config)


def family_of(config: dict) -> type[Family] | None:
    """The engine's family of a checkpoint, recognised by what its config.json holds (its
    model_type, and the sub-configs' model_types the family implements); None where the engine has
    none that fits (the transformers backend runs it)."""
    return family_class(config["model_type"]) if engine_refusal(config) is None else None


def load_model(folder: str | Path, settings: Settings) -> Family:
    """The family object for a local checkpoint folder (never the hub)."""
    folder = Path(folder).expanduser().resolve()
    config = read_config(folder)
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{folder}/config.json: {unsupported(model_type)}")
    check_config(config, folder / "config.json")
    if (why := misfit(config)) is not None:
        raise CheckpointError(f"{folder}/config.json: {why}; --backend transformers runs it "
                              "through transformers' own class")
    return family_class(model_type)(folder, settings)
