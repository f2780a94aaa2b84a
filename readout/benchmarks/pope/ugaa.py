"""The published ugaa-research record files (arXiv 2610.25964's code, `run_multi_model_audit.py` and
the pairwise scripts): two schemas, told apart by their keys; their stored predictions become the
readouts they name, so a published row is rescored exactly as it was computed."""
from __future__ import annotations

from pathlib import Path

from ...data import DataError
from ...records import Entry, RecordSet, check_decision
from .questions import split_from_name

# stored-prediction keys → our readout names, per schema.
PAIRWISE = {"pred_2tok": "legacy_2tok", "pred_8tok": "legacy_8tok"}
CROSS_MODEL = {"pred_legacy_2tok": "legacy_2tok", "pred_legacy_8tok": "legacy_8tok",
               "pred_dynamic_single": "dynamic_single", "pred_string_parse": "string_parse"}
# run_multi_model_audit.py's adapters (the names its files carry in summary.model) whose
# decoded_response is generate's whole output, prompt included: their pred_string_parse is our
# string_parse_with_prompt.
WHOLE_SEQUENCE_ADAPTERS = ("instructblip", "mplug_owl2")


def read_ugaa(path: Path, obj: dict) -> RecordSet:
    results = obj["results"]
    if not results:
        raise DataError(f"{path}: a ugaa-research record file with no results")
    summary = obj.get("summary") if isinstance(obj.get("summary"), dict) else {}
    split = summary.get("split") or split_from_name(path)
    for i, rec in enumerate(results):
        if not isinstance(rec, dict):
            raise DataError(f"{path} results[{i}]: expected a JSON object, "
                            f"got {type(rec).__name__}")
    keys = set().union(*(r.keys() for r in results))
    mapping = CROSS_MODEL if "pred_legacy_2tok" in keys else PAIRWISE
    adapter = str(summary.get("model") or path.name.split("_pope_")[0])
    whole = mapping is CROSS_MODEL and adapter in WHOLE_SEQUENCE_ADAPTERS
    if whole:
        mapping = {**mapping, "pred_string_parse": "string_parse_with_prompt"}
    entries, seen = [], set()
    for i, rec in enumerate(results, start=1):
        where = f"{path} results[{i - 1}]"
        for k in ("question_id", "label"):
            if k not in rec:
                raise DataError(f"{where}: missing key {k}")
        if str(rec["question_id"]) in seen:
            raise DataError(f"{where}: duplicate question_id {rec['question_id']!r}")
        seen.add(str(rec["question_id"]))
        if "error" in rec:  # a question whose generate failed: the paper's code drops it everywhere
            entries.append(Entry(key=str(rec["question_id"]), split=split,
                                 label=str(rec["label"]).lower(), error=str(rec["error"])))
            continue
        entries.append(Entry(
            key=str(rec["question_id"]), split=split, label=str(rec["label"]).lower(),
            first_token_id=rec.get("top_token_id"),
            decoded=None if whole else rec.get("decoded_response"),
            decoded_sequence=rec.get("decoded_response") if whole else None,
            stored={ours: check_decision(str(rec[theirs]).lower(), where, theirs)
                    for theirs, ours in mapping.items() if theirs in rec}))
    meta = {"imported_from": "ugaa-research", "schema": "pairwise" if mapping is PAIRWISE
            else "cross_model", "whole_sequence": whole, "summary": summary}
    return RecordSet(str(path), entries, {}, meta, prefer_stored=True)


