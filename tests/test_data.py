import json

import pytest

from pope_fast.readout import DataError, load_questions, split_from_name


def test_official_coco_files(shared):
    splits = {s: load_questions(shared / f"data/pope/coco_pope_{s}.json") for s in ("random", "popular", "adversarial")}
    for split, qs in splits.items():
        assert len(qs) == 3000 and all(q.split == split for q in qs)
        assert sum(q.label == "yes" for q in qs) == 1500
    images = [list(dict.fromkeys(q.image for q in qs)) for qs in splits.values()]
    assert len(images[0]) == 500 and images[0] == images[1] == images[2]   # same images, same order
    yes = [{(q.image, q.text) for q in qs if q.label == "yes"} for qs in splits.values()]
    assert yes[0] == yes[1] == yes[2]
    unique = {(q.image, q.text) for qs in splits.values() for q in qs}
    assert 5000 < len(unique) < 6000   # the cross-split dedup the engine exploits


def test_json_array_and_split_names(tmp_path):
    rows = [{"question_id": i, "image": f"im{i // 2}.jpg", "text": "Is there a cat?", "label": "yes" if i % 2 else "no"}
            for i in range(4)]
    path = tmp_path / "aokvqa_pope_seem_popular.json"
    path.write_text(json.dumps(rows))
    qs = load_questions(path)
    assert [q.question_id for q in qs] == [0, 1, 2, 3] and qs[0].split == "popular"
    assert load_questions(path, split="mine")[0].split == "mine"
    assert split_from_name("gqa_pope_adversarial.json") == "adversarial"
    assert split_from_name("questions.jsonl") == "questions"


@pytest.mark.parametrize("lines, message", [
    (['{"question_id": 1, "image": "a.jpg", "text": "q", "label": "yes"}', '{"question_id": 2, "image"'],
     r"bad\.json:2: malformed JSON"),
    (['{"question_id": 1, "image": "a.jpg", "label": "yes"}'], r"bad\.json:1: missing key\(s\) text"),
    (['{"question_id": 1, "image": "a.jpg", "text": "q", "label": "maybe"}'], r"bad\.json:1: label 'maybe'"),
    (['{"question_id": 7, "image": "a.jpg", "text": "q", "label": "yes"}', "",
      '{"question_id": 7, "image": "b.jpg", "text": "q", "label": "no"}'], r"bad\.json:3: duplicate question_id 7 \(first at .*bad\.json:1\)"),
    (["[1, 2"], r"bad\.json:2: malformed JSON array"),   # the array ends on line 2
    (['[{"question_id": 1, "image": "a.jpg", "text": "q"}]'], r"bad\.json item 1: missing key"),
], ids=["torn-json", "missing-key", "bad-label", "duplicate-id", "torn-array", "array-item"])
def test_bad_files_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        load_questions(path)
