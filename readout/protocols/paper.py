"""The audit (arXiv 2610.25964, ugaa-research run_multi_model_audit.py): the template-aware readout
and pope-fast's metrics, on each family's default prompt (its prompts are readout/templates.py's
own)."""
from __future__ import annotations

from typing import Mapping

from ..metrics import summarize
from .base import Coverage, FamilyFacts, Protocol


def audit_metrics(labels: list[str], decided: list[str]) -> dict:
    """The audit's (ugaa-research run_multi_model_audit.py), as pope-fast scores every readout: an
    unknown answer kept out of the confusion matrix and wrong in accuracy; F1 2TP/(2TP+FP+FN); the
    yes-rate of the answered predictions."""
    m = summarize(labels, decided, resamples=1)
    return {k: m[k] for k in ("f1", "accuracy", "precision", "recall", "yes_rate", "unknown")}


def covers(family: FamilyFacts, config: Mapping) -> Coverage:
    """Any family: the audit asked each model its default prompt and read no text."""
    return Coverage("the audit's prompt for " + family.seed_model, family.default_template, None)


PROTOCOL = Protocol(
    "paper", "the audit (arXiv 2610.25964)", "pope-fast's readouts", "template_aware",
    audit_metrics, "f1", False, lambda v: "%.4f" % v,
    ("ugaa-research run_multi_model_audit.py (its prompts, readouts and metrics, as "
     "readout/readouts.py and readout/metrics.py state them)",),
    "the audit's per-split F1 under the template-aware readout (its tables give every readout: "
    "`pope-fast score`)", covers=covers)
