"""What a run folder's meta.json counts as asked after a rerun with another --limit
(resume.held_counts): a split that stopped part way stays marked so, a folder that holds a larger
limit's records is whole, never more than the question file has. tests/app/test_hardening.py runs
the reruns themselves."""
from pope_fast.readout import Question
from pope_fast.resume import held_counts


def _split(n: int, split: str = "random") -> list[Question]:
    return [Question(i + 1, f"img_{i // 4}.png", "Is there a dog in the image?", "yes", split,
                     "coco")
            for i in range(n)]


def test_without_a_limit_the_questions_asked_are_counted():
    every = _split(48) + _split(30, "popular")
    assert held_counts({"coco/random": 12}, every, every) == {"coco/random": 48, "coco/popular": 30}


def test_records_past_a_smaller_limit_count_and_a_stopped_run_stays_incomplete():
    every = _split(48)
    # --limit 6 finished, then --limit 3: the folder holds the first 6, all asked
    assert held_counts({"coco/random": 6}, every[:6], every) == {"coco/random": 6}
    # a whole run stopped at 20 of 48, then --limit 10: its 48 are still asked, so scoring marks it
    # incomplete
    assert held_counts({"coco/random": 48}, every[:20], every) == {"coco/random": 48}
    # a question file cut to 40 since: no more than the file has
    assert held_counts({"coco/random": 48}, every[:20], every[:40]) == {"coco/random": 40}
    # a count that is no number
    assert held_counts({"coco/random": "x"}, every[:5], every) == {"coco/random": 5}
