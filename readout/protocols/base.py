"""What every tool's room declares: how its protocol runs a family's checkpoint (`Coverage`) and the
protocol itself (`Protocol`: its version and sources, answer rule, aggregation, prompt templates and
coverage), and the pieces several rooms share."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Callable, Mapping

from ..score import POOLED, Unavailable
from ..templates import Template
from ..tool_steps import TOOL_STEPS


@dataclass(frozen=True)
class Coverage:
    """How a protocol runs one family's checkpoint: the tool's model class it follows, the template
    that renders that class's prompt, the tool's new-token limit for it (None: its rule reads no
    text), the image preprocessing, and what of the tool's pipeline this engine does not
    reproduce."""

    model_class: str
    template: str
    new_tokens: int | None
    image_aspect: str = "processor"
    deviations: tuple[str, ...] = ()
    # how the tool hands the processor each image (engine Settings.image_reencode)
    image_reencode: str = "none"
    # the fewest new tokens the tool's generate makes (engine Settings.min_new_tokens)
    min_new_tokens: int = 0
    # how the tool resizes each image before its processor (Settings.image_resize)
    image_resize: str = "none"
    # the bounds its processor is made with (Settings.processor_pixels)
    processor_pixels: str | None = None
    # the tile bounds it gives its processor (Settings.processor_patches)
    processor_patches: str | None = None
    # how the tool cuts its answer out of generate's whole output (Settings.answer_cut;
    # tool_steps.py ANSWER_CUTS)
    answer_cut: str = "none"
    # how the image tokens attend in the tool's attention (Settings.image_mask)
    image_mask: str = "model"
    # greedy where the tool calls transformers' generate, which applies the checkpoint's
    # generation_config.json (Settings.generation_config); repetition_penalty where the tool passes
    # its own over it
    generation_config: str = "none"
    repetition_penalty: float | None = None
    # a beam search where the tool's generate runs one (Settings.num_beams, length_penalty), and
    # generate's max_length where the tool sets it over a prompt given as inputs_embeds
    # (Settings.max_length)
    num_beams: int = 1
    length_penalty: float = 1.0
    max_length: int | None = None
    # a sampled continuation where the tool's generate samples (Settings.do_sample), under its
    # warpers
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    # the dtype the tool loads the model in (Settings.dtype): fp16 | bf16 | fp32, or "auto": the
    # checkpoint's own, as from_pretrained's dtype="auto" (transformers 5's default) reads it from
    # config.json, resolved per checkpoint (pope_fast/coverage.py protocol_for); None: the tool pins
    # none, so --dtype's applies
    dtype: str | None = None

    def steps(self) -> dict:
        """The TOOL_STEPS the tool takes (each one that is not its default), by name."""
        return {name: getattr(self, name) for name in TOOL_STEPS
                if getattr(self, name) != STEP_DEFAULTS[name]}

    def to_json(self) -> dict:
        # the steps recorded where the tool takes them: a run's meta from before them reads as their
        # defaults
        dtype = {} if self.dtype is None else {"dtype": self.dtype}
        return {"model_class": self.model_class, "template": self.template,
                "max_new_tokens": self.new_tokens, "image_aspect": self.image_aspect,
                **self.steps(), **dtype, "deviations": list(self.deviations)}


STEP_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Coverage) if f.name in TOOL_STEPS}


class FamilyFacts(typing.Protocol):
    """What a coverage reads of a model family, each declared on the engine's family class
    (engine/models/base.py `Family`), which readout does not import."""

    family: str  # the checkpoint's config.json model_type
    name: str  # what messages call it
    seed_model: str  # the published model its random checkpoints stand for
    default_template: str


# A tool's coverage of a checkpoint (its family, its config.json): a Coverage, or why the tool has
# no model class for the family.
Covers = Callable[[FamilyFacts, Mapping], "Coverage | str"]


# What a tool's table says of a model_type it does not name: pope-fast states no coverage it has not
# read.
NOT_READ = "no entry (how the tool runs this model_type has not been read from its sources)"


def by_model_type(table: Mapping[str, Coverage | str | Callable[[Mapping], Coverage]],
                  default: str = NOT_READ) -> Covers:
    """A tool's coverage from its table keyed by the checkpoint's model_type: each family's
    Coverage, a function of the checkpoint's config.json where the tool picks by it, or why the tool
    has no model class for the family; `default` for a model_type the table does not name (a tool
    that runs one model only says so once, and a new family needs no line in a room whose tool has
    not been read for it)."""
    def covers(family: FamilyFacts, config: Mapping) -> Coverage | str:
        entry = table.get(family.family, default)
        return entry(config) if callable(entry) else entry

    return covers


def count(labels, decided, label, answer) -> int:
    return sum(1 for y, d in zip(labels, decided) if y == label and d == answer)


@dataclass(frozen=True)
class Protocol:
    name: str
    title: str
    version: str  # the release or commit its sources were read at
    readout: str  # the answer rule: a READOUTS name
    # one group's metrics, as the tool computes them
    aggregate: Callable[[list[str], list[str]], dict]
    headline: str  # the metric a paper quotes
    pooled: bool  # whether the tool reports the splits together too (the `Overall` row)
    shown: Callable[[float], str]  # how the tool prints a value
    sources: tuple[str, ...]
    reproduces: str  # which published numbers it is
    # whether its F1 counts an answer neither yes nor no as a no (else leaves it out)
    unknown_is_no: bool = False
    # whether its users quote the mean of the splits' F1 (LLaVA-1.5's paper)
    mean_of_splits: bool = False
    # A tool that prescribes no prompt, model class or length (it runs each model through its own
    # code): why, in one line; such a protocol scores runs but is no `eval --protocol` (it has no
    # `covers`), and `checks` says this line instead of comparing the run with a Coverage.
    unprescribed: str | None = None
    covers: Covers | None = None  # how it runs each family's checkpoint (None: unprescribed)
    # the tool's prompt per model class, as its source builds it
    templates: tuple[Template, ...] = ()
    # A tool whose rule reads the label too (VCD's eval_pope.py): the answer it counts for (label,
    # the readout's text), which the aggregation then reads in place of the readout's decisions
    counted: Callable[[str, str], str] | None = None
    # What the tool does with a thinking checkpoint's reasoning (readout/thinking.py), cited; None:
    # nothing of its own
    thinking: str | None = None

    def score_group(self, labels: list[str], decided: list[str]) -> dict:
        """The tool's metrics of one group; every decision must be one (a readout's
        yes/no/unknown)."""
        if len(labels) != len(decided) or not labels:
            raise ValueError(f"protocol {self.name}: {len(labels)} labels, {len(decided)} answers")
        return self.aggregate(labels, decided)

    def counted_answers(self, entries: list) -> list[str]:
        """Each record's answer as a tool whose rule reads the label counts it (`counted`), from the
        text of its readout; Unavailable where a record holds none (an imported file's stored
        decision is no text)."""
        out = []
        for entry in entries:
            text = entry.text_for(self.readout)
            if text is None:
                raise Unavailable(f"question {entry.key}: no decoded text "
                                  "(its rule reads the text with the label)")
            out.append(self.counted(entry.label, text))
        return out

    def summary(self, rows: list[dict]) -> dict | None:
        """A number the tool's users derive from its per-split rows: LLaVA-1.5's paper quotes the
        mean of the three splits' F1 (LLaVA issue #626 reproduces 85.9 that way; the scripts print
        per split)."""
        if not self.mean_of_splits:
            return None
        f1 = [r["F1 score"] for r in rows if r["split"] != POOLED]
        if len(f1) < 2 or any(v is None for v in f1):
            return None
        return {"mean split F1": sum(f1) / len(f1), "splits": len(f1)}

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "version": self.version,
                "readout": self.readout, "headline": self.headline, "pooled": self.pooled,
                "sources": list(self.sources), "reproduces": self.reproduces}
