"""Reading a model's answers: pure Python + numpy, importing it never imports torch. The names most
callers need are here, this face above every stratum (nothing inside readout imports it); the
strata, bottom up, each importing only those below it (docs/design.md, "Data flow"):

- the core at the root: the readouts (readouts.py: how a yes/no is read off a model's output) and
  their token sets (tokens.py), the prompt templates (templates.py), what a run asks the engine for
  (readout_plan.py, continuation.py, tool_steps.py), a record line's schema and our run folders read
  back (records.py), a run scored and two record sets compared (score.py, compare.py, metrics.py,
  attention_stats.py), and the CSV and pipe table every writer gives (cells.py);
- formats/: readers of other tools' formats more than one room reads; protocols/: the published
  protocols `--protocol` selects, a room per tool (its prompts, its coverage of each family, answer
  rule, aggregation), and the registry of every template;
- benchmarks/: a room per benchmark (pope/, mme/, amber/, hallusionbench/), each with its data,
  rules and importers of other tools' files; reading.py reads any records file, ours or another
  tool's, and score.py and compare.py score and compare runs from their paths;
- report/: the text tables the CLI prints, the report page and its figures.

Where a run's records are written (the lock, the rank parts, repair) is the application's:
pope_fast/store.py."""
from .benchmarks.pope.questions import (dataset_from_name, find_question_files,
                                        load_question_sources, load_questions, split_from_name)
from .benchmarks.compare import compare_runs
from .benchmarks.reading import read_records
from .data import DataError, Question
from .metrics import bootstrap_f1_ci, confusion, mcnemar_exact, summarize
from .readouts import (DEFAULT_READOUT, LOGIT_READOUTS, NO, READOUTS, TEXT_READOUTS, UNKNOWN, YES,
                       Readout, TokenSets, parse_readouts)
from .records import META_FILE, RECORDS_FILE, Entry, RecordSet, expand_runs, make_record, read_meta
from .report.compare_format import format_compare
from .report.tables import format_audit, format_runs
from .score import Unavailable, score_records
from .protocols import TEMPLATES, get_template
from .templates import Template
from .thinking import THINKING_HELP
from .tokens import (audit_tokens, derive_token_sets, library_versions, load_tokenizer,
                     tokenizer_info)

__all__ = [
    "DataError", "Question", "dataset_from_name", "find_question_files", "load_question_sources",
    "load_questions", "split_from_name",
    "compare_runs", "format_compare",
    "bootstrap_f1_ci", "confusion", "mcnemar_exact", "summarize",
    "DEFAULT_READOUT", "LOGIT_READOUTS", "NO", "READOUTS", "TEXT_READOUTS", "UNKNOWN", "YES",
    "Readout", "TokenSets", "parse_readouts",
    "META_FILE", "RECORDS_FILE", "Entry", "expand_runs", "RecordSet", "make_record", "read_meta",
    "read_records",
    "Unavailable", "score_records",
    "format_audit", "format_runs",
    "TEMPLATES", "Template", "get_template", "THINKING_HELP",
    "audit_tokens", "derive_token_sets", "library_versions", "load_tokenizer", "tokenizer_info",
]
