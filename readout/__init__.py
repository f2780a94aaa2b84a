"""Readout core: POPE data, readout protocols, token sets, metrics, records. Pure Python + numpy;
importing it never imports torch."""
from .benchmarks.pope.questions import (dataset_from_name, find_question_files, load_question_sources, load_questions,
                                        split_from_name)
from .compare import compare_runs
from .data import DataError, Question
from .metrics import bootstrap_f1_ci, confusion, mcnemar_exact, summarize
from .reading import read_records
from .readouts import (DEFAULT_READOUT, LOGIT_READOUTS, NO, READOUTS, TEXT_READOUTS, UNKNOWN, YES, Readout, TokenSets,
                       parse_readouts)
from .records import META_FILE, RECORDS_FILE, Entry, RecordSet, expand_runs, make_record, read_meta
from .report.tables import format_audit, format_compare, format_runs
from .score import Unavailable, score_records
from .templates import TEMPLATES, Template, get_template
from .tokens import audit_tokens, derive_token_sets, library_versions, load_tokenizer, tokenizer_info

__all__ = [
    "DataError", "Question", "dataset_from_name", "find_question_files", "load_question_sources", "load_questions",
    "split_from_name",
    "compare_runs", "format_compare",
    "bootstrap_f1_ci", "confusion", "mcnemar_exact", "summarize",
    "DEFAULT_READOUT", "LOGIT_READOUTS", "NO", "READOUTS", "TEXT_READOUTS", "UNKNOWN", "YES",
    "Readout", "TokenSets", "parse_readouts",
    "META_FILE", "RECORDS_FILE", "Entry", "expand_runs", "RecordSet", "make_record", "read_meta", "read_records",
    "Unavailable", "score_records",
    "format_audit", "format_runs",
    "TEMPLATES", "Template", "get_template",
    "audit_tokens", "derive_token_sets", "library_versions", "load_tokenizer", "tokenizer_info",
]
