"""How each published protocol runs a checkpoint (its tool's room in readout/protocols says, by the
family), proven from the checkpoint's files before it loads, and what meta.json records of it for
`score --protocol`. The application's fact, not the engine's: the engine runs the template and
readouts it is handed."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .engine.models import FAMILIES, family_of, inner_types
from .engine.utils.loader import CheckpointError, checkpoint_dtype, read_config
from .engine.utils.settings import DTYPES
from .readout.protocols import PROTOCOLS, Coverage, coverage, get_template


@dataclass(frozen=True)
class BackendFacts:
    """What a protocol reads of a model the engine has no family for (protocols.base.FamilyFacts),
    which the transformers backend runs: its model_type, and its default template (the backend's:
    the checkpoint's chat template, else the question as its processor takes it)."""

    family: str
    name: str
    seed_model: str
    default_template: str


def model_facts(folder: Path, config: dict):
    """The engine's family of the checkpoint, or its BackendFacts where the engine has none that
    fits."""
    model_type = config.get("model_type")
    if (family := family_of(config)) is not None:
        return family
    template = "reference_chat" if has_chat_template(folder) else "reference_plain"
    # a tool's coverage is keyed by model_type and follows its family's kind of checkpoint: a
    # checkpoint the family does not fit is keyed by what it holds, which no tool's table names
    held = inner_types(config) if model_type in FAMILIES else None
    key = model_type if held is None else f"{model_type} ({' + '.join(map(str, held.values()))})"
    return BackendFacts(key, f"{model_type} (transformers)", str(model_type), template)


def protocol_for(folder: str | Path, name: str) -> Coverage:
    """How protocol `name` runs the checkpoint in `folder` (its tool's room says, by the family),
    proven from its files before it loads: ValueError (one line) where the protocol does not cover
    its family or the checkpoint lacks the chat template the protocol's prompt is rendered with."""
    folder = Path(folder).expanduser().resolve()
    config = read_config(folder)
    covered = coverage(name, model_facts(folder, config), config)
    if get_template(covered.template).chat and not has_chat_template(folder):
        raise CheckpointError(f"{folder}: protocol {name} renders its prompt ({covered.template}) "
                              "with the tokenizer's chat template, and the checkpoint has none "
                              "(tokenizer_config.json's chat_template, chat_template.json or "
                              "chat_template.jinja)")
    # the tool loads the checkpoint's own dtype: named as --dtype names it
    if covered.dtype == "auto":
        own = checkpoint_dtype(folder, config)
        named = {dtype: name for name, dtype in DTYPES.items()}
        # fp64 or none found: torch's default
        covered = replace(covered, dtype=named.get(own, "fp32"))
    return covered


def protocol_coverage(folder: str | Path) -> dict[str, dict]:
    """Every protocol's coverage of this checkpoint, as meta.json records it (so that `score
    --protocol` can say, without the checkpoint, whether a run asked the protocol's prompt at its
    length)."""
    out = {}
    for name in PROTOCOLS:
        try:
            out[name] = protocol_for(folder, name).to_json()
        except ValueError as why:
            out[name] = {"not_covered": str(why)}
    return out


def has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        text = (folder / "tokenizer_config.json").read_text(encoding="utf-8")
        return bool(json.loads(text).get("chat_template"))
    except (OSError, ValueError):
        return False
