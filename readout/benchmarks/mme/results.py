"""MME's result files: the official eval_tool's result folder (read and written), lmms-eval's log.

The official folder (calculation.py, as ../shared/benchmarks/mme_synthetic/README.md states it)
holds one `<subtask>.txt` per subtask; each line is `image\\tquestion\\tgt\\tresponse`, gt Yes or
No, and the two lines of an image are consecutive, since calculation.py pairs consecutive lines
(divide_chunks, 99) and not image names. Writing that folder lets a user run the official
calculation.py on pope-fast's answers.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Mapping

from ...data import DataError, Question
from ...formats.lmms_eval import Sample, read_samples
from ..base import Response
from .rules import SUBTASKS

GT = {"Yes": "yes", "No": "no"}
LMMS_EVAL_METRICS = ("mme_perception_score", "mme_cognition_score")  # lmms-eval utils.py:87


def _file_name(image: str) -> str:
    """The image as a result line names it: the file, no parquet question_id's `<category>/`."""
    return image.rsplit("/", 1)[-1]


def _subtask(path: Path) -> str:
    if path.stem not in SUBTASKS:
        raise DataError(f"{path}: {path.stem!r} is not an MME subtask (a result folder holds "
                        f"<subtask>.txt for {', '.join(SUBTASKS)})")
    return path.stem


def _result_lines(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, [image, question, gt, response]) per line. Lines split as calculation.py's
    readlines() splits them (universal newlines); the response loses its line's "\\n", which never
    changes the official reading (rules.official_read)."""
    try:
        with path.open(encoding="utf-8") as file:
            lines = file.readlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None
    rows = []
    for lineno, line in enumerate(lines, start=1):
        fields = line.removesuffix("\n").split("\t")
        if len(fields) != 4:
            raise DataError(f"{path}:{lineno}: {len(fields)} tab-separated fields, not 4 "
                            "(image, question, gt, response)")
        if fields[2] not in GT:
            raise DataError(f"{path}:{lineno}: gt {fields[2]!r} is not Yes or No")
        rows.append((lineno, fields))
    if not rows:
        raise DataError(f"{path}: no lines")
    if len(rows) % 2:
        raise DataError(f"{path}:{len(rows)}: odd line count ({len(rows)}): calculation.py pairs "
                        "consecutive lines")
    return rows


def _check_pairs(path: Path, rows: list[tuple[int, list[str]]]) -> None:
    """Each image's two lines are consecutive, as calculation.py (99) assumes: a file where they are
    not would get other acc+ from it than from grouping by image, so it is refused rather than
    scored two ways."""
    first_line: dict[str, int] = {}
    for (line_a, (image_a, *_)), (line_b, (image_b, *_)) in zip(rows[::2], rows[1::2]):
        if image_a != image_b:
            raise DataError(f"{path}:{line_b}: image {image_b!r} after {image_a!r}: calculation.py "
                            "pairs consecutive lines, so an image's two lines must be adjacent")
        if image_a in first_line:
            raise DataError(f"{path}:{line_a}: image {image_a!r} has more than 2 lines "
                            f"(first at line {first_line[image_a]})")
        first_line[image_a] = line_a


def _question_index(questions: list[Question]) -> dict[tuple[str, str, str], list[Question]]:
    index = defaultdict(list)
    for question in questions:
        index[question.split, _file_name(question.image), question.text.strip()].append(question)
    return index


def _read_result_file(path: Path, index: dict | None) -> list[Response]:
    subtask = _subtask(path)
    rows = _result_lines(path)
    _check_pairs(path, rows)
    responses, order = [], defaultdict(int)
    for lineno, (image, text, gt, response) in rows:
        where = f"{path}:{lineno}"
        if index is None:
            key, image_key = f"{subtask}/{image}#{order[image]}", f"{subtask}/{image}"
            order[image] += 1
        else:
            question = _matched(index, subtask, image, text, gt, where)
            key, image_key = question.key, question.image
        responses.append(Response(key, subtask, response, GT[gt], image_key, where))
    return responses


def _matched(index: dict, subtask: str, image: str, text: str, gt: str, where: str) -> Question:
    """The question a line answers, by (subtask, image file, question text); each answered once."""
    found = index.get((subtask, image, text.strip()))
    if not found:
        raise DataError(f"{where}: no question of the data is {subtask} image {image!r} asking "
                        f"{text!r}")
    question = found.pop(0)
    if question.label != GT[gt]:
        raise DataError(f"{where}: gt {gt} but the data's label of question {question.key} is "
                        f"{question.label}")
    return question


def read_result_folder(path: Path, questions: list[Question] | None = None) -> list[Response]:
    """Every answer of an official result folder (or one `<subtask>.txt` of it), in file order. With
    `questions`, a line is keyed by the question of its subtask, image file and question text;
    without, by `<subtask>/<image>#<k>` (k its 0-based order among the image's lines), the key
    `MME.questions` gives when the parquet question_id is `<subtask>/<image file>`, as in
    lmms-lab/MME."""
    path = Path(path)
    # in a folder, the subtasks' files, as calculation.py opens them by name; another file
    # (notes.txt) is not read
    files = (sorted(p for p in path.iterdir() if p.suffix == ".txt" and p.stem in SUBTASKS)
             if path.is_dir() else [path])
    if not files:
        others = sorted(p.name for p in path.iterdir() if p.suffix == ".txt")
        verb = "name" + "s" * (len(others) == 1)
        named = f" ({', '.join(others)} {verb} no subtask)" if others else ""
        raise DataError(f"{path}: no <subtask>.txt result files in this folder{named}; "
                        f"MME's subtasks: {', '.join(SUBTASKS)}")
    if not all(p.is_file() for p in files):
        raise DataError(f"{path}: no such result file")
    index = None if questions is None else _question_index(questions)
    return [response for file in files for response in _read_result_file(file, index)]


def _clean(text: str) -> str:
    """A field without the characters that would end it: tab splits fields, and readlines() ends a
    line at \\n or \\r."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def write_result_folder(folder: Path, questions: list[Question],
                        texts: Mapping[str, str]) -> list[Path]:
    """The official result folder of `texts` (question key -> the model's answer text): one
    `<subtask>.txt` per subtask present, its lines in question order with each image's two lines
    together, tabs and line breaks in a text replaced by spaces. Returns the files written. Every
    question needs a text, and every image two questions: calculation.py would otherwise pair the
    wrong lines."""
    by_subtask: dict[str, dict[str, list[Question]]] = defaultdict(lambda: defaultdict(list))
    for question in questions:
        if question.split not in SUBTASKS:
            raise DataError(f"question {question.key}: split {question.split!r} is not an MME "
                            "subtask")
        if question.key not in texts:
            raise DataError(f"question {question.key}: no answer text to write")
        by_subtask[question.split][question.image].append(question)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for subtask, images in by_subtask.items():
        lines = []
        for image, pair in images.items():
            if len(pair) != 2:
                raise DataError(f"{subtask} image {image!r} has {len(pair)} questions; "
                                "calculation.py needs 2")
            lines += [f"{_clean(_file_name(image))}\t{_clean(q.text)}\t{q.label.capitalize()}\t"
                      f"{_clean(texts[q.key])}\n" for q in pair]
        path = folder / f"{subtask}.txt"
        path.write_text("".join(lines), encoding="utf-8", newline="\n")
        written.append(path)
    return written


def _response(sample: Sample, known: dict | None, order: defaultdict) -> Response:
    """One samples-log row as MME's answer (EvolvingLMMs-Lab/lmms-eval@75571cfe
    lmms_eval/tasks/mme/utils.py:90: the process_results entry names question_id and category;
    `target` is the doc's answer, Yes or No)."""
    entry = next((sample.metrics[m] for m in LMMS_EVAL_METRICS if m in sample.metrics), None)
    if not isinstance(entry, dict) or not {"question_id", "category"} <= set(entry):
        raise DataError(f"{sample.where}: no {' or '.join(LMMS_EVAL_METRICS)} entry with "
                        "question_id and category (not an lmms-eval MME samples log?)")
    if sample.target not in GT:
        raise DataError(f"{sample.where}: target {sample.target!r} is not Yes or No")
    if entry["category"] not in SUBTASKS:
        raise DataError(f"{sample.where}: category {entry['category']!r} is not an MME subtask")
    qid, label = str(entry["question_id"]), GT[sample.target]
    key = f"{qid}#{order[qid]}"
    order[qid] += 1
    if known is not None and (key not in known or known[key].label != label):
        raise DataError(f"{sample.where}: {key} ({label}) is no question of the data "
                        "(or its label differs)")
    return Response(key, entry["category"], sample.text, label, qid, sample.where)


def read_lmms_eval_samples(path: Path, questions: list[Question] | None = None) -> list[Response]:
    """Every answer of lmms-eval's `<date>_samples_mme.jsonl` (--log_samples, read by
    formats/lmms_eval.py), in doc_id order. doc_id is the row's index in the dataset, so an answer's
    key is `<question_id>#<k>`, k its order among its question_id's rows, as `MME.questions` keys
    them; with `questions`, that key and its label must be theirs."""
    known = None if questions is None else {q.key: q for q in questions}
    order: defaultdict = defaultdict(int)
    return [_response(sample, known, order)
            for sample in sorted(read_samples(path), key=lambda s: s.doc_id)]
