"""Per-question records: the schema of a record line (what `make_record` writes and `checked_record`
accepts), and reading ours back for scoring (a run folder's records.jsonl with its meta.json:
`read_ours`; reading any records file, ours or another tool's, is reading.py). Where records and
meta are written, locked, repaired and ordered is the application's run-folder store
(`pope_fast/store.py`)."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from .data import LABELS, DataError, Question
from .readouts import DECISIONS, READOUTS, TokenSets

RECORDS_FILE, META_FILE = "records.jsonl", "meta.json"
# A torchrun job's ranks each write a part (records.rank<R>.jsonl), folded into records.jsonl at
# the job's end by the store; a stopped job leaves them, and reading the folder reads them too.
PARTS_GLOB = "records.rank*.jsonl"
PART = re.compile(r"records\.rank(\d+)\.jsonl")


def part_name(rank: int) -> str:
    return f"records.rank{rank}.jsonl"


def rank_parts(folder: Path) -> list[Path]:
    """The rank parts in a run folder, by name."""
    return sorted(Path(folder).glob(PARTS_GLOB))


def answer_field(json_type: type | None, **default):
    """An AnswerFields field (default None), held by checked_record to its JSON type (None: its
    reader checks it)."""
    return field(metadata={"json": json_type}, **(default or {"default": None}))


@dataclass(kw_only=True)
class AnswerFields:
    """What a record keeps of one prompt's answer: the engine's PromptResult is one (with its
    tensors), make_record writes one and Entry reads one back. A record line holds them in this
    order, each where it is not None, read back as written (absent: the default) and checked as its
    JSON type; `_written` and `_answer` name the few whose JSON is not their value (non-finite
    floats, texts where they differ from `decoded`, capped where any)."""

    first_token_id: int | None = answer_field(int)  # the answer position's argmax (null: none read)
    candidate_logits: dict[int, float] | None = answer_field(dict)  # fp32, keyed by token id
    # over the whole vocabulary, where settings.record_mass (NaN: a fault)
    logsumexp: float | None = answer_field(None)
    # the whole greedy continuation, where a text readout asked for one
    decoded: str | None = answer_field(str)
    texts: dict[str, str] = answer_field(dict, default_factory=dict)  # each text readout's prefix
    # the prompt and its continuation decoded as one (with_prompt)
    decoded_sequence: str | None = answer_field(str)
    capped: tuple[str, ...] = answer_field(list, default=())  # the text readouts max_new_tokens cut
    reasoning: str | None = answer_field(str)  # a thinking checkpoint's decoded reasoning, if run
    reasoning_tokens: int | None = answer_field(int)
    # why no answer position was read (a reasoning not closed): all unknown
    unanswered: str | None = answer_field(str)

    def text_for(self, readout: str) -> str | None:
        """The text a text readout reads: its own prefix of the continuation, else all of it."""
        return (self.texts or {}).get(readout, self.decoded)

    def as_answer(self) -> AnswerFields:
        """These fields alone (a PromptResult's without its tensors)."""
        return AnswerFields(**{f.name: getattr(self, f.name) for f in fields(AnswerFields)})


def make_record(question: Question, template: str, answer: AnswerFields | None = None, *,
                predictions: dict[str, str] | None = None, error: str | None = None,
                image_sha256: str | None = None, probe: dict | None = None, **given) -> dict:
    """One question's record: `answer` (or its AnswerFields given as keywords), the readouts'
    `predictions` and the probe's values (the image-attention probe's one float per decoder layer);
    or, where it could not be answered, the `error`. Its question text and the sha256 of its image's
    bytes are kept so that a resumed run can prove a recorded answer is still the answer to this
    question."""
    if answer is not None and given:
        raise TypeError(f"make_record: an answer or its fields ({', '.join(given)}), not both")
    record = {"question_id": question.question_id, "split": question.split, "image": question.image,
              "label": question.label, "text": question.text, "template": template}
    if question.dataset:  # absent in records written before datasets were named: read back as ""
        record["dataset"] = question.dataset
    if image_sha256 is not None:
        record["image_sha256"] = image_sha256
    if error is not None:
        record["error"] = error
        return record
    faults: dict = {}
    record.update(_written(answer if answer is not None else AnswerFields(**given), faults))
    record["predictions"] = dict(predictions or {})
    for key, values in (probe or {}).items():  # e.g. image_attention: one float per decoder layer
        record[key], bad = _finite_list(values)
        if bad:  # a non-finite value of a probe is written as null; null means nothing else there
            faults[key] = "nan"
    if faults:
        record["non_finite"] = faults
    return record


# an answer record's answer position, even one not read (null, {})
ALWAYS = ("first_token_id", "candidate_logits")


def _written(answer: AnswerFields, faults: dict) -> dict:
    """The answer's fields as a record line holds them, in AnswerFields' order; a non-finite float's
    fault in `faults`."""
    out = {f.name: getattr(answer, f.name) for f in fields(AnswerFields)
           if getattr(answer, f.name) is not None or f.name in ALWAYS}
    # JSON has no NaN or infinities: -inf (a token a method's plausibility cut removed) is written
    # as null, and so is a NaN or +inf (a numerical fault), which `non_finite` names, to be read
    # back as it was
    logits = out["candidate_logits"] or {}
    out["candidate_logits"] = {str(i): float(v) if math.isfinite(v) else None
                               for i, v in logits.items()}
    faulty = {str(i): "nan" if math.isnan(v) else "inf" for i, v in logits.items()
              if not math.isfinite(v) and v != float("-inf")}
    if faulty:
        faults["candidate_logits"] = faulty
    mass = out.get("logsumexp")
    if mass is not None:  # --record-mass only: without it a record is as it was
        out["logsumexp"] = float(mass) if math.isfinite(mass) else None
        if not math.isfinite(mass):
            faults["logsumexp"] = "nan" if math.isnan(mass) else "inf"
    # the text readouts' own texts only where they differ from it (read it for the others)
    decoded = answer.decoded
    out["texts"] = ({n: t for n, t in (answer.texts or {}).items() if t != decoded}
                    if decoded is not None else {})
    out["capped"] = list(answer.capped or ())
    return {k: v for k, v in out.items() if v or k not in ("texts", "capped")}


def _finite_list(values):
    """A probe's (nested) list of floats each non-finite value null, and whether there was one."""
    if isinstance(values, list):
        pairs = [_finite_list(v) for v in values]
        return [v for v, _ in pairs], any(f for _, f in pairs)
    if isinstance(values, float) and not math.isfinite(values):
        return None, True
    return values, False


def strict_json(obj, **kwargs) -> str:
    """JSON with no bare NaN or Infinity, which strict parsers refuse: non-finite floats null."""
    return json.dumps(_nulled(obj), allow_nan=False, **kwargs)


def _nulled(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nulled(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nulled(v) for v in obj]
    return obj


def record_key(split: str, question_id, dataset: str = "") -> tuple[str, str, str]:
    """One question of one run: POPE's datasets reuse the question ids 1..3,000 in every split."""
    return dataset, split, str(question_id)


def checked_record(rec, where: str) -> dict:
    """A parsed record line, or DataError naming `where`: a JSON object, its key fields typed."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    missing = [k for k in ("question_id", "split", "label") if k not in rec]
    if missing:
        raise DataError(f"{where}: missing key(s) {', '.join(missing)}")
    qid, split = rec["question_id"], rec["split"]
    if not isinstance(qid, (int, str)) or isinstance(qid, bool):
        raise DataError(f"{where}: question_id {qid!r} is not an int or string")
    if not isinstance(split, str) or not split:
        raise DataError(f"{where}: split {split!r} is not a non-empty string")
    if rec["label"] not in LABELS:
        raise DataError(f"{where}: label {rec['label']!r} is not yes/no")
    expected = {"predictions": dict, "error": str, "text": str, "image": str, "image_sha256": str,
                "dataset": str, "image_attention": list, "image_attention_heads": list,
                "non_finite": dict, **{f.name: f.metadata["json"] for f in fields(AnswerFields)
                                       if f.metadata["json"] is not None}}
    for key, kind in expected.items():
        value = rec.get(key)
        if value is not None and (not isinstance(value, kind)
                                  or kind is int and isinstance(value, bool)):
            article = "an" if kind is int else "a"
            raise DataError(f"{where}: {key} {value!r} is not {article} {kind.__name__}")
    return rec


def json_lines(text: str):
    """(line number, line) of a JSON-lines text, split on "\n" only: str.splitlines() also breaks
    at U+2028, U+2029 and U+0085, which json.dumps(ensure_ascii=False) writes raw inside strings
    (a decoded continuation can hold one)."""
    for lineno, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield lineno, line


def duplicate_message(where: str, key: tuple[str, str, str], run_dir: Path) -> str:
    return (f"{where}: duplicate record for question {key[2]} of split {key[1]} (two runs wrote to "
            f"this folder); `pope-fast repair {run_dir}` keeps the last complete record of each "
            "question")


def read_meta(path: Path) -> dict:
    """A run's meta.json ({} when absent), or DataError naming it."""
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err}); a torn meta.json: move the run folder "
                        "away or restore the file") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    for key in ("model", "settings", "tokenizer", "token_sets"):
        if not isinstance(meta.get(key, {}), dict):
            raise DataError(f"{path}: {key} is not a JSON object")
    try:
        for sets in meta.get("token_sets", {}).values():
            TokenSets.from_json(sets)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise DataError(f"{path}: token_sets must map readouts to yes_ids and no_ids lists of "
                        "ints") from None
    return meta


@dataclass
class Entry(AnswerFields):
    """One scored question from any record format, with its answer's fields where it has them."""

    key: str
    split: str
    label: str
    dataset: str = ""
    stored: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    image_attention: list[float] | None = None  # the probe's value per decoder layer, where it ran
    text: str | None = None  # the question, where the record keeps it (ours; published files not)
    image: str | None = None
    non_finite: tuple[str, ...] = ()  # the fields that held a NaN or infinity (named in the record)


@dataclass
class RecordSet:
    source: str
    entries: list[Entry]
    token_sets: dict[str, TokenSets]
    meta: dict
    prefer_stored: bool  # imported records: their stored predictions are the readouts they name


def check_decision(value, where: str, name: str) -> str:
    if value not in DECISIONS:
        raise DataError(f"{where}: prediction {name}={value!r} is not yes/no/unknown")
    return value


def read_ours(source: Path, files: list[tuple[Path, str]]) -> RecordSet:
    """Our records.jsonl (`source`) and a stopped torchrun job's rank parts: (path, text) each."""
    folder = source.parent
    meta = read_meta(folder / META_FILE)
    token_sets = {n: TokenSets.from_json(s) for n, s in meta.get("token_sets", {}).items()}
    entries: list[Entry] = []
    position: dict[tuple[str, str, str], int] = {}  # key → index in entries
    for path, text in files:
        for where, rec in _lines(path, text):
            key = record_key(rec["split"], rec["question_id"], rec.get("dataset", ""))
            if key in position and entries[position[key]].error is None:
                raise DataError(duplicate_message(where, key, folder))
            entry = _entry(rec, where)
            if key in position:  # a retried question: its new record supersedes the error record
                entries[position[key]] = entry
            else:
                position[key] = len(entries)
                entries.append(entry)
    return RecordSet(str(source), entries, token_sets, meta, prefer_stored=False)


def _lines(path: Path, text: str):
    """(where, record) per line; a torn last line (being written, or cut by a crash): none yet."""
    for lineno, line in json_lines(text):
        where = f"{path}:{lineno}"
        try:
            yield where, checked_record(json.loads(line), where)
        except json.JSONDecodeError as err:
            if not text.endswith("\n") and lineno == text.count("\n") + 1:
                return
            raise DataError(f"{where}: malformed JSON: {err.msg}") from None


def _entry(rec: dict, where: str) -> Entry:
    answer = _answer(rec, where)
    return Entry(key=str(rec["question_id"]), split=rec["split"], label=rec["label"],
                 dataset=rec.get("dataset", ""), image_attention=_probe(rec.get("image_attention")),
                 text=rec.get("text"), image=rec.get("image"),
                 stored={n: check_decision(v, where, n)
                         for n, v in rec.get("predictions", {}).items() if n in READOUTS},
                 error=rec.get("error"), non_finite=tuple(rec.get("non_finite") or ()), **answer)


def _answer(rec: dict, where: str) -> dict:
    """The AnswerFields a record holds, as make_record wrote them (absent or null: the default)."""
    answer = {f.name: rec[f.name] for f in fields(AnswerFields) if rec.get(f.name) is not None}
    logits = _logits(rec.get("candidate_logits"), _faults(rec, "candidate_logits"), where)
    return {**answer, "candidate_logits": logits,
            "logsumexp": _logsumexp(rec, where), "capped": tuple(answer.get("capped", ()))}


def _logits(logits: dict | None, faults: dict, where: str) -> dict[int, float] | None:
    """Token id -> logit; null is -inf, or the NaN or +inf that non_finite names for that id."""
    if logits is None:
        return None
    try:
        return {int(i): float(faults.get(i, "-inf")) if v is None else float(v)
                for i, v in logits.items()}
    except (TypeError, ValueError):
        raise DataError(f"{where}: candidate_logits must map token ids to numbers") from None


def _faults(rec: dict, key: str) -> dict:
    faults = (rec.get("non_finite") or {}).get(key) or {}
    return faults if isinstance(faults, dict) else {}


def _logsumexp(rec: dict, where: str) -> float | None:
    """The record's logsumexp (None where it holds none); null is the NaN or infinity that
    non_finite names."""
    if "logsumexp" not in rec:
        return None
    value = rec["logsumexp"]
    if value is None:
        fault = (rec.get("non_finite") or {}).get("logsumexp")
        return float(fault) if fault in ("nan", "inf") else math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(f"{where}: logsumexp must be a number, not {value!r}")
    return float(value)


def _probe(values):
    """A probe's values with null (a non-finite value, make_record's) as NaN."""
    if values is None:
        return None
    return [math.nan if v is None else v for v in values]


def expand_runs(paths) -> list[str]:
    """The runs a command was given, a paired run's folder (OUT/ holding OUT/none/, OUT/vcd/, ...)
    standing for its method folders: the baseline first (the order of OUT/compare.json, else `none`
    first and the rest by name)."""
    out = []
    for path in map(Path, paths):
        if not path.is_dir() or _holds_records(path):
            out.append(str(path))
            continue
        folders = [f for f in sorted(path.iterdir()) if f.is_dir() and _holds_records(f)]
        if not folders:
            out.append(str(path))  # read_records names what is missing
            continue
        order = _compared(path / "compare.json")
        folders.sort(key=lambda f: (order.index(f.name) if f.name in order else len(order),
                                    f.name != "none", f.name))
        out += [str(f) for f in folders]
    return out


def _holds_records(folder: Path) -> bool:
    return (folder / RECORDS_FILE).is_file() or bool(rank_parts(folder))


def _compared(path: Path) -> list[str]:
    """The method folders' names in a paired run's compare.json order (baseline first), or []."""
    try:
        pairs = json.loads(path.read_text(encoding="utf-8"))["pairs"]
        return list(dict.fromkeys(Path(p[k]).name for p in pairs for k in ("a", "b")))
    except (OSError, ValueError, KeyError, TypeError):
        return []


def model_name(meta: dict) -> str | None:
    """The model a run's meta.json names, as a table row says it: the hub id it was run from, else
    its checkpoint folder's name (a hub cache snapshot's repository), else what an imported file
    names; None when it names none."""
    hub = (meta.get("hub") or {}).get("model") or {}
    if hub.get("id"):
        return hub["id"]
    path = (meta.get("model") or {}).get("path")
    if path:
        folder = Path(path)
        if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
            return folder.parent.parent.name[len("models--"):].replace("--", "/")
        return folder.name or None
    return (meta.get("summary") or {}).get("model")
