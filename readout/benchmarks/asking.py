"""`eval --protocol TOOL` on a benchmark's data: each question as TOOL asks it, in TOOL's
model-class prompt.

A tool's number on a benchmark comes from two prompt layers: its model class's prompt (the template,
length and image preprocessing `--protocol` already takes from readout/protocols/ for POPE) and its
benchmark task's change to the question (`Rule.prompt`: lmms-eval's MME post-prompt, VLMEvalKit's
AMBER suffix). The second is applied here to the question text, which then goes to the engine as any
question does. The lmms-eval templates render lmms-eval's post_prompt after the question already
(readout/templates.py SHORT_ANSWER, which MME's default post_prompt equals: lmms-eval mme.yaml:26-29
at cb45ac4d); that text is not asked twice.
"""
from __future__ import annotations

from dataclasses import replace

from ..data import Question
from ..protocols import get_template
from ..templates import SHORT_ANSWER
from . import get_benchmark


def check_protocol(benchmark: str, protocol: str) -> None:
    """A protocol names one of the benchmark's rules (its tool): else no rule scores eval's."""
    rules = get_benchmark(benchmark).rules
    if protocol not in rules:
        raise ValueError(f"--protocol {protocol}: {benchmark}'s rules are {', '.join(rules)}; "
                         f"a tool without a rule for {benchmark} has no prompt for it")


def after_question(template: str) -> str:
    """What the template renders after the question (its text's tail, a chat template's suffix)."""
    t = get_template(template)
    return t.suffix if t.chat else t.text.partition("{question}")[2]


def asked_questions(benchmark: str, protocol: str, questions: list[Question], template: str
                    ) -> tuple[list[Question], dict]:
    """The questions as `protocol`'s tool asks them under `template`, and what meta.json records of
    it: {"rule", "changed": whether the tool's task changes the data's question, "template_renders":
    the text the template adds after it that the task's prompt would add too (dropped from the
    question), or ""}."""
    check_protocol(benchmark, protocol)
    rule = get_benchmark(benchmark).rules[protocol]
    if rule.prompt is None:
        return questions, {"rule": protocol, "changed": False, "template_renders": ""}
    shared = SHORT_ANSWER if after_question(template).startswith(SHORT_ANSWER) else ""
    asked = []
    for q in questions:
        text = rule.prompt(q.text)
        if shared and text.endswith(shared):
            text = text[:-len(shared)]
        asked.append(replace(q, text=text))
    return asked, {"rule": protocol, "changed": True, "template_renders": shared}
