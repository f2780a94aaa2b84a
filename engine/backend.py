"""Which backend runs a checkpoint: the engine where it has a family that fits it
(models.family_of), transformers' own class otherwise (transformers_engine.TransformersEngine), or
the one `--backend` names."""
from __future__ import annotations

from pathlib import Path

from .core import Engine
from .utils.loader import CheckpointError, read_config
from .models import engine_refusal
from .transformers_model import remote_code
from .transformers_engine import TransformersEngine
from .utils.settings import Settings

BACKENDS = ("auto", "engine", "transformers")


def resolve_backend(folder: Path, backend: str = "auto") -> str:
    """"engine" or "transformers" for the checkpoint in `folder`; CheckpointError where the engine
    is asked for a checkpoint it has no family for (its model_type's, or one whose language model
    and tower it implements)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    # why: transformers' registry loads with transformers, which a
    # checkpoint the engine runs never needs
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as MAPPED)

    config = read_config(folder)
    # no family for its model_type, or one that does not fit what it holds
    why = engine_refusal(config)
    if backend != "transformers" and why is not None and config.get("model_type") not in MAPPED:
        remote = remote_code(config)
        raise CheckpointError(f"{folder}/config.json: {why}, and transformers has no "
                              "image-text-to-text class for it" + (f"; {remote}" if remote else ""))
    if backend == "engine" and why is not None:
        raise CheckpointError(f"{folder}/config.json: {why}; --backend transformers runs it "
                              "through transformers' own class")
    return "engine" if backend != "transformers" and why is None else "transformers"


def load_engine(folder: str | Path, settings: Settings | None = None, *, backend: str = "auto",
                **kwargs) -> Engine:
    """The Engine (Engine.load's keyword arguments) of the backend resolve_backend chooses."""
    folder = Path(folder).expanduser().resolve()
    chosen = Engine if resolve_backend(folder, backend) == "engine" else TransformersEngine
    return chosen.load(folder, settings, **kwargs)
