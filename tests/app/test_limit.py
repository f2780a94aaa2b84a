"""`eval --limit N` keeps N questions in all, the first in the order the files hold them, as
lmms-eval's --limit does; `--limit-per-split N` keeps the first N of each split (HallusionBench's
"splits" are its categories: sixty of each was 300 questions)."""
import json

from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.evaluate import limited
from pope_fast.readout import Question
from pope_fast.readout.benchmarks import get_benchmark


def _questions(splits):
    return [Question(f"{split}-{n}", f"{split}.png", f"Is there a {n}?", "yes", split, "coco")
            for split, count in splits for n in range(count)]


def test_limit_is_n_questions_in_all_in_file_order():
    questions = _questions([("random", 3), ("popular", 3), ("adversarial", 3)])
    assert [q.key for q in limited(questions, 4)] == ["random-0", "random-1", "random-2",
                                                      "popular-0"]
    assert limited(questions, None) == questions and limited(questions, 100) == questions


def test_limit_per_split_keeps_the_first_n_of_each_split_then_limit_of_those():
    questions = _questions([("random", 3), ("popular", 3), ("adversarial", 3)])
    assert [q.key for q in limited(questions, None, 1)] == ["random-0", "popular-0",
                                                            "adversarial-0"]
    assert [q.key for q in limited(questions, 2, 1)] == ["random-0", "popular-0"]
    # a split is a dataset's: the same split name of another dataset is another split
    other = [Question("g-0", "g.png", "Is there a cat?", "no", "random", "gqa")]
    assert [q.key for q in limited(questions + other, None, 1)][-1] == "g-0"


def test_limit_on_hallusionbench_is_not_per_category(tmp_path):
    rows = [{"category": c, "subcategory": s, "visual_input": "0", "set_id": str(i),
             "figure_id": "0", "sample_note": "", "question_id": "0",
             "question": f"Is {s} {i} true?", "gt_answer_details": "", "gt_answer": "1",
             "filename": None} for c, s in (("VD", "illusion"), ("VS", "chart"), ("VS", "map"))
            for i in range(4)]
    (tmp_path / "HallusionBench.json").write_text(json.dumps(rows))
    questions = get_benchmark("hallusionbench").questions(tmp_path / "HallusionBench.json")
    assert len({q.split for q in questions}) == 2
    assert len(limited(questions, 5)) == 5  # not 5 of each of its 2 splits
    assert len(limited(questions, None, 2)) == 4


def test_eval_documents_both_flags():
    shown = CliRunner().invoke(main, ["eval", "--help"]).output
    assert "--limit INTEGER" in shown and "--limit-per-split INTEGER" in shown
