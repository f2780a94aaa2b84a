"""Corrected labels for a run's questions, applied without the model (RePOPE).

RePOPE (Neuhaus & Hein, arXiv 2504.15707; github.com/YanNeu/RePOPE,
`annotations/coco_repope_{split}.json`) relabels POPE's COCO questions in POPE's own JSON-lines
format: a question it found ambiguous is left out of its file, a wrong label is flipped, the rest
are kept as they were; question ids are POPE's. So a run's records are relabelled by joining on
(split, question_id): questions the file lacks are dropped, the others take its label. The text and
image must be the ones the run asked (where a record keeps them), or the file belongs to other
questions. The relabelled records score as a dataset of their own (`repope`), beside the run's, so
every table, figure and comparison shows both.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...data import DataError, Question
from ...readouts import NO, YES
from ...records import RecordSet
from .questions import KNOWN_SPLITS, dataset_from_name, load_questions, split_from_name

# RePOPE relabels COCO's three files; a labels file naming no dataset is COCO's
POPE_DATASET = "coco"
RELABELLED = "repope"
COUNTS = ("questions", "kept", "removed", "yes_to_no", "no_to_yes", "labels_not_in_run")


Labels = dict[tuple[str, str], tuple[Path, dict[str, Question]]]


def read_labels(paths: list[str | Path]) -> Labels:
    """{(dataset, split): (file, {question_id: question})} from labels files in POPE's formats; the
    split must be in each file's name (`coco_repope_random.json`): never guessed."""
    labels: Labels = {}
    for path in map(Path, paths):
        split = split_from_name(path)
        if split not in KNOWN_SPLITS:
            raise DataError(f"{path}: labels file whose name names no POPE split "
                            f"({', '.join(KNOWN_SPLITS)}): the split is never guessed")
        group = (dataset_from_name(path) or POPE_DATASET, split)
        if group in labels:
            raise DataError(f"{path}: a second labels file for {group[0]} {split} "
                            f"(the first: {labels[group][0]})")
        other = next((g for g in labels if g[1] == split), None)
        # the relabelled records are one dataset: two datasets' questions would mix in a split
        if other is not None:
            raise DataError(f"{path}: labels for {group[0]} {split} beside {other[0]} {split} "
                            f"({labels[other][0]}): the relabelled run would mix both datasets' "
                            f"questions in one split {split}; give one dataset's labels at a time")
        questions = load_questions(path, split=split, dataset=group[0])
        labels[group] = (path, {q.key: q for q in questions})
    return labels


def relabel(records: RecordSet, labels: Labels) -> tuple[RecordSet, dict]:
    """The records of every split the labels cover, relabelled (dataset `repope`), and per split
    what changed: {split: {"labels" (its file's name), "from" (the records' dataset), "questions",
    "kept", "removed", "yes_to_no", "no_to_yes", "labels_not_in_run"}}. Records of a split no labels
    file covers are left out. Records without a dataset (written before datasets were named) match
    labels of any dataset."""
    entries, changes, seen = [], {}, set()
    for e in records.entries:
        group = next((g for g in labels if g[1] == e.split and e.dataset in (g[0], "")), None)
        if group is None:
            continue
        change = changes.setdefault(e.split, {"labels": labels[group][0].name, "from": e.dataset,
                                              **dict.fromkeys(COUNTS, 0)})
        change["questions"] += 1
        q = labels[group][1].get(e.key)
        if q is None:
            change["removed"] += 1
            continue
        seen.add((group, e.key))
        for field in ("text", "image"):
            ours = getattr(e, field)
            if ours is not None and ours != getattr(q, field):
                raise DataError(f"{records.source}: {e.split} question {e.key} has {field} "
                                f"{ours!r}; the labels file has {getattr(q, field)!r}: these "
                                "labels are for other questions")
        change["kept"] += 1
        change["yes_to_no"] += e.label == YES and q.label == NO
        change["no_to_yes"] += e.label == NO and q.label == YES
        entries.append(replace(e, label=q.label, dataset=RELABELLED))
    for group, (_, questions) in labels.items():
        if group[1] in changes:
            changes[group[1]]["labels_not_in_run"] = sum((group, k) not in seen for k in questions)
    if not entries:
        covered = ", ".join(f"{d} {s}" for d, s in labels)
        raise DataError(f"{records.source}: no record of the relabelled splits ({covered})")
    return replace(records, entries=entries), changes
