"""The model families: what a family file provides, and the registry that finds one by the
checkpoint's `model_type` (a family module is imported only when its model_type is asked for, so a
new family touches no central file but FAMILIES)."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol

import torch
from PIL import Image

from .llama import LlamaLM
from .loader import CheckpointError, read_config
from .plan import PromptLayout
from .settings import Settings

# model_type → "module:class" within this package.
FAMILIES: dict[str, str] = {
    "llava": "llava:LlavaModel",
    "llava_next": "llava_next:LlavaNextModel",
    "instructblip": "instructblip:InstructBlipModel",
    "qwen2_vl": "qwen2_vl:Qwen2VLModel",
    "mplug_owl2": "mplug_owl2:MplugOwl2Model",
}


class Family(Protocol):
    """What the engine asks of a model family file (llava.py, llava_next.py, instructblip.py,
    qwen2_vl.py, mplug_owl2.py): built from a checkpoint folder and Settings, it owns the checkpoint's tokenizer,
    processor, vision side and language model (a LlamaLM), turns images into the features that stand
    in for the prompt's image tokens, and lays a prompt out for the language model."""

    family: str  # the checkpoint's config.json model_type
    folder: Path
    default_template: str
    image_marker: str  # where the image goes in a rendered prompt ("" when it enters otherwise)
    features_per_prompt: bool  # True when the image tokens depend on the prompt (InstructBLIP)
    tokenizer: object
    lm: LlamaLM
    image_token_id: int
    stop_ids: set[int]
    feature_fingerprint: str  # everything besides the pixels that the cached features depend on

    def preprocess_settings(self) -> dict: ...  # what decides the pixels (part of the cache key)
    def preprocess(self, image: Image.Image) -> object: ...  # NumPy only: runs in worker threads
    def vision_tokens(self, pixels: object) -> int: ...  # tokens through the tower, for FLOP counts
    def encode_images(self, pixels: list) -> list[torch.Tensor]: ...  # cached per image
    def image_tokens(self, features: torch.Tensor) -> int: ...
    def prompt_ids(self, prompt: str, num_image_tokens: int) -> list[int]: ...
    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout: ...
    # Only where features_per_prompt: prompt_features(items) → per image, per prompt, its features.


def family_class(model_type: str) -> type[Family]:
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
