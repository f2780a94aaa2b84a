"""Per-question records: writing them as a run goes, resuming, and reading them back for scoring.

Our records are JSON lines, one per (split, question), with a `meta.json` beside them that holds the
token sets, tokenizer and library versions. The published ugaa-research record files are read too
(two schemas, auto-detected); their stored predictions become the matching readouts.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .data import DataError, Question, split_from_name
from .protocols import DECISIONS, READOUTS, TokenSets

RECORDS_FILE, META_FILE = "records.jsonl", "meta.json"
FORMAT = "pope-fast/records-v1"

# ugaa-research stored-prediction keys → our readout names, per schema.
UGAA_PAIRWISE = {"pred_2tok": "legacy_2tok", "pred_8tok": "legacy_8tok"}
UGAA_CROSS_MODEL = {"pred_legacy_2tok": "legacy_2tok", "pred_legacy_8tok": "legacy_8tok",
                    "pred_dynamic_single": "dynamic_single", "pred_string_parse": "string_parse"}
# run_multi_model_audit.py adapters whose decoded_response is generate's whole output, prompt included:
# their pred_string_parse is our string_parse_with_prompt.
UGAA_WHOLE_SEQUENCE = ("instructblip", "mplug_owl2")


def make_record(question: Question, template: str, *, first_token_id: int | None = None,
                candidate_logits: dict[int, float] | None = None, decoded: str | None = None,
                texts: dict[str, str] | None = None, decoded_sequence: str | None = None,
                predictions: dict[str, str] | None = None, error: str | None = None,
                probe: dict | None = None) -> dict:
    """One record. `decoded` is the whole greedy continuation; `texts` the text readouts whose own
    prefix of it differs (read `decoded` for the others); `decoded_sequence` the prompt and the
    continuation decoded as one sequence (for string_parse_with_prompt); `probe` extra fields (the
    image-attention probe's one float per decoder layer)."""
    record = {"question_id": question.question_id, "split": question.split, "image": question.image,
              "label": question.label, "template": template}
    if question.dataset:  # absent in records written before datasets were named: read back as ""
        record["dataset"] = question.dataset
    if error is not None:
        record["error"] = error
        return record
    record["first_token_id"] = first_token_id
    record["candidate_logits"] = {str(i): float(v) for i, v in (candidate_logits or {}).items()}
    if decoded is not None:
        record["decoded"] = decoded
        differing = {n: t for n, t in (texts or {}).items() if t != decoded}
        if differing:
            record["texts"] = differing
    if decoded_sequence is not None:
        record["decoded_sequence"] = decoded_sequence
    record["predictions"] = dict(predictions or {})
    record.update(probe or {})  # e.g. image_attention: one float per decoder layer
    return record


def record_key(split: str, question_id, dataset: str = "") -> tuple[str, str, str]:
    """One question of one run: POPE's datasets reuse the question ids 1..3,000 in every split."""
    return dataset, split, str(question_id)


def json_lines(text: str):
    """(line number, line) of a JSON-lines text, split on "\n" only: str.splitlines() also breaks
    at U+2028, U+2029 and U+0085, which json.dumps(ensure_ascii=False) writes raw inside strings
    (a decoded continuation can hold one)."""
    for lineno, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield lineno, line


class RecordWriter:
    """Appends records batch by batch; a run that stops resumes from what is on disk.

    Each batch is flushed and fsynced, so after a crash at most the last line is torn; `open`
    drops a torn last line (it was never complete, so nothing recorded is lost) and returns the
    questions already done: `record_key` → (image, label) of its record. Error records do
    not count as done: a rerun retries them, and the new record supersedes the error.
    """

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir) / RECORDS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: dict[tuple[str, str, str], tuple[str, str]] = {}
        self._file = None

    def open(self) -> dict[tuple[str, str, str], tuple[str, str]]:
        if self.path.exists():
            self._mend_last_line()
            for lineno, line in json_lines(self.path.read_text(encoding="utf-8")):
                try:
                    rec = json.loads(line)
                    if "error" not in rec:
                        key = record_key(rec["split"], rec["question_id"], rec.get("dataset", ""))
                        self.done[key] = (rec["image"], rec["label"])
                except (json.JSONDecodeError, KeyError) as err:
                    raise DataError(f"{self.path}:{lineno}: not a pope-fast record ({err}); "
                                    "move the file away to start over") from None
        self._file = open(self.path, "a", encoding="utf-8")
        return dict(self.done)

    def _mend_last_line(self) -> None:
        """Complete a last line that lacks its newline, or drop it when it is torn JSON."""
        raw = self.path.read_bytes()
        if not raw or raw.endswith(b"\n"):
            return
        tail = raw[raw.rfind(b"\n") + 1:]
        try:
            json.loads(tail)
        except (json.JSONDecodeError, UnicodeDecodeError):
            with open(self.path, "r+b") as f:
                f.truncate(len(raw) - len(tail))
            return
        with open(self.path, "ab") as f:
            f.write(b"\n")

    def write(self, records: list[dict]) -> None:
        if self._file is None:
            raise RuntimeError("RecordWriter.open() first")
        self._file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        self._file.flush()
        os.fsync(self._file.fileno())
        self.done.update((record_key(r["split"], r["question_id"], r.get("dataset", "")), (r["image"], r["label"]))
                         for r in records if "error" not in r)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()


def write_meta(out_dir: str | Path, meta: dict) -> Path:
    path = Path(out_dir) / META_FILE
    path.write_text(json.dumps({"format": FORMAT, **meta}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


@dataclass
class Entry:
    """One scored question, normalised from any record format."""

    key: str
    split: str
    label: str
    first_token_id: int | None = None
    dataset: str = ""
    candidate_logits: dict[int, float] | None = None
    decoded: str | None = None
    stored: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    texts: dict[str, str] = field(default_factory=dict)  # text readouts whose prefix differs from decoded
    decoded_sequence: str | None = None

    def text_for(self, name: str) -> str | None:
        return self.texts.get(name, self.decoded)


@dataclass
class RecordSet:
    source: str
    entries: list[Entry]
    token_sets: dict[str, TokenSets]
    meta: dict
    prefer_stored: bool  # imported records: their stored predictions are the readouts they name


def _check_decision(value, where: str, name: str) -> str:
    if value not in DECISIONS:
        raise DataError(f"{where}: prediction {name}={value!r} is not yes/no/unknown")
    return value


def _read_ours(path: Path, text: str) -> RecordSet:
    meta_path = path.parent / META_FILE
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    token_sets = {n: TokenSets.from_json(s) for n, s in meta.get("token_sets", {}).items()}
    entries: list[Entry] = []
    position: dict[tuple[str, str], int] = {}  # key → index in entries
    for lineno, line in json_lines(text):
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: malformed JSON: {err.msg}") from None
        missing = [k for k in ("question_id", "split", "label") if k not in rec]
        if missing:
            raise DataError(f"{where}: missing key(s) {', '.join(missing)}")
        key = record_key(rec["split"], rec["question_id"], rec.get("dataset", ""))
        if key in position and entries[position[key]].error is None:
            raise DataError(f"{where}: duplicate record for question {key[2]} of split {key[1]}")
        logits = rec.get("candidate_logits")
        entry = Entry(
            key=str(rec["question_id"]), split=rec["split"], label=rec["label"],
            first_token_id=rec.get("first_token_id"), dataset=rec.get("dataset", ""),
            candidate_logits={int(i): float(v) for i, v in logits.items()} if logits is not None else None,
            decoded=rec.get("decoded"), texts=dict(rec.get("texts") or {}),
            decoded_sequence=rec.get("decoded_sequence"),
            stored={n: _check_decision(v, where, n) for n, v in rec.get("predictions", {}).items()
                    if n in READOUTS},
            error=rec.get("error"))
        if key in position:  # a retried question: its new record supersedes the error record
            entries[position[key]] = entry
        else:
            position[key] = len(entries)
            entries.append(entry)
    return RecordSet(str(path), entries, token_sets, meta, prefer_stored=False)


def _read_ugaa(path: Path, obj: dict) -> RecordSet:
    results = obj["results"]
    summary = obj.get("summary", {})
    split = summary.get("split") or split_from_name(path)
    keys = set().union(*(r.keys() for r in results)) if results else set()
    mapping = UGAA_CROSS_MODEL if "pred_legacy_2tok" in keys else UGAA_PAIRWISE
    adapter = str(summary.get("model") or path.name.split("_pope_")[0])
    whole = mapping is UGAA_CROSS_MODEL and adapter in UGAA_WHOLE_SEQUENCE
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
        if "error" in rec:  # a question whose generate failed: the paper's code drops it from every count
            entries.append(Entry(key=str(rec["question_id"]), split=split, label=str(rec["label"]).lower(),
                                 error=str(rec["error"])))
            continue
        entries.append(Entry(
            key=str(rec["question_id"]), split=split, label=str(rec["label"]).lower(),
            first_token_id=rec.get("top_token_id"),
            decoded=None if whole else rec.get("decoded_response"),
            decoded_sequence=rec.get("decoded_response") if whole else None,
            stored={ours: _check_decision(str(rec[theirs]).lower(), where, theirs)
                    for theirs, ours in mapping.items() if theirs in rec}))
    meta = {"imported_from": "ugaa-research", "schema": "pairwise" if mapping is UGAA_PAIRWISE
            else "cross_model", "whole_sequence": whole, "summary": summary}
    return RecordSet(str(path), entries, {}, meta, prefer_stored=True)


def read_records(path: str | Path) -> RecordSet:
    """Our records (a run folder or its records.jsonl) or a published ugaa-research file."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORDS_FILE
    if not path.is_file():
        raise DataError(f"{path}: no such records file")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None  # JSON lines: several objects
        if isinstance(obj, dict) and isinstance(obj.get("results"), list):
            return _read_ugaa(path, obj)
        return _read_ours(path, text)
    raise DataError(f"{path}: neither pope-fast JSON-lines records nor a ugaa-research record file")
