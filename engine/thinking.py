"""A thinking checkpoint's prompts (readout/thinking.py): the template its prompts are rendered
with, the one its answer position's token sets come from, and under `decode` the reasoning pass that
runs before the answer pass.

The reasoning pass runs a call's rows in the answer pass's plan (each image's prefix prefilled once,
its prompts in suffix batches), decodes each greedily until `</think>` (or an eos, or the cap), and
hands the answer pass each row's layout extended by its reasoning and the ids the template writes
after `</think>`: the answer position is then the end of that layout, read by every readout as any
prompt's is (prefix reuse and text readouts alike). A row whose reasoning did not close gets no
answer pass: its result is unknown under every readout, with the reason."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

from ..readout.templates import OWN_TEMPLATES, SAMPLE_QUESTION, Template
from ..readout.thinking import CLOSE, NOT_CLOSED, OPEN, ThinkingMode, after_close, is_thinking
from .inputs.plan import PromptResult, Row, extended
from .models import Family
from .runner import Runner


# a method's passes (an edit, the vocabulary's logits) under decode: Engine.check_method says it
# before a sweep starts
METHOD_REFUSED = ("thinking decode reads the answer position after each prompt's own reasoning: a "
                  "method's passes would each reason apart; run the baseline (or --thinking off)")
# a reasoning's steps Engine.warmup runs: its prefill, decode steps and answer pass all launched
WARMUP_TOKENS = 4


def own_template(name: str) -> Template:
    """One of readout/templates.py's own templates (the families' defaults, the audit's prompts) by
    name. A tool's prompt is its protocol's fact, which the engine does not look up: its caller
    passes the Template (`readout.get_template(name)`)."""
    if name not in OWN_TEMPLATES:
        raise ValueError(f"template {name!r} is not one of the engine's own "
                         f"({', '.join(OWN_TEMPLATES)}); a tool's template is passed as its "
                         "Template: readout.get_template(name)")
    return OWN_TEMPLATES[name]


@dataclass(frozen=True)
class Thinking:
    """How a checkpoint's prompts run: `mode` None for a checkpoint that does not think (or the
    transformers backend without --thinking), `template` its prompts' and `answer_template` its
    token sets'."""

    mode: ThinkingMode | None
    template: Template
    answer_template: Template
    close_id: int | None = None
    after_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, model: Family, template: Template | str | None, spec: str | None) -> "Thinking":
        """The thinking of `model` under `template` (a Template; the name of one of
        readout/templates.py's own; None: the model's default) and Settings.thinking `spec`;
        ValueError (one line naming the parameter) for a template that marks the image otherwise
        than the model, and for decode where the checkpoint does not think or where the backend
        would have to run it."""
        if not isinstance(template, Template):
            template = own_template(template or model.default_template)
        if template.image_marker != model.image_marker:
            raise ValueError(f"template {template.name} marks the image with "
                             f"{template.image_marker!r}, but {model.family} expects "
                             f"{model.image_marker!r}")
        # what the checkpoint does left to itself (`on`), and with thinking off: a template that
        # itself switches thinking off (Qwen3.5's default, enable_thinking=False) is still a
        # thinking checkpoint's, run off by default
        tokenizer = model.tokenizer
        on, off = replace(template, enable_thinking=None), replace(template, enable_thinking=False)
        prompt = off_prompt = None
        if template.chat and getattr(tokenizer, "chat_template", None):
            prompt = on.render(SAMPLE_QUESTION, tokenizer)
            off_prompt = off.render(SAMPLE_QUESTION, tokenizer)
        asked = None if spec is None else ThinkingMode.parse(spec)
        if prompt is None or not is_thinking(prompt, off_prompt):
            if asked is not None and asked.mode == "decode":
                raise ValueError(f"thinking {spec}: {model.folder} does not think (template "
                                 f"{template.name}'s prompt opens no reasoning block ({OPEN}) and "
                                 "reads no enable_thinking); run it without --thinking")
            return cls(None, template, template)
        # the backend reads the template's own prompt, as before
        if model.backend != "engine" and asked is None:
            return cls(None, template, template)
        mode = asked or ThinkingMode.parse("off" if template.enable_thinking is False else "decode")
        if mode.mode == "off":
            return cls(mode, off, off)
        if model.backend != "engine":
            raise ValueError(f"thinking {spec}: the transformers backend reads one answer position "
                             "of the prompt; run --thinking off there, or this checkpoint on the "
                             "engine")
        ids = tokenizer.encode(off_prompt, add_special_tokens=False)
        close = tokenizer.convert_tokens_to_ids(CLOSE)
        if not isinstance(close, int) or close == tokenizer.unk_token_id or close not in ids:
            raise ValueError(f"thinking {mode.mode}: {model.folder}'s tokenizer has no {CLOSE} "
                             "token to end a reasoning at; run --thinking off")
        after = ids[len(ids) - ids[::-1].index(close):]
        if tokenizer.decode(after) != after_close(off_prompt):
            raise ValueError(f"thinking {mode.mode}: {model.folder}'s tokenizer does not keep "
                             f"{CLOSE} apart from the text after it; run --thinking off")
        return cls(mode, on, off, close, tuple(after))

    @property
    def decodes(self) -> bool:
        return self.mode is not None and self.mode.mode == "decode"

    def warming(self) -> "Thinking":
        """This thinking with a reasoning of WARMUP_TOKENS at most (Engine.warmup: what a run's
        reasoning launches, without decoding a gray image's reasoning to the cap)."""
        if not self.decodes:
            return self
        return replace(self, mode=replace(self.mode, max_tokens=WARMUP_TOKENS))

    def to_meta(self) -> dict:
        """What meta.json records: the mode and cap, where the checkpoint thinks."""
        return {} if self.mode is None else {"thinking": self.mode.to_json()}

    def reasoned(self, runner: Runner, rows: list[Row], interventions: list, vocab: bool
                 ) -> tuple[list[Row], dict[tuple[int, int], PromptResult]]:
        """Under decode, the rows whose reasoning closed, each extended by it and what follows
        `</think>`, and the results of those whose reasoning did not (unknown, NOT_CLOSED); else the
        rows as given."""
        if not self.decodes:
            return rows, {}
        if vocab or interventions != [None]:
            raise ValueError(METHOD_REFUSED)
        stop, decode = {self.close_id, *runner.model.stop_ids}, runner.model.tokenizer.decode
        reasoning: dict[tuple[int, int], list[int]] = {}
        for stage in runner.plan(rows):
            prefix = runner.prefill_prefix(stage.prefix, None) if stage.prefix is not None else None
            for batch in stage.batches:
                got = runner.reason(prefix, batch, self.mode.max_tokens, stop,
                                    len(self.after_ids) + 1)
                reasoning.update(((row.item, row.prompt), ids) for row, ids in zip(batch.rows, got))
        answered, unanswered = [], {}
        for row in rows:
            ids = reasoning[row.item, row.prompt]
            text = decode(ids, skip_special_tokens=True)
            if ids[-1] == self.close_id:
                layout = extended(row.layout, ids + list(self.after_ids))
                answered.append(replace(row, layout=layout, reasoning=(text, len(ids))))
            else:
                unanswered[row.item, row.prompt] = PromptResult(
                    candidate_logits={}, reasoning=text, reasoning_tokens=len(ids),
                    unanswered=NOT_CLOSED)
        return answered, unanswered


@contextmanager
def warming(engine):
    """`engine`'s thinking capped to WARMUP_TOKENS of reasoning while inside
    (Engine.warmup), then its own again."""
    thinking = engine.thinking
    engine.thinking = thinking.warming()
    try:
        yield
    finally:
        engine.thinking = thinking
