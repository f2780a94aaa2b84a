"""What a sweep carries from the engine to a record: each method's reply to every question of an
image step (`answers`), or the error every method's folder records for a question (`Outcome`)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from .engine import Engine, PromptResult
from .engine.methods import Method
from .readout import Question, make_record
from .readout.records import AnswerFields


@dataclass(frozen=True)
class Reply:
    """What a method's record keeps of its answer to a question (the answer's fields, the readouts'
    decisions, the probe's recorded values and the image's sha256), or why it could not answer
    (`error`)."""

    answer: AnswerFields | None = None
    predictions: dict[str, str] = field(default_factory=dict)
    probe: dict | None = None
    image_sha256: str | None = None
    error: str | None = None

    def record(self, question: Question, template: str) -> dict:
        return make_record(question, template, self.answer, predictions=self.predictions,
                           probe=self.probe, image_sha256=self.image_sha256, error=self.error)


@dataclass(frozen=True)
class Outcome:
    """What one question of a step got: an error that every method's folder records (its image
    unusable), or each method's reply by method name (a method's own error among them, where it
    refuses the question)."""

    question: Question
    per_method: dict[str, Reply] = field(default_factory=dict)
    error: str | None = None

    def reply(self, method: str) -> Reply:
        return Reply(error=self.error) if self.error is not None else self.per_method[method]

    @property
    def refused(self) -> bool:
        return any(r.error is not None for r in self.per_method.values())


def answers(engine: Engine, step: list[tuple[str, object]],
            by_image: dict[str, dict[str, list[Question]]], methods: list[Method]) -> list[Outcome]:
    """Each method's reply to every question of these images (prepared None: the questions asked
    without an image, which a method that needs one refuses)."""
    group = [name for name, _ in step]
    digests = {name: hashlib.sha256(prepared.image.data).hexdigest()
               if prepared is not None else None for name, prepared in step}
    texts = [list(by_image[name]) for name in group]
    # the question text of each prompt: the methods render their own prompts from it
    asked = [[by_image[name][text][0].text for text in image_texts]
             for name, image_texts in zip(group, texts)]
    text_only = any(p is None for _, p in step)
    refused = {m.name: Reply(error=why)
               for m in methods if text_only and (why := engine.text_only_refusal(m))}
    runnable = [m for m in methods if m.name not in refused]
    per_method = engine.run_methods([p for _, p in step], asked, runnable) if runnable else {}
    out = []
    for i, (name, image_texts) in enumerate(zip(group, texts)):
        for j, text in enumerate(image_texts):
            replies = {m: _reply(engine, results[i][j], digests[name])
                       for m, results in per_method.items()}
            replies.update(refused)
            out += [Outcome(q, replies) for q in by_image[name][text]]
    return out


def _reply(engine: Engine, result: PromptResult, digest: str) -> Reply:
    """What a record keeps of a result: its answer's fields (capped: of the readouts this run
    records), the readouts' decisions and the probe's values as the run's setting keeps them."""
    answer = replace(result.as_answer(),
                     capped=tuple(n for n in result.capped if n in engine.readout.names))
    return Reply(answer, engine.readout.decide(result),
                 _recorded(result.probe, engine.settings.probe), digest)


def _recorded(probe: dict | None, setting: str) -> dict | None:
    """What a record keeps of a probe: one float per layer, and with image-attention:heads every
    head ([layers][heads]); the API's results always hold both."""
    if probe is None:
        return None
    keep = ("image_attention", "image_attention_heads") if setting.endswith(":heads") \
        else ("image_attention",)
    return {k: probe[k] for k in keep}
