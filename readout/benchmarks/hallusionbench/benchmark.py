"""HallusionBench (tianyi-lab/HallusionBench, CVPR 2024): 1,129 yes/no questions on sets of original
and edited figures, 178 of them asked without a figure; its question file, its result file and each
tool's rule.

The official score comes from a GPT-4 judge (utils.py:26-73); pope-fast is judge-free, so its
"official" rule reads a yes/no decision and compares it with gt_answer, then aggregates exactly as
evaluation.py does (metrics.py). A result file written by `write_results` can still be judged by the
official script. Errors name the file and the row as `item N`, 1-based, as POPE's question reader
does for JSON arrays.
"""
from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Mapping

from . import metrics
from ...data import DataError, Question, surrogate_fault
from ...formats import vlmevalkit as tables
from ...readouts import NO, YES, yorn
from ..base import Answer, Benchmark, Response, Rule

NAME = "hallusionbench"
KEY_FIELDS = ("category", "subcategory", "set_id", "figure_id", "question_id")
ROW_FIELDS = KEY_FIELDS + ("visual_input",)  # what every question and result row must hold
QUESTION_FIELDS = ROW_FIELDS + ("question", "gt_answer", "filename")
PREDICTION = "model_prediction"  # the answer's field in a result file (evaluation.py:21)
LABELS = {"1": YES, "0": NO}  # gt_answer
OFFICIAL = "tianyi-lab/HallusionBench 67ba0de"


def _load(path: Path) -> list:
    """The file's JSON list."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read ({err})") from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: malformed JSON: {err.msg}") from None
    if not isinstance(items, list):
        raise DataError(f"{path}: not a JSON list of HallusionBench rows")
    return items


def _checked(row, where: str, required: tuple[str, ...]) -> dict:
    """A row with the fields the caller needs and ids the metrics can group by."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: not a JSON object")
    missing = [f for f in required if f not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")
    if row["category"] not in metrics.CATEGORIES:
        raise DataError(f"{where}: category {row['category']!r} is not VD or VS")
    if str(row["visual_input"]) not in metrics.CONDITIONS:
        raise DataError(f"{where}: visual_input {row['visual_input']!r} is not '0', '1' or '2'")
    blank = [f for f in KEY_FIELDS
             if not str(row[f]) or (f != "subcategory" and "_" in str(row[f]))]
    if blank:
        raise DataError(f"{where}: {', '.join(blank)} cannot make a key "
                        "(empty, or an id holding '_')")
    return row


def key_of(row: dict) -> str:
    """A row's official key (utils.py:174)."""
    return metrics.question_key(*(row[f] for f in KEY_FIELDS))


def _unique(items: list, path: Path, required: tuple[str, ...]) -> list[tuple[str, str, dict]]:
    """(key, where, row) per row; a key seen before is refused, as utils.py:175 asserts."""
    seen: dict[str, int] = {}
    out = []
    for index, row in enumerate(items, start=1):
        where = f"{path} item {index}"
        key = key_of(_checked(row, where, required))
        if key in seen:
            raise DataError(f"{where}: question {key} repeats item {seen[key]}")
        seen[key] = index
        out.append((key, where, row))
    return out


def _label(row: dict, where: str) -> str:
    value = str(row["gt_answer"])
    if value not in LABELS:
        raise DataError(f"{where}: gt_answer {row['gt_answer']!r} is not '1' or '0'")
    return LABELS[value]


def _image(row: dict, where: str) -> str:
    """The figure's path under the unzipped hallusion_bench folder (`VD/illusion/0_0.png`:
    PurePosixPath drops the file's './'), or "" for a question asked without one (visual_input '0',
    filename null): the engine runs those as text-only prompts."""
    filename = row.get("filename")
    if str(row["visual_input"]) == "0":
        if filename:
            raise DataError(f"{where}: visual_input '0' (no figure) but filename {filename!r}")
        return ""
    if not isinstance(filename, str) or not filename:
        raise DataError(f"{where}: visual_input {row['visual_input']!r} needs a filename")
    return PurePosixPath(filename).as_posix()


def rows(path: Path) -> list[dict]:
    """HallusionBench.json's rows as the file holds them (for `write_results`), each checked, keys
    unique."""
    return [row for _, _, row in _unique(_load(path), path, QUESTION_FIELDS)]


def _question(key: str, where: str, row: dict) -> Question:
    if not isinstance(row["question"], str) or not row["question"].strip():
        raise DataError(f"{where}: question is not a non-empty string")
    for field in ("question", "filename"):  # a tokenizer and a file system read them
        fault = surrogate_fault(row[field]) if isinstance(row.get(field), str) else None
        if fault:
            raise DataError(f"{where}: {field} {row[field]!r} {fault}")
    return Question(question_id=key, image=_image(row, where), text=row["question"],
                    label=_label(row, where),
                    split=metrics.split_name(row["category"], row["visual_input"]), dataset=NAME)


def _response(key: str, where: str, row: dict, question: Question | None) -> Response:
    """A result row's answer; where the question data is given, the row must agree with it."""
    text = row[PREDICTION]
    if not isinstance(text, str):
        raise DataError(f"{where}: {PREDICTION} is not a string")
    split = metrics.split_name(row["category"], row["visual_input"])
    label = _label(row, where) if "gt_answer" in row else (question.label if question else None)
    image = _image(row, where) if "filename" in row else (question.image if question else None)
    if question is not None and ((split, label, image)
                                 != (question.split, question.label, question.image)):
        raise DataError(f"{where}: question {key} differs from the question data "
                        "(visual_input, gt_answer or filename): another version of HallusionBench?")
    return Response(key=key, split=split, text=text, label=label, image=image, line=where)


def write_results(path: Path, question_rows: list[dict], texts: Mapping[str, str]) -> Path:
    """HallusionBench_result.json as evaluation.py:16, 21 reads it: every question row, in the
    question file's order (the judge's cache is positional, utils.py:27-32), with `model_prediction`
    the text answering its key. Every row needs an answer: the official script judges each row and
    pairs each question with its figure-0 row (utils.py:241). ASCII JSON, so that its `open()` reads
    it under any locale."""
    keys = [key_of(row) for row in question_rows]
    missing = [k for k in keys if k not in texts]
    unknown = sorted(set(texts) - set(keys))
    if missing or unknown:
        raise ValueError(f"{path}: {len(missing)} question(s) without an answer "
                         f"(first {missing[:1]}), {len(unknown)} answer(s) to no question "
                         f"(first {unknown[:1]})")
    out = [{**row, PREDICTION: texts[key]} for row, key in zip(question_rows, keys)]
    Path(path).write_text(json.dumps(out, indent=1) + "\n", encoding="ascii")
    return Path(path)


# Hallusion_rating reads the category (VD/VS), l2-category (`VD_ocr`: metrics.l2_category) and the
# set, figure and question ids as the 4th-6th '_'-separated parts of `index` (VLMEvalKit
# yorn.py:102, 110, 117-119); answer is matched case-sensitively against "Yes"/"No"
# (image_yorn.py:91).
TABLE_COLUMNS = tables.BASE + ("l2-category",)
TABLE_ANSWERS = {"Yes": YES, "No": NO}


def read_vlmevalkit_table(path: Path, questions: list[Question] | None) -> list[Response]:
    """A VLMEvalKit HallusionBench prediction table, each row joined to the question data by its
    official key `category_subcategory_set_id_figure_id_question_id` (its l2-category is
    `category_subcategory`). The table has no visual_input, and the official easy/hard split is
    decided by it (metrics.py), so the question data is needed; the label is the table's `answer`
    and must agree with the data's."""
    if questions is None:
        raise DataError(f"{path}: a VLMEvalKit HallusionBench table has no visual_input "
                        "(original or edited figure): give HallusionBench.json (--data)")
    known = {q.key: q for q in questions}
    out, seen = [], {}
    for where, row in tables.read_table(path, TABLE_COLUMNS, "HallusionBench"):
        ids = row["index"].strip().split("_")
        if len(ids) < 6:
            raise DataError(f"{where}: index {row['index']!r} has no set, figure and question ids "
                            "(its 4th-6th '_'-separated parts, as VLMEvalKit's Hallusion_rating "
                            "reads them)")
        l2 = row["l2-category"]  # `VD_ocr` in VLMEvalKit's TSV; a bare subcategory joins the data
        sub = l2[len(row["category"]) + 1:] if l2.startswith(f"{row['category']}_") else l2
        key = metrics.question_key(row["category"], sub, *ids[3:6])
        if key not in known:
            raise DataError(f"{where}: question {key} is not in the question data")
        if key in seen:  # two indices naming one question: every metric would count it twice
            raise DataError(f"{where}: question {key} repeats {seen[key]}")
        seen[key] = where
        question, label = known[key], tables.label(where, row["answer"], TABLE_ANSWERS)
        if label != question.label:
            raise DataError(f"{where}: question {key} has answer {row['answer']!r}; the question "
                            f"data says {question.label}: another version of HallusionBench?")
        out.append(Response(key, question.split, row["prediction"], label, question.image, where,
                            group=l2))
    return out


def _is_rows(path: Path) -> bool:
    """A JSON list of objects, one at least holding HallusionBench's ids: its file, which reading
    then refuses naming the row that lacks a field (visual_input, say); never raises."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read(64).lstrip()[:1] != "[":  # POPE's JSON lines start with '{'
                return False
        items = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return (isinstance(items, list) and bool(items) and all(isinstance(row, dict) for row in items)
            and any(all(f in row for f in KEY_FIELDS) for row in items))


RULES = {
    "official": Rule(
        "official", yorn, metrics.official, ("qAcc", "fAcc", "easy aAcc", "hard aAcc", "aAcc"),
        (f"{OFFICIAL} evaluation.py:62-135 (correctness, the leaderboard), :118-127 and :138-144 "
         "(stats)",
         f"{OFFICIAL} utils.py:130-163 (fAcc), :165-203 (aAcc), :205-338 (qAcc), :340-402 "
         "(easy/hard), :404-411 (assign_correctness), :414-427 (yes/no bias)",
         "judge-free stand-in for utils.py:26-73's GPT-4 judge: readout.readouts.yorn's decision "
         "against gt_answer; an unknown decision is the judge's 'unclear'")),
    "lmms-eval-rule": Rule(
        "lmms-eval-rule", metrics.lmms_eval_read, metrics.lmms_eval_rule, ("aAcc", "fAcc", "qAcc"),
        ("lmms-eval 75571cfe lmms_eval/tasks/hallusion_bench/evaluate_hb.py:93-126 "
         "(hb_aggregation_result_intern), :22-39 (the bare question, every doc's image)",
         "lmms_eval/tasks/hallusion_bench/hallusion_bench_image.yaml (split image; these metrics "
         "commented out: the task's default is the GPT judge)"), scale=1.0),
    "vlmevalkit": Rule(
        "vlmevalkit", yorn, metrics.vlmevalkit, ("aAcc", "fAcc", "qAcc"),
        ("VLMEvalKit e8e78f05 vlmeval/dataset/image_yorn.py:31-38 (the bare question), :91 (score)",
         "vlmeval/dataset/utils/yorn.py:96-145 (Hallusion_rating), :254-261 (YOrN_Extraction)",
         "results/HallusionBench.md at 92e31190 (no-visual questions skipped)",
         "l2-category `{category}_{subcategory}`, as its TSV's score file names its rows "
         "(open-compass/VLMEvalKit#825)"),
        rows="rows"),
}


class HallusionBench(Benchmark):
    name = NAME
    title = "HallusionBench"
    short_name = "HallusionBench"
    data = ("github.com/tianyi-lab/HallusionBench: HallusionBench.json (BSD-3-Clause); the figures "
            "are hallusion_bench.zip, linked from its README (Google Drive)")
    rules = RULES
    scale = 100.0  # qAcc in percent
    unit_name = "set (subcategory and set_id)"

    @classmethod
    def detect(cls, path: Path) -> bool:
        """HallusionBench.json, a result file of it, a folder holding one directly, or a VLMEvalKit
        prediction table (.tsv/.csv: its columns, only VD/VS categories)."""
        path = Path(path)
        if tables.is_table(path):
            return tables.fits(path, TABLE_COLUMNS, metrics.CATEGORIES)
        if path.is_dir():
            return any(_is_rows(p) for p in sorted(path.glob("*.json")))
        return path.suffix == ".json" and _is_rows(path)

    @classmethod
    def unit(cls, answer) -> str:
        """The set of figures, as `subcategory_set_id`: fAcc groups a figure's questions, qAcc a
        question across the set's figures, easy/hard pairs a question with its figure-0 row
        (utils.py:241). VD's and VS's sets of one subcategory and id go together: coarser than any
        rule's groups need (VLMEvalKit's l2-category holds the category, metrics.l2_category), which
        a resample's unit may be."""
        ids = metrics.fields(answer.key)
        return f"{ids.subcategory}_{ids.set_id}"

    @classmethod
    def copy(cls, answer, draw: int):
        ids = metrics.fields(answer.key)  # the set id made distinct: every group's key holds it
        key = metrics.question_key(ids.category, ids.subcategory, f"{ids.set_id}r{draw}",
                                   ids.figure_id, ids.question_id)
        return Answer(key, answer.split, answer.image, answer.label, answer.decision, answer.group)

    @classmethod
    def questions(cls, path: Path) -> list[Question]:
        """Every question, keyed by its official key, its split `{category}-{condition}`."""
        return [_question(key, where, row)
                for key, where, row in _unique(_load(path), path, QUESTION_FIELDS)]

    @classmethod
    def responses(cls, path: Path, questions: list[Question] | None = None) -> list[Response]:
        """HallusionBench_result.json's answers (question rows with `model_prediction`), keyed by
        the official key built from each row's fields; with `questions`, a key they lack is refused.
        A VLMEvalKit prediction table (.tsv/.csv) is read by read_vlmevalkit_table."""
        if tables.is_table(Path(path)):
            return read_vlmevalkit_table(Path(path), questions)
        known = None if questions is None else {q.key: q for q in questions}
        out = []
        for key, where, row in _unique(_load(path), path, ROW_FIELDS + (PREDICTION,)):
            if known is not None and key not in known:
                raise DataError(f"{where}: question {key} is not in the question data")
            out.append(_response(key, where, row, None if known is None else known[key]))
        return out
