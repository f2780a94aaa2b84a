"""HallusionBench's metrics as each tool aggregates them, from yes/no decisions (no GPT judge).

What the metrics group by travels in the two fields every record carries. The key is the official
question key, `category_subcategory_set_id_figure_id_question_id` (HallusionBench utils.py:174),
which names the figure and the question pair. The split is `{category}-{condition}`, the condition
naming visual_input ('0' none, '1' original, '2' edited): easy/hard is decided by visual_input
(utils.py:346, 378), and it cannot be read from the key, since VS figure 1 is an original image in
some sets and an edited one in others. visual_input is constant within a figure, so a split never
cuts a figure in two.

Sources: tianyi-lab/HallusionBench 67ba0de (evaluation.py, utils.py), VLMEvalKit e8e78f05
(vlmeval/dataset/utils/yorn.py, image_yorn.py), lmms-eval 75571cfe
(lmms_eval/tasks/hallusion_bench/).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from ...readouts import NO, UNKNOWN, YES
from ..base import Answer

CATEGORIES = ("VD", "VS")
CONDITIONS = {"0": "none", "1": "original", "2": "edited"}  # visual_input → the split's condition
VISUAL_INPUT = {condition: code for code, condition in CONDITIONS.items()}


@dataclass(frozen=True)
class Fields:
    """A question's ids as the official key joins them (every id a string, as the JSON holds
    them)."""
    category: str
    subcategory: str
    set_id: str
    figure_id: str
    question_id: str


def question_key(category, subcategory, set_id, figure_id, question_id) -> str:
    """The official unique key (utils.py:174); ids are str()-ed as the official code does."""
    return "_".join(str(v) for v in (category, subcategory, set_id, figure_id, question_id))


def fields(key: str) -> Fields:
    """The ids of an official key; the subcategory lies between the category and the last three."""
    parts = str(key).split("_")
    if len(parts) < 5 or not all(parts) or parts[0] not in CATEGORIES:
        raise ValueError(f"{key!r} is not a HallusionBench key "
                         "(category_subcategory_set_id_figure_id_question_id)")
    return Fields(parts[0], "_".join(parts[1:-3]), *parts[-3:])


def split_name(category: str, visual_input: str) -> str:
    """`VS-edited` for a VS question on an edited image (visual_input '2')."""
    return f"{category}-{CONDITIONS[str(visual_input)]}"


def _split_parts(split: str) -> tuple[str, str]:
    category, _, condition = split.partition("-")
    if category not in CATEGORIES or condition not in VISUAL_INPUT:
        raise ValueError(f"split {split!r} is not a HallusionBench split "
                         "({VD,VS}-{none,original,edited})")
    return category, VISUAL_INPUT[condition]


@dataclass(frozen=True)
class Row:
    """One answer with the ids and visual_input the metrics group by."""
    ids: Fields
    visual_input: str
    label: str
    decision: str
    l2: str  # VLMEvalKit's l2-category: a table's own column as it comes, else l2_category(ids)

    @property
    def figure(self) -> str:  # get_eval_fig's group (utils.py:137)
        ids = self.ids
        return "_".join((ids.category, ids.subcategory, ids.set_id, ids.figure_id))

    @property
    def pair(self) -> str:  # get_eval_pair_all's group (utils.py:222)
        ids = self.ids
        return "_".join((ids.category, ids.subcategory, ids.set_id, ids.question_id))

    @property
    def no_figure(self) -> bool:  # VS figure 0: asked without the image (utils.py:135, 407)
        return self.ids.category == "VS" and self.ids.figure_id == "0"


def rows(answers: Iterable[Answer]) -> list[Row]:
    """The answers' ids, from each key and split; a key whose split contradicts its category is
    refused."""
    out = []
    for answer in answers:
        ids = fields(answer.key)
        category, visual_input = _split_parts(answer.split)
        if category != ids.category:
            raise ValueError(f"question {answer.key}: split {answer.split!r} is not of category "
                             f"{ids.category}")
        out.append(Row(ids, visual_input, answer.label, answer.decision,
                       answer.group or l2_category(ids)))
    return out


def _groups(rows_: list[Row], correct: list[bool], key: Callable[[Row], str],
            keep: Callable[[Row], bool] = lambda r: True) -> dict[str, list[bool]]:
    """Each group's correctness in answer order (dicts keep insertion order, as the official dicts
    do)."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for row, right in zip(rows_, correct):
        if keep(row):
            groups[key(row)].append(right)
    return groups


def _percent(count: int, total: int) -> float | None:
    """evaluation.py's `round(100 * correct / total, 4)` (l.78, 111-114); None where it would divide
    by zero."""
    return round(100 * count / total, 4) if total else None


def _all_right(groups: dict[str, list[bool]]) -> float | None:
    """A group counts only if every member is correct (utils.py:153-155, 325-326, 364-368)."""
    return _percent(sum(all(v) for v in groups.values()), len(groups))


def official_correct(row: Row) -> bool:
    """assign_correctness (utils.py:404-411) with pope-fast's judge-free stand-in for GPT's code: a
    yes/no decision equal to gt_answer is code 1 ("correct"), a different one code 0, an unknown one
    code 2 ("unclear"), which the official rule counts as correct on VS figure 0 (the question asked
    without its figure) and wrong elsewhere."""
    if row.decision == UNKNOWN:
        return row.no_figure
    return row.decision == row.label


def _question_stats(rows_: list[Row]) -> dict:
    """evaluation.py:118-127's counts: questions easy (visual_input != '2') and hard per category,
    figures per category (VS figure 0 is none), and the groups behind qAcc and easy/hard aAcc."""
    out = {"questions": len(rows_)}
    for category in CATEGORIES:
        own = [r for r in rows_ if r.ids.category == category]
        out[f"easy questions {category}"] = sum(r.visual_input != "2" for r in own)
        out[f"hard questions {category}"] = sum(r.visual_input == "2" for r in own)
        out[f"figures {category}"] = len({r.figure for r in own if not r.no_figure})
    out["figures"] = out["figures VD"] + out["figures VS"]
    out["pairs"] = len({r.pair for r in rows_})
    out["easy pairs"] = len({r.pair for r in rows_ if r.visual_input != "2"})
    out["hard pairs"] = len({r.pair for r in rows_ if r.visual_input == "2"})
    return out


def _consistency(figures: dict[str, list[bool]]) -> dict:
    """The consistency test (evaluation.py:141; utils.py:153-160): figures all correct, none correct
    (wrong), the rest inconsistent, each as a rounded percentage of the figures."""
    right = sum(all(v) for v in figures.values())
    wrong = sum(not any(v) for v in figures.values())
    total = len(figures)
    return {"Consistency Test (correct)": _percent(right, total),
            "Consistency Test (inconsistent)": _percent(total - right - wrong, total),
            "Consistency Test (wrong)": _percent(wrong, total)}


def _bias(rows_: list[Row], correct: list[bool]) -> dict:
    """yes_ratio_stats (utils.py:414-427) as written: its "yes" is `correct == gt_answer` (a correct
    answer to a yes question or a wrong one to a no question), and the FP ratio is the share of gt
    'no' among wrong answers."""
    gt = [int(r.label == YES) for r in rows_]
    said_yes = [int(int(c) == g) for c, g in zip(correct, gt)]
    wrong_gt = [g for c, g in zip(correct, gt) if not c]
    return {"Yes/No Bias (Pct Diff)": (sum(said_yes) / len(said_yes) - sum(gt) / len(gt)
                                       if gt else None),
            "Yes/No Bias (FP Ratio)": ((len(wrong_gt) - sum(wrong_gt)) / len(wrong_gt)
                                       if wrong_gt else None)}


def official(answers: list[Answer]) -> dict:
    """evaluation.py's leaderboard (l.131-135: qAcc, fAcc, easy aAcc, hard aAcc, aAcc) with its
    question and figure stats, consistency test and yes/no bias (l.118-144). Not computed: LH, VI
    and Mixed, which need GPT's `same` check (utils.py:75-128, 230-292). qAcc here needs no figure-0
    row per pair: only that diagnosis did."""
    rows_ = rows(answers)
    correct = [official_correct(r) for r in rows_]
    figures = _groups(rows_, correct, lambda r: r.figure,
                      keep=lambda r: not r.no_figure)  # utils.py:130-163
    # qAcc: get_eval_pair_all, utils.py:205-338; aAcc: get_eval_all, utils.py:165-203
    out = {"qAcc": _all_right(_groups(rows_, correct, lambda r: r.pair)),
           "fAcc": _all_right(figures),
           "easy aAcc": _all_right(_groups(rows_, correct, lambda r: r.pair,
                                           keep=lambda r: r.visual_input != "2")),
           "hard aAcc": _all_right(_groups(rows_, correct, lambda r: r.pair,
                                           keep=lambda r: r.visual_input == "2")),
           "aAcc": _percent(sum(correct), len(correct))}
    return {**out, **_question_stats(rows_), **_consistency(figures), **_bias(rows_, correct)}


def _mean100(values: list[bool]) -> float | None:
    """np.mean(...) * 100 as Hallusion_rating writes it (yorn.py:103, 111, 114), unrounded; None
    where there are no rows."""
    return sum(values) / len(values) * 100 if values else None


def l2_category(ids: Fields) -> str:
    """VLMEvalKit's `l2-category` (`VD_ocr`, `VS_ocr`, `VS_chart`) of an answer read from no table
    of its (a run's records), as HallusionBench.json lacks the column: `{category}_{subcategory}`; a
    table's own column is taken as it comes (Answer.group), as Hallusion_rating groups whatever it
    holds. Its code only reads the column (yorn.py:102, 110, 136-143); what the column holds shows
    in a score file of that TSV (its md5, image_yorn.py:25, unchanged since 570bcda9) posted in
    open-compass/VLMEvalKit#825: rows `VD_ocr` and `VS_ocr`, and Overall fAcc and qAcc of 131/346
    and 200/455, the group counts with the category in the key (left out, VD's and VS's ocr figures
    would make 332 and 429)."""
    return f"{ids.category}_{ids.subcategory}"


VLMEVALKIT_COLUMNS = ("split", "aAcc", "fAcc", "qAcc")  # Hallusion_rating's DataFrame (yorn.py:121)


def _vlmevalkit_row(rows_: list[Row], score: list[bool]) -> dict:
    """calc_aAcc, calc_fAcc, calc_qAcc (yorn.py:97-114): figures by `l2-category_set_id_figure_id`,
    pairs by `l2-category_set_id_question_id`, VS figure 0 not skipped."""
    figures = _groups(rows_, score, lambda r: f"{r.l2}_{r.ids.set_id}_{r.ids.figure_id}")
    pairs = _groups(rows_, score, lambda r: f"{r.l2}_{r.ids.set_id}_{r.ids.question_id}")
    return {"aAcc": _mean100(score), "fAcc": _mean100([all(v) for v in figures.values()]),
            "qAcc": _mean100([all(v) for v in pairs.values()])}


def vlmevalkit(answers: list[Answer]) -> dict:
    """Hallusion_rating (VLMEvalKit yorn.py:96-145), offline (exact_matching): score is `answer ==
    extracted` (image_yorn.py:91), so an Unknown extraction is wrong. Its data holds only the
    questions with an image (VLMEvalKit results/HallusionBench.md, 92e31190: "No-visual Questions
    ... are skipped"): the image-less answers are left out here too. The headline is its Overall
    row; `rows` is its score file (`{split, aAcc, fAcc, qAcc}` per row, unrounded percentages):
    Overall (l.122-125), each category VD, VS (l.127-134), each l2-category (l.136-143). It lists
    the categories as `list(set(...))`, an order that changes with Python's hash seed from one run
    to the next: here they are sorted."""
    rows_ = [r for r in rows(answers) if r.visual_input != "0"]
    score = [r.decision == r.label for r in rows_]
    scored = list(zip(rows_, score))
    subsets = [("Overall", scored)]
    # `category`, then `l2-category`, as they come
    for column in (lambda r: r.ids.category, lambda r: r.l2):
        subsets += [(value, [(r, s) for r, s in scored if column(r) == value])
                    for value in sorted({column(r) for r in rows_})]
    table = [{"split": split, **_vlmevalkit_row([r for r, _ in mine], [s for _, s in mine])}
             for split, mine in subsets]
    return {**{k: table[0][k] for k in VLMEVALKIT_COLUMNS[1:]}, "rows": table}


def lmms_eval_read(text: str) -> str:
    """hb_aggregation_result_intern's reading (lmms-eval evaluate_hb.py:96): yes iff "yes" occurs
    anywhere in the lower-cased text ("yesterday" too), else no; it has no unknown."""
    return YES if text.lower().find("yes") != -1 else NO


def _share(values: list[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def lmms_eval_rule(answers: list[Answer]) -> dict:
    """hb_aggregation_result_intern (evaluate_hb.py:93-126), fractions as it returns them: `answer
    == gt_answer` with answer '1' iff the decision is yes (so an unknown decision counts as its
    '0'), no credit for uncertainty, qAcc by `category_subcategory_set_id_question_id`, fAcc by
    `category_subcategory_set_id_figure_id`, VS figure 0 not skipped. The task's yaml comments these
    metrics out (hallusion_bench_image.yaml); its default asks GPT. Its data is the `image` split
    and every doc's image is read (evaluate_hb.py:30-39): image-less answers are left out."""
    rows_ = [r for r in rows(answers) if r.visual_input != "0"]
    score = [(r.decision == YES) == (r.label == YES) for r in rows_]
    pairs = _groups(rows_, score, lambda r: r.pair)
    figures = _groups(rows_, score, lambda r: r.figure)
    return {"aAcc": _share(score), "qAcc": _share([all(v) for v in pairs.values()]),
            "fAcc": _share([all(v) for v in figures.values()])}
