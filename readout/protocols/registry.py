"""The protocols by name, each tool's room collected, and the lookups: a protocol, a protocol's
coverage of a checkpoint, a template (the tools' prompts beside readout/templates.py's own)."""
from __future__ import annotations

from typing import Mapping

from ..templates import OWN_TEMPLATES, Template
from .base import Coverage, FamilyFacts, Protocol
from .llava import PROTOCOL as LLAVA
from .lmms_eval import PROTOCOL as LMMS_EVAL
from .paper import PROTOCOL as PAPER
from .pope_official import PROTOCOL as POPE_OFFICIAL
from .repope import PROTOCOL as REPOPE
from .vcd import PROTOCOL as VCD
from .vlmevalkit import PROTOCOL as VLMEVALKIT

# The protocols `eval --protocol` runs: each covers the families (its `covers`).
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (LMMS_EVAL, VLMEVALKIT, LLAVA, POPE_OFFICIAL,
                                                      PAPER, VCD)}
# Protocols that only score: they prescribe no prompt (no `covers`), so `eval --protocol` keeps to
# PROTOCOLS and score, compare and report take these too.
SCORE_ONLY: dict[str, Protocol] = {REPOPE.name: REPOPE}
SCORING_PROTOCOLS: dict[str, Protocol] = {**PROTOCOLS, **SCORE_ONLY}

# Every named template, the ones records carry in meta.json: readout/templates.py's, then each
# tool's.
TEMPLATES: dict[str, Template] = {**OWN_TEMPLATES,
                                  **{t.name: t for p in PROTOCOLS.values() for t in p.templates}}


def get_protocol(name: str) -> Protocol:
    try:
        return SCORING_PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; "
                         f"known: {', '.join(SCORING_PROTOCOLS)}") from None


def coverage(name: str, family: FamilyFacts, config: Mapping) -> Coverage:
    """How protocol `name` runs a checkpoint of `family` (its config.json: `config`); ValueError
    saying why where the protocol's tool has no model class for it."""
    protocol = PROTOCOLS.get(name)
    entry = protocol.covers(family, config) if protocol is not None else "no entry"
    if isinstance(entry, str):
        raise ValueError(f"protocol {name} does not cover {family.name}: {entry}")
    return entry


def get_template(name: str) -> Template:
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}") from None
