"""The model families, one module each, and the registry that finds one by the checkpoint's
`model_type`. A family module is imported only when its model_type is asked for, so adding a family is
its module here, one line in FAMILIES and its test file."""
from __future__ import annotations

import importlib
from pathlib import Path

from ..loader import CheckpointError, read_config
from ..settings import Settings
from .base import Family

# model_type → "module:class" within this package, in the order tables list them.
FAMILIES: dict[str, str] = {
    "llava": "llava:LlavaModel",
    "llava_next": "llava_next:LlavaNextModel",
    "instructblip": "instructblip:InstructBlipModel",
    "qwen2_vl": "qwen2_vl:Qwen2VLModel",
    "mplug_owl2": "mplug_owl2:MplugOwl2Model",
}
DEMO = "llava"  # the family of the built-in demo's random checkpoint


def family_class(model_type: str) -> type[Family]:
    """The family of a model_type; ValueError naming the supported ones for any other."""
    if model_type not in FAMILIES:
        raise ValueError(f"model family {model_type!r} is not supported (supported: {', '.join(FAMILIES)})")
    module, _, name = FAMILIES[model_type].partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def load_model(folder: str | Path, settings: Settings) -> Family:
    """The family object for a local checkpoint folder (never the hub)."""
    folder = Path(folder).expanduser().resolve()
    model_type = read_config(folder).get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{folder}/config.json: model_type {model_type!r} is not supported "
                              f"(supported: {', '.join(FAMILIES)})")
    return family_class(model_type)(folder, settings)
