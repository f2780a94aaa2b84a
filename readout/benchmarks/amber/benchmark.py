"""AMBER (junyangwang0410/AMBER @534babf6), its discriminative part: 14,216 yes/no queries (ids
1005-15220) over 1,004 images, in the dimensions existence, attribute (state, number, action) and
relation.

The generative queries (ids 1-1004, "Describe this image.") are left out: they are scored by CHAIR
and coverage over nouns, not by a yes/no answer. Truth comes from annotations.json, which the
official scorer reads by position (`ground_truth[id-1]`, inference.py:88-90); it is checked to hold
that id there and joined by id. lmms-eval has only the generative task (lmms_eval/tasks/amber_g
@75571cfe): it has no rule here.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import metrics as amber_metrics
from ...data import DataError, Question, read_text, surrogate_fault
from ...formats import vlmevalkit as tables
from ...readouts import NO, UNKNOWN, YES, yorn
from ..base import Benchmark, Response, Rule
from .metrics import ACTION, EXISTENCE, NUMBER, RELATION, STATE

# the union of the three per-dimension files
QUERY_FILE = Path("query") / "query_discriminative.json"
ANNOTATIONS = "annotations.json"
NAME = "amber"
GENERATIVE = "generative"
# annotations.json `type` -> our split, grouped as the scorer's counters group them
# (inference.py:175-184).
TYPES = {"discriminative-attribute-state": STATE, "discriminative-attribute-number": NUMBER,
         "discriminative-attribute-action": ACTION, "discriminative-hallucination": EXISTENCE,
         "discriminative-relation": RELATION, "relation": RELATION}
DISCRIMINATIVE_IDS = range(1005, 15221)  # the README's table; used only where no questions given
VLMEVALKIT_SUFFIX = "\nPlease answer yes or no."  # vlmeval/dataset/image_yorn.py:33-37 @e8e78f05


def prompt_vlmevalkit(question: str) -> str:
    return question + VLMEVALKIT_SUFFIX


def read_official(text: str) -> str:
    """Exact, case-sensitive equality, nothing stripped (inference.py:189, 214, 233): "No." is no
    answer."""
    return YES if text == "Yes" else NO if text == "No" else UNKNOWN


def _json(path: Path, what: str):
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: malformed JSON: {err.msg}") from None


def _list(path: Path, what: str) -> list:
    items = _json(path, what)
    if not isinstance(items, list):
        raise DataError(f"{path}: not a JSON list, as an {what} is (a {type(items).__name__} here)")
    return items


def _where(path: Path, index: int) -> str:
    """An entry of a JSON list, numbered from 1 like POPE's JSON arrays' items (annotations.json
    item n has id n)."""
    return f"{path} item {index + 1}"


def _field(path: Path, index: int, entry, key: str, kind: type):
    if not isinstance(entry, dict):
        raise DataError(f"{_where(path, index)}: an entry is a JSON object, "
                        f"not {type(entry).__name__}")
    value = entry.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DataError(f"{_where(path, index)}: {key!r} must be a {kind.__name__}, not {value!r}")
    return value


def _annotation(path: Path, annotations: list, qid: int) -> tuple[str, str | None]:
    """(type, truth) of id `qid`, found where the scorer looks: entry qid-1."""
    index = qid - 1
    if not 0 <= index < len(annotations):
        raise DataError(f"{path}: no entry for id {qid} (it holds {len(annotations)})")
    entry = annotations[index]
    if _field(path, index, entry, "id", int) != qid:
        raise DataError(f"{_where(path, index)}: holds id {entry['id']}, but the scorer reads id "
                        f"{qid} there")
    kind = _field(path, index, entry, "type", str)
    if kind == GENERATIVE:
        return kind, None
    if kind not in TYPES:
        raise DataError(f"{_where(path, index)}: unknown type {kind!r}")
    truth = entry.get("truth")
    if truth not in (YES, NO):
        raise DataError(f"{_where(path, index)}: truth must be 'yes' or 'no', not {truth!r}")
    return kind, truth


def _files(path: Path) -> tuple[Path, Path]:
    """(query file, annotations.json): a data folder, or a query file in data/query/."""
    if path.is_dir():
        return path / QUERY_FILE, path / ANNOTATIONS
    return path, path.parent.parent / ANNOTATIONS


def _questions(path: Path) -> list[Question]:
    query_file, annotation_file = _files(path)
    queries = _list(query_file, "AMBER query file")
    annotations = _list(annotation_file, "AMBER annotation file")
    found, seen = [], set()
    for index, entry in enumerate(queries):
        qid = _field(query_file, index, entry, "id", int)
        image, text = (_field(query_file, index, entry, key, str) for key in ("image", "query"))
        for key, value in (("image", image), ("query", text)):  # a tokenizer and a file system read
            if surrogate_fault(value):
                raise DataError(f"{_where(query_file, index)}: {key!r} {value!r} "
                                f"{surrogate_fault(value)}")
        if qid in seen:
            raise DataError(f"{_where(query_file, index)}: id {qid} is there twice")
        seen.add(qid)
        kind, truth = _annotation(annotation_file, annotations, qid)
        if kind != GENERATIVE:
            found.append(Question(qid, image, text, truth, TYPES[kind], dataset=NAME))
    return found


def _response_id(path: Path, index: int, entry, known: dict[int, Question] | None) -> int:
    qid = _field(path, index, entry, "id", int)
    if known is None and qid not in DISCRIMINATIVE_IDS:
        raise DataError(f"{_where(path, index)}: id {qid} is no discriminative AMBER id "
                        "(1005-15220)")
    if known is not None and qid not in known:
        raise DataError(f"{_where(path, index)}: id {qid} is not among the AMBER questions given")
    return qid


def _responses(path: Path, questions: list[Question] | None) -> list[Response]:
    known = None if questions is None else {int(q.question_id): q for q in questions}
    found, seen = [], set()
    for index, entry in enumerate(_list(path, "AMBER response file")):
        qid = _response_id(path, index, entry, known)
        text = _field(path, index, entry, "response", str)
        if qid in seen:
            raise DataError(f"{_where(path, index)}: id {qid} is there twice")
        seen.add(qid)
        question = None if known is None else known[qid]
        split, label, image = (("", None, None) if question is None
                               else (question.split, question.label, question.image))
        found.append(Response(str(qid), split, text, label, image, _where(path, index)))
    return found


def write_responses(path: Path, texts: dict[int, str]) -> Path:
    """The response file AMBER's inference.py reads (--inference_data), ids in order: `path`."""
    for qid, text in texts.items():
        if not isinstance(qid, int) or isinstance(qid, bool) or not isinstance(text, str):
            raise ValueError(f"AMBER responses are int id -> str text, not {qid!r} -> "
                             f"{type(text).__name__}")
    rows = [{"id": qid, "response": texts[qid]} for qid in sorted(texts)]
    path = Path(path)
    path.write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path


# AMBER_rating groups by category (the annotation type, mapped to Attribute/Existence/Relation,
# yorn.py:13-28) and image_path (24-32); the answer is compared lower-cased (image_yorn.py:88-89),
# so Yes/yes/YES are all labels.
TABLE_COLUMNS = tables.BASE + ("image_path",)


def read_vlmevalkit_table(path: Path) -> list[Response]:
    """A VLMEvalKit AMBER prediction table: key `index`, split from `category` (annotations.json's
    type, as AMBER_rating's category_mapping names it; the official blocks need the
    state/number/action type, so a category already folded into "Attribute" is refused), image
    `image_path`, label `answer` lower-cased. The table holds all the rules need; no question data
    is read."""
    out = []
    for where, row in tables.read_table(path, TABLE_COLUMNS, "AMBER"):
        if row["category"] not in TYPES:
            raise DataError(f"{where}: category {row['category']!r} is not one of AMBER's "
                            f"discriminative types ({', '.join(TYPES)})")
        label = tables.label(where, row["answer"].lower(), {YES: YES, NO: NO})
        out.append(Response(row["index"].strip(), TYPES[row["category"]], row["prediction"], label,
                            row["image_path"], where))
    return out


def _entries_have(path: Path, keys: set[str], exact: bool) -> bool:
    """Whether `path` is a non-empty JSON list of objects with these keys and int ids (no raise)."""
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if (not isinstance(items, list) or not items
            or not all(isinstance(item, dict) for item in items)):
        return False
    held = all((set(item) == keys) if exact else keys <= set(item) for item in items)
    return held and all(type(item["id"]) is int for item in items)


def _detect(path: Path) -> bool:
    if tables.is_table(path):
        return tables.fits(path, TABLE_COLUMNS, TYPES)
    if path.is_dir():
        return (path / QUERY_FILE).is_file() and (path / ANNOTATIONS).is_file()
    if not path.is_file():
        return False
    if _entries_have(path, {"id", "response"}, exact=True):
        return True
    return ((path.parent.parent / ANNOTATIONS).is_file()
            and _entries_have(path, {"id", "image", "query"}, False))


class Amber(Benchmark):
    name = NAME
    title = "AMBER (discriminative)"
    short_name = "AMBER"
    data = ("github.com/junyangwang0410/AMBER data/ (Apache-2.0); its 1,004 images are linked from "
            "its README (Google Drive), not in the repository")
    scale = 100.0  # accuracy in percent
    rules = {
        "official": Rule(
            "official", read_official, amber_metrics.official,
            headline=(f"{amber_metrics.OVERALL}/Accuracy", f"{amber_metrics.OVERALL}/F1"),
            sources=("junyangwang0410/AMBER@534babf6:inference.py:174-256 (reading, counting)",
                     "inference.py:269-338 (blocks)", "data/metrics.txt (counters start at 0.001)"),
            resampled=amber_metrics.official_resampled),
        "vlmevalkit": Rule(
            "vlmevalkit", yorn, amber_metrics.vlmevalkit, headline=("Avg ACC",),
            sources=("open-compass/VLMEvalKit@e8e78f05:vlmeval/dataset/image_yorn.py:33-37, 88-89",
                     "vlmeval/dataset/utils/yorn.py:9-47 (AMBER_rating), "
                     "254-261 (YOrN_Extraction)"),
            prompt=prompt_vlmevalkit, resampled=amber_metrics.vlmevalkit_resampled),
    }

    @classmethod
    def detect(cls, path: Path) -> bool:
        """AMBER's data folder, a query file of it (annotations.json in the folder above), a
        response file or a VLMEvalKit prediction table (.tsv/.csv: its columns, only AMBER's
        annotation types as categories)."""
        return _detect(Path(path))

    @classmethod
    def questions(cls, path: Path) -> list[Question]:
        """The discriminative queries of a data folder (query/query_discriminative.json) or of one
        query file, in file order, each joined by id to its annotation; generative ids are left
        out."""
        return _questions(Path(path))

    @classmethod
    def responses(cls, path: Path, questions: list[Question] | None = None) -> list[Response]:
        """AMBER's response file (inference.py's --inference_data): a JSON list of {"id": int,
        "response": str}. `questions` supply each answer's split, label and image, and the ids
        allowed; without them the split is "" and the id must be a discriminative one. A duplicate
        id is refused: the scorer counts it twice. A VLMEvalKit prediction table (.tsv/.csv) is read
        by read_vlmevalkit_table."""
        if tables.is_table(Path(path)):
            return read_vlmevalkit_table(Path(path))
        return _responses(Path(path), questions)
