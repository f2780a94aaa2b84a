"""MME (Fu et al., 2023): 14 subtasks of yes/no questions, two per image (one Yes, one No), scored
by accuracy plus acc+ (both questions of an image right), each subtask out of 200.

The data is the lmms-lab/MME parquet layout (../shared/benchmarks/mme_synthetic/README.md, "Layout
of the real HF parquet"): question_id `<category>/<image file>`, shared by an image's two questions,
an embedded image, question, answer Yes/No, category. The rules are in `rules.py`, the result files
in `results.py`.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ...data import DataError, Question, open_parquet
from ...formats.lmms_eval import first_row, is_sample
from ...formats import vlmevalkit as tables
from ..base import Answer, Benchmark, Response
from .results import (LMMS_EVAL_METRICS, read_lmms_eval_samples, read_result_folder,
                      write_result_folder)
from .rules import RULES, SUBTASKS, missing_subtasks

COLUMNS = ("question_id", "image", "question", "answer", "category")
ANSWERS = {"Yes": "yes", "No": "no"}
# MME_rating groups by category, then image_path (VLMEvalKit yorn.py:56-61); answer is matched
# case-sensitively against "Yes"/"No" (image_yorn.py:91), so only those two spellings are labels.
TABLE_COLUMNS = tables.BASE + ("image_path",)

__all__ = ["MME", "write_result_folder"]


def parquet_files(path: Path) -> list[Path]:
    """A parquet file, or every `*.parquet` shard of a folder in name order (the HF split's)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".parquet")
        if not files:
            raise DataError(f"{path}: no *.parquet files in this folder "
                            "(lmms-lab/MME keeps them in data/)")
        return files
    if not path.is_file():
        raise DataError(f"{path}: no such question file")
    return [path]


def _open(path: Path):
    return open_parquet(path, COLUMNS)


def _checked(row: dict, where: str) -> tuple[str, str, str, str, bytes]:
    """(question_id, question, label, category, image bytes) of one row, or the DataError of its
    first fault."""
    for key in ("question_id", "question"):
        if not isinstance(row[key], str) or not row[key].strip():
            raise DataError(f"{where}: {key} {row[key]!r} is not a non-empty string")
    if row["answer"] not in ANSWERS:
        raise DataError(f"{where}: answer {row['answer']!r} is not Yes or No")
    if row["category"] not in SUBTASKS:
        raise DataError(f"{where}: category {row['category']!r} is not one of MME's 14 subtasks "
                        f"({', '.join(SUBTASKS)})")
    image = row["image"]
    data = image.get("bytes") if isinstance(image, dict) else None
    if not data:
        raise DataError(f"{where}: image has no embedded bytes")
    return row["question_id"], row["question"], ANSWERS[row["answer"]], row["category"], data


def _rows(path: Path, images: dict[str, bytes]) -> list[tuple[str, tuple]]:
    """(where, checked row) per row of one parquet file, rows numbered from 1. An image's bytes are
    kept once in `images` by question_id (MME stores a copy per question); a second copy must be the
    same image."""
    rows, index = [], 0
    for batch in _open(path).iter_batches(batch_size=64, columns=list(COLUMNS)):
        for row in batch.to_pylist():
            index += 1
            where = f"{path} row {index}"
            qid, text, label, category, data = _checked(row, where)
            kept = images.setdefault(qid, data)
            if kept != data:
                raise DataError(f"{where}: image differs from the earlier image of question_id "
                                f"{qid!r}")
            rows.append((where, (qid, text, label, category)))
    return rows


def _check_images(rows: list[tuple[str, tuple]]) -> None:
    """Each question_id (an image) has exactly 2 questions, of one category."""
    first: dict[str, tuple[str, str]] = {}
    count: dict[str, int] = defaultdict(int)
    for where, (qid, _, _, category) in rows:
        count[qid] += 1
        where_first, category_first = first.setdefault(qid, (where, category))
        if category != category_first:
            raise DataError(f"{where}: question_id {qid!r} is in {category}, but in "
                            f"{category_first} at {where_first}")
    for qid, n in count.items():
        if n != 2:
            raise DataError(f"{first[qid][0]}: image {qid!r} has {n} question(s); "
                            "MME has 2 per image")


def read_questions(path: Path) -> list[Question]:
    """Every question of an lmms-lab/MME parquet file or folder of shards, in file order; bad input
    raises DataError naming the file and row. question_id is `<parquet question_id>#<k>`, k the
    question's 0-based order among its image's rows (the Yes row comes first in MME); image is the
    parquet question_id."""
    images: dict[str, bytes] = {}
    rows = [row for file in parquet_files(path) for row in _rows(file, images)]
    _check_images(rows)
    order: dict[str, int] = defaultdict(int)
    questions = []
    for _, (qid, text, label, category) in rows:
        questions.append(Question(f"{qid}#{order[qid]}", qid, text, label, category, "mme",
                                  images[qid]))
        order[qid] += 1
    return questions


def _is_mme_parquet(path: Path) -> bool:
    """MME's columns with only MME's subtasks in category; or, where that column is missing,
    misspelt or holds another name, question_ids that each name an MME subtask (`<subtask>/<image
    file>`): MME's file still, whose reading then names the column or the row (as another
    benchmark's, its images would clash by name)."""
    def values(table, column: str) -> set:
        return {v for batch in table.iter_batches(columns=[column])
                for v in batch.column(0).to_pylist()}

    try:
        table = open_parquet(path, ("question_id",))
        subtasks = {str(v).split("/", 1)[0] if "/" in str(v) else None
                    for v in values(table, "question_id")}
        categories = values(table, "category") if "category" in table.schema_arrow.names else set()
    except (DataError, OSError, ValueError):  # pyarrow's ArrowInvalid and ArrowIOError are these
        return False
    return ((bool(subtasks) and subtasks <= set(SUBTASKS))
            or (bool(categories) and categories <= set(SUBTASKS)
                and not (set(COLUMNS) - set(table.schema_arrow.names))))


def read_vlmevalkit_table(path: Path) -> list[Response]:
    """A VLMEvalKit MME prediction table: key `index`, split `category` (MME's subtask names, which
    its MME_rating sums into perception and reasoning, yorn.py:77-91), image `image_path` (how it
    pairs an image's two answers), label `answer`. The table holds all the rules need, so no
    question data is read."""
    out = []
    for where, row in tables.read_table(path, TABLE_COLUMNS, "MME"):
        if row["category"] not in SUBTASKS:
            raise DataError(f"{where}: category {row['category']!r} is not one of MME's 14 "
                            "subtasks")
        if not row["image_path"].strip():
            raise DataError(f"{where}: blank image_path (MME pairs an image's two answers by it)")
        out.append(Response(row["index"].strip(), row["category"], row["prediction"],
                            tables.label(where, row["answer"], ANSWERS), row["image_path"], where))
    return out


class MME(Benchmark):
    name = "mme"
    title = ("MME: a comprehensive evaluation benchmark for multimodal large language models "
             "(Fu et al., 2023)")
    short_name = "MME"
    data = ("lmms-lab/MME on Hugging Face (lmms-lab-encoder/MME since lmms-eval 4be7ee0e), the "
            "test split as parquet with embedded images; its licence is not established here "
            "(../shared's synthetic stand-in copies only the layout)")
    rules = RULES
    scale = 2000.0  # Perception: 10 subtasks of 200
    unit_name = "image"

    @classmethod
    def detect(cls, path: Path) -> bool:
        """An MME parquet (file or folder of shards: MME's columns, only MME's categories), an
        official result folder or file (`<subtask>.txt` named by MME's subtasks only), an lmms-eval
        MME samples log or a VLMEvalKit prediction table (.tsv/.csv: its columns, only MME's
        categories)."""
        path = Path(path)
        if tables.is_table(path):
            return tables.fits(path, TABLE_COLUMNS, SUBTASKS)
        if path.is_dir():
            shards = sorted(p for p in path.iterdir() if p.suffix == ".parquet")
            if shards:
                return _is_mme_parquet(shards[0])
            # calculation.py opens each subtask's file by name: others beside them (notes.txt) not
            return any(p.suffix == ".txt" and p.stem in SUBTASKS for p in path.iterdir())
        if path.suffix == ".parquet":
            return path.is_file() and _is_mme_parquet(path)
        if path.suffix == ".txt":
            return path.is_file() and path.stem in SUBTASKS
        return (path.suffix == ".jsonl" and path.is_file()
                and is_sample(first_row(path), LMMS_EVAL_METRICS))

    @classmethod
    def questions(cls, path: Path) -> list[Question]:
        return read_questions(path)

    @classmethod
    def checks(cls, answers) -> list[str]:
        return missing_subtasks(answers)

    @classmethod
    def unit(cls, answer) -> str:
        """The image: acc+ takes an image's two answers together (rules group by subtask, image)."""
        return f"{answer.split}/{answer.image}"

    @classmethod
    def copy(cls, answer, draw: int):
        return Answer(f"{answer.key}~{draw}", answer.split, f"{answer.image}~{draw}", answer.label,
                      answer.decision)

    @classmethod
    def responses(cls, path: Path, questions: list[Question] | None = None) -> list[Response]:
        """An official result folder (or one `<subtask>.txt`), lmms-eval's samples log (`*.jsonl`)
        or a VLMEvalKit prediction table (.tsv/.csv)."""
        path = Path(path)
        if tables.is_table(path):
            return read_vlmevalkit_table(path)
        if path.suffix == ".jsonl":
            return read_lmms_eval_samples(path, questions)
        if path.is_dir() or path.suffix == ".txt":
            return read_result_folder(path, questions)
        raise DataError(f"{path}: not an MME result folder, <subtask>.txt, lmms-eval samples log "
                        "(*.jsonl) or VLMEvalKit prediction table (.tsv, .csv)")
