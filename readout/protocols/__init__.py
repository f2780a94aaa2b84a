"""Published protocols: everything that decides the POPE number a tool prints, by name, one room per
tool.

A protocol is a prompt per model class (the tool's templates, and its `Coverage` of each family: the
model class it runs the family's checkpoints with, keyed by their model_type), a generation length,
an answer rule (one of the readouts) and the tool's own aggregation: which groups it reports (per
split, pooled), how an answer that is neither yes nor no counts, what its yes-ratio counts, and the
unit. The aggregations are the tools' formulas as their sources write them, operation for operation,
so that the floats are the ones the tool prints; each cites the file and lines it follows.

The rooms: `lmms_eval.py`, `vlmevalkit.py`, `llava.py` (LLaVA-1.5's pope.sh), `pope_official.py`
(POPE's evaluate.py), `paper.py` (the audit), `vcd.py` (VCD's eval_pope.py and sampled baseline),
`repope.py` (score only); each holds its tool's version and sources, answer rule and aggregation,
templates and coverage in one `Protocol`. `base.py` declares what a room holds, `registry.py`
collects them (the protocols, the templates, the lookups) and `scoring.py` scores a run.

A run records every readout, so any run can be scored under any protocol; whether that reproduces
the tool's number depends on whether the run asked the tool's prompt at the tool's length, which
`checks` says from the run's meta.json.
"""
from .base import Coverage, FamilyFacts, Protocol
from .registry import (PROTOCOLS, SCORE_ONLY, SCORING_PROTOCOLS, TEMPLATES, coverage, get_protocol,
                       get_template)
from .scoring import checks, format_protocol_runs, score_protocol

__all__ = ["Coverage", "FamilyFacts", "Protocol", "PROTOCOLS", "SCORE_ONLY",
           "SCORING_PROTOCOLS", "TEMPLATES", "coverage", "get_protocol", "get_template", "checks",
           "format_protocol_runs", "score_protocol"]
