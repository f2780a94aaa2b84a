import json
import re
from collections import Counter

import pytest

from pope_fast.readout import (DataError, dataset_from_name, find_question_files,
                               load_question_sources, load_questions, split_from_name)


def test_official_coco_files(shared):
    splits = {s: load_questions(shared / f"data/pope/coco_pope_{s}.json")
              for s in ("random", "popular", "adversarial")}
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
    rows = [{"question_id": i, "image": f"im{i // 2}.jpg", "text": "Is there a cat?",
             "label": "yes" if i % 2 else "no"}
            for i in range(4)]
    path = tmp_path / "aokvqa_pope_seem_popular.json"
    path.write_text(json.dumps(rows))
    qs = load_questions(path)
    assert [q.question_id for q in qs] == [0, 1, 2, 3] and qs[0].split == "popular"
    assert load_questions(path, split="mine")[0].split == "mine"
    assert split_from_name("gqa_pope_adversarial.json") == "adversarial"
    assert split_from_name("questions.jsonl") == "questions"


@pytest.mark.parametrize("lines, message", [
    (['{"question_id": 1, "image": "a.jpg", "text": "q", "label": "yes"}',
      '{"question_id": 2, "image"'],
     r"bad\.json:2: malformed JSON"),
    (['{"question_id": 1, "image": "a.jpg", "label": "yes"}'],
     r"bad\.json:1: missing key\(s\) text"),
    (['{"question_id": 1, "image": "a.jpg", "text": "q", "label": "maybe"}'],
     r"bad\.json:1: label 'maybe'"),
    (['{"question_id": 7, "image": "a.jpg", "text": "q", "label": "yes"}', "",
      '{"question_id": 7, "image": "b.jpg", "text": "q", "label": "no"}'],
     r"bad\.json:3: duplicate question_id 7 \(first at .*bad\.json:1\)"),
    (["[1, 2"], r"bad\.json:2: malformed JSON array"),   # the array ends on line 2
    (['[{"question_id": 1, "image": "a.jpg", "text": "q"}]'], r"bad\.json item 1: missing key"),
], ids=["torn-json", "missing-key", "bad-label", "duplicate-id", "torn-array", "array-item"])
def test_bad_files_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        load_questions(path)


@pytest.mark.slow
def test_official_aokvqa_and_gqa_files(shared):
    """The six SEEM files of RUCAIBox/POPE, loaded as one folder: dataset and split from each name,
    the COCO files' structure, and the cross-split (image, question) dedup the engine relies on."""
    questions = load_question_sources([shared / "data/pope/seem"])
    assert len(questions) == 6 * 3000
    by_file = {}
    for q in questions:
        by_file.setdefault((q.dataset, q.split), []).append(q)
    assert set(by_file) \
        == {(d, s) for d in ("aokvqa", "gqa") for s in ("adversarial", "popular", "random")}
    for dataset, expected_unique in (("aokvqa", 5145), ("gqa", 5171)):
        splits = [by_file[dataset, s] for s in ("adversarial", "popular", "random")]
        assert all(len(qs) == 3000 and sum(q.label == "yes" for q in qs) == 1500 for qs in splits)
        images = [list(dict.fromkeys(q.image for q in qs)) for qs in splits]
        assert len(images[0]) == 500 and images[0] == images[1] == images[2]
        unique = {(q.image, q.text): q.label for qs in splits for q in qs}
        # one label per pair: no pair is asked with two answers
        assert len(unique) == expected_unique
        assert all(unique[q.image, q.text] == q.label for qs in splits for q in qs)
        # each adversarial file asks one (image, question) pair twice, under two question ids
        twice = [p for p, n in Counter((q.image, q.text) for q in splits[0]).items() if n > 1]
        assert len(twice) == 1
    # GQA's own image ids
    assert all(re.fullmatch(r"\d+\.jpg", q.image) for q in by_file["gqa", "random"])
    assert all(q.image.startswith("COCO_val2014_") for q in by_file["aokvqa", "random"])


def test_folders_and_overrides(tmp_path):
    rows = [{"question_id": i, "image": f"{i}.jpg", "text": "Is there a cat?",
             "label": "yes"} for i in (1, 2)]
    for name in ("coco_pope_random.json", "gqa_pope_seem_random.json", "notes.txt"):
        (tmp_path / name).write_text(json.dumps(rows))
    qs = load_question_sources([tmp_path])
    assert [(q.dataset, q.split, q.question_id) for q in qs] == [
        ("coco", "random", 1), ("coco", "random", 2), ("gqa", "random", 1), ("gqa", "random", 2)]
    assert {q.dataset for q in load_question_sources([tmp_path], dataset="mine")} == {"mine"}
    assert dataset_from_name("questions.jsonl") == "" \
        and dataset_from_name("Full/random-00000-of-00001.parquet") == "lmms-lab"
    # a category column splits one file; ids repeat across its splits, not within one
    both = tmp_path / "both" / "pope_test.json"
    both.parent.mkdir()
    both.write_text(json.dumps([dict(rows[0], category=c) for c in ("random", "popular")]))
    assert [q.split for q in load_questions(both)] == ["random", "popular"]
    with pytest.raises(DataError, match=r"pope_test\.json item 2: duplicate question_id 1"):
        load_questions(both, split="mine")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no question files"):
        find_question_files(tmp_path / "empty")


@pytest.mark.parametrize("key", ["text", "image", "question_id"])
def test_a_lone_surrogate_is_named_by_file_line_and_field(tmp_path, key):
    """Issue 49: "\\ud800" is valid JSON but no Unicode text: no tokenizer takes it and no file name
    encodes it."""
    row = {"question_id": "q1", "image": "a.jpg", "text": "Is there a dog?", "label": "yes"}
    row[key] = row[key][:1] + "\ud800" + row[key][1:]
    path = tmp_path / "questions.jsonl"
    path.write_text('{"question_id": 0, "image": "b.jpg", "text": "q", "label": "no"}\n'
                    + json.dumps(row) + "\n")
    with pytest.raises(DataError) as refused:
        load_questions(path)
    assert str(refused.value) \
        == (f"{path}:2: {key} {row[key]!r} holds a lone surrogate ('\\ud800' at character 2), "
            "which is no Unicode text (a \\u escape of half a character pair?)")
    # é: text as any other
    path.write_text(json.dumps({**row, key: row[key].replace("\ud800", "\u00e9")}) + "\n")
    assert len(load_questions(path)) == 1


def test_the_shared_pope_folder_is_the_three_datasets_27000_questions(shared):
    """--questions ../shared/data/pope: COCO's three files beside it, A-OKVQA's and GQA's in seem/,
    each 3,000 questions of 500 images, half yes; COCO's first, then A-OKVQA's, then GQA's;
    PROVENANCE.json left out."""
    skipped = []
    questions = load_question_sources([shared / "data/pope"], skipped=skipped)
    assert len(questions) == 27000 and [p.name for p, _ in skipped] == ["PROVENANCE.json"]
    groups = Counter((q.dataset, q.split) for q in questions)
    assert groups == {(d, s): 3000 for d in ("coco", "aokvqa", "gqa")
                      for s in ("random", "popular", "adversarial")}
    assert list(dict.fromkeys(q.dataset for q in questions)) == ["coco", "aokvqa", "gqa"]
    assert all(sum(q.label == "yes" for q in questions if (q.dataset, q.split) == g) == 1500
               for g in groups)


def test_a_folder_reads_popes_question_files_in_its_sub_folders_and_nothing_else_there(tmp_path):
    """POPE's output/ layout (coco/, seem/aokvqa/, seem/gqa/): every `{dataset}_pope_*` file below
    the folder, COCO's first; a run's records.jsonl, another JSON or a file of no known dataset
    below it are not read."""
    row = {"question_id": 1, "image": "a.jpg", "text": "Is there a cat in the image?",
           "label": "yes"}
    for name in ("seem/gqa/gqa_pope_seem_random.json", "seem/aokvqa/aokvqa_pope_seem_random.json",
                 "coco/coco_pope_random.json", "runs/x/records.jsonl", "coco/notes.json",
                 "mine/mine_pope_random.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(row) + "\n")
    found = find_question_files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "coco/coco_pope_random.json", "seem/aokvqa/aokvqa_pope_seem_random.json",
        "seem/gqa/gqa_pope_seem_random.json"]
    assert [(q.dataset, q.split) for q in load_question_sources([tmp_path])] == \
        [("coco", "random"), ("aokvqa", "random"), ("gqa", "random")]
