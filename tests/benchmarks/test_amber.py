"""AMBER's discriminative part: its data read and joined by id, its response files, and the numbers
of the official inference.py (@534babf6) and of VLMEvalKit's AMBER_rating (@e8e78f05), derived by
hand below."""
import json
from collections import Counter

import pytest

from pope_fast.readout.benchmarks.amber import metrics as amber_metrics
from pope_fast.readout.benchmarks.amber.benchmark import Amber, read_official, write_responses
from pope_fast.readout.benchmarks.base import Answer
from pope_fast.readout.data import DataError

# id -> (annotation type, truth, query); id 1 is generative, as ids 1-1004 are in the real file.
SMALL = {
    2: ("discriminative-hallucination", "no", "Is there a dog in this image?"),
    3: ("discriminative-hallucination", "no", "Is there a cat in this image?"),
    4: ("discriminative-hallucination", "no", "Is there a car in this image?"),
    5: ("discriminative-hallucination", "no", "Is there a cup in this image?"),
    6: ("discriminative-attribute-state", "no", "Is the sky cloudy?"),
    7: ("discriminative-attribute-state", "no", "Is the road wet?"),
    8: ("discriminative-attribute-state", "yes", "Is the grass green?"),
    9: ("discriminative-attribute-number", "yes", "Are there two birds?"),
    10: ("discriminative-attribute-action", "yes", "Is the man running?"),
    11: ("discriminative-attribute-action", "no", "Is the dog sleeping?"),
    12: ("discriminative-relation", "yes", "Is the cup on the table?"),
    13: ("relation", "no", "Is the man touching the wall?"),
}
# The answers the hand-derived numbers below are for: exact "Yes"/"No" and their near misses.
TEXTS = {2: "No", 3: "No", 4: "No.", 5: "no", 6: "No", 7: "No", 8: "No", 9: "Yes", 10: "yes",
         11: " No", 12: "Yes", 13: "No"}


def _write_data(root, annotations=None, queries=None):
    """An AMBER data/ folder in miniature: annotations.json (entry i holds id i+1) and query/."""
    if annotations is None:
        annotations = [{"id": 1, "type": "generative", "truth": ["dog"], "hallu": ["cat"]}]
        annotations += [{"id": i, "type": kind, "truth": truth}
                        for i, (kind, truth, _) in SMALL.items()]
    if queries is None:
        queries = [{"id": 1, "image": "AMBER_1.jpg", "query": "Describe this image."}]
        queries += [{"id": i, "image": f"AMBER_{i % 3 + 1}.jpg", "query": q}
                    for i, (_, _, q) in SMALL.items()]
    (root / "query").mkdir(parents=True, exist_ok=True)
    (root / "annotations.json").write_text(json.dumps(annotations))
    (root / "query" / "query_discriminative.json").write_text(json.dumps(queries))
    return root


@pytest.fixture
def small(tmp_path):
    return _write_data(tmp_path / "data")


def _answers(rule_name, responses):
    rule = Amber.rules[rule_name]
    return [Answer(r.key, r.split, r.image, r.label, rule.read(r.text)) for r in responses]


def _scored(data, tmp_path, texts, rule_name):
    questions = Amber.questions(data)
    responses = Amber.responses(write_responses(tmp_path / "responses.json", texts), questions)
    return Amber.rules[rule_name].aggregate(_answers(rule_name, responses))


def test_questions_join_annotations_by_id_and_leave_out_generative(small):
    questions = Amber.questions(small)
    assert [q.question_id for q in questions] == list(SMALL)  # id 1 (generative) is left out
    by_id = {q.question_id: q for q in questions}
    assert (by_id[5].label, by_id[5].split, by_id[5].text) \
        == ("no", "existence", "Is there a cup in this image?")
    assert [by_id[i].split for i in (8, 9, 10, 12, 13)] == [
        "attribute-state", "attribute-number", "attribute-action", "relation", "relation"]
    assert by_id[9].image == "AMBER_1.jpg" and by_id[9].dataset == "amber"
    # the file, annotations in ..
    assert Amber.questions(small / "query" / "query_discriminative.json") == questions


def test_official_read_is_exact_equality():
    texts = ("Yes", "No", "yes", "no", "No.", " No", "No ", "NO", "")
    assert [read_official(t) for t in texts] == [
        "yes", "no", "unknown", "unknown", "unknown", "unknown", "unknown", "unknown", "unknown"]


def test_official_numbers_on_a_constructed_file(small, tmp_path):
    """Counters start at 0.001 (metrics.txt); "no" is the positive class; F1 comes from the rounded
    P, R."""
    blocks = _scored(small, tmp_path, TEXTS, "official")
    assert list(blocks) \
        == ["Descriminative Task", "Exsitence", "Attribute", "State", "Number", "Action",
            "Relation"]
    # All 12: correct 2,3,6,7,9,12,13: 7/12.001 = 58.328 -> 58.3. Exact "No" answers 2,3,6,7,8,13
    # (6.001), of truth no 5: 5/6.001 = 83.319 -> 83.3. Truth no 2,3,4,5,6,7,11,13 (8.001), answered
    # "No" 5: 62.492 -> 62.5. F1 = 2*.833*.625/(.833+.625+.0001) = 71.411 -> 71.4.
    assert blocks["Descriminative Task"] \
        == {"Accuracy": 58.3, "Precision": 83.3, "Recall": 62.5, "F1": 71.4}
    # Existence (4 truth no; "No.", "no" are wrong): 2/4.001 = 49.9875 -> 50.0; P 2/2.001 = 99.950
    # -> 100.0; R 2/4.001 -> 50.0; F1 with ITS eps 0.001: 2*1*.5/(1.5+.001) = 66.622 -> 66.6 (eps
    # .0001 gives 66.662 -> 66.7).
    assert blocks["Exsitence"] == {"Accuracy": 50.0, "Precision": 100.0, "Recall": 50.0, "F1": 66.6}
    # State (no, no, yes; "No" thrice): 2/3.001 = 66.644 -> 66.6; P 2/3.001 -> 66.6; R 2/2.001 =
    # 99.950 -> 100.0; F1 from rounded: 2*.666*1/(1.666+.0001) = 79.947 -> 79.9 (from unrounded
    # 66.644, 99.950 it is 80.0).
    assert blocks["State"] == {"Accuracy": 66.6, "Precision": 66.6, "Recall": 100.0, "F1": 79.9}
    # Number: one question, right: 1/1.001 = 99.9001 -> 99.9, not 100.0. No "No" answer: P = 0/0.001
    # = 0.0; no truth-no question: R = 0/0.001 = 0.0; F1 = 0/(0+0+.0001) = 0.0.
    assert blocks["Number"] == {"Accuracy": 99.9, "Precision": 0.0, "Recall": 0.0, "F1": 0.0}
    # Action: "yes" and " No" are both wrong: all 0.0 (R = 0/1.001).
    assert blocks["Action"] == {"Accuracy": 0.0, "Precision": 0.0, "Recall": 0.0, "F1": 0.0}
    # Attribute pools the three: correct 2+1+0 over 3.001+1.001+2.001 = 6.003: 49.975 -> 50.0 (over
    # 6.001 it would be 49.992 -> 50.0); P 2/(3.001+.001+.001 = 3.003) = 66.5999 -> 66.6 (over
    # 3.001: 66.644 -> 66.6); R 2/(2.001+.001+1.001) = 66.6; F1 = 2*.666*.666/(1.332+.0001) = 66.595
    # -> 66.6.
    assert blocks["Attribute"] == {"Accuracy": 50.0, "Precision": 66.6, "Recall": 66.6, "F1": 66.6}
    # Relation, both type strings: 2/2.001 -> 100.0; P = R = 1/1.001 -> 99.9; F1 = 1.996002/1.9981 =
    # 99.895 -> 99.9.
    assert blocks["Relation"] == {"Accuracy": 100.0, "Precision": 99.9, "Recall": 99.9, "F1": 99.9}


def test_the_pooled_attribute_denominators_carry_three_starts(small, tmp_path):
    """Attribute sums the three groups' counters, each started at 0.001: a single state "No" on
    truth no gives P = 1/(1.001+.001+.001) = 99.70 -> 99.7, where one 0.001 would print 99.9."""
    blocks = _scored(small, tmp_path, {6: "No"}, "official")
    assert blocks["Attribute"]["Precision"] == 99.7 and blocks["State"]["Precision"] == 99.9
    # Every group without a record still prints: 0/0.001 everywhere.
    assert blocks["Exsitence"] == {"Accuracy": 0.0, "Precision": 0.0, "Recall": 0.0, "F1": 0.0}


def test_evaluation_type_picks_blocks_but_every_record_counts(small, tmp_path):
    questions = Amber.questions(small)
    answers = _answers("official",
                       Amber.responses(write_responses(tmp_path / "r.json", TEXTS), questions))
    assert amber_metrics.official(answers, "de") \
        == {"Exsitence": {"Accuracy": 50.0, "Precision": 100.0, "Recall": 50.0, "F1": 66.6}}
    assert list(amber_metrics.official(answers, "da")) == ["Attribute", "State", "Number", "Action"]
    with pytest.raises(ValueError, match="evaluation_type"):
        amber_metrics.official(answers, "g")


def test_vlmevalkit_differs_where_its_rules_do(small, tmp_path):
    """yorn reads "No.", "no", " No", "yes" as answers; AMBER_rating reports unrounded accuracy per
    category, in order of first appearance, and their plain mean."""
    scores = _scored(small, tmp_path, TEXTS, "vlmevalkit")
    assert list(scores) == ["Existence", "Attribute", "Relation", "Avg ACC"]
    assert scores["Existence"] == 100.0  # 4/4: official counts "No." and "no" wrong (Accuracy 50.0)
    # 6, 7, 9, 10 ("yes"), 11 (" No") right; 8 ("No" on yes) wrong
    assert scores["Attribute"] == 5 / 6 * 100
    assert scores["Relation"] == 100.0
    assert scores["Avg ACC"] == pytest.approx((100.0 + 5 / 6 * 100 + 100.0) / 3, abs=1e-12)
    assert Amber.rules["vlmevalkit"].prompt("Is the sky cloudy?") \
        == "Is the sky cloudy?\nPlease answer yes or no."
    assert Amber.rules["official"].prompt is None


def test_round_trip_write_then_read(small, tmp_path):
    questions = Amber.questions(small)
    path = write_responses(tmp_path / "out.json", {13: "No, the man is not", 2: "Oui — «non»"})
    assert json.loads(path.read_text()) == [{"id": 2, "response": "Oui — «non»"},
                                            {"id": 13, "response": "No, the man is not"}]
    got = Amber.responses(path, questions)
    assert [(r.key, r.split, r.label, r.text, r.image) for r in got] == [
        ("2", "existence", "no", "Oui — «non»", "AMBER_3.jpg"),
        ("13", "relation", "no", "No, the man is not", "AMBER_2.jpg")]
    assert got[1].line == f"{path} item 2"
    with pytest.raises(ValueError, match="int id"):
        write_responses(tmp_path / "bad.json", {"2": "No"})


def _error(call) -> str:
    with pytest.raises(DataError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("content, needle", [
    ('[{"id": 2, "response": "No"}, {"id": 99, "response": "No"}]', "item 2: id 99 is not among"),
    ('[{"id": 1, "response": "A dog."}]', "item 1: id 1 is not among"),  # generative
    ('[{"id": 2, "response": "No"}, {"id": 2, "response": "Yes"}]', "item 2: id 2 is there twice"),
    ('[{"id": 2, "response": "No"}, {"id": 3, "response": null}]',
     "item 2: 'response' must be a str"),
    ('[{"id": 2, "response": "No"}, {"id": "3", "response": "No"}]', "item 2: 'id' must be a int"),
    ('[{"id": true, "response": "No"}]', "item 1: 'id' must be a int"),
    ('[["id", 2]]', "item 1: an entry is a JSON object"),
    ('[{"id": 2, "response": "No"},\n {"id": 3 "response": "No"}]', ":2: malformed JSON"),
    ('{"2": "No"}', "a JSON list"),
], ids=["unknown-id", "generative-id", "duplicate", "null-response", "string-id", "bool-id",
        "not-object", "malformed", "not-list"])
def test_bad_response_files(small, tmp_path, content, needle):
    path = tmp_path / "responses.json"
    path.write_text(content)
    message = _error(lambda: Amber.responses(path, Amber.questions(small)))
    assert str(path) in message and needle in message


def test_without_questions_only_discriminative_ids_pass(tmp_path):
    path = write_responses(tmp_path / "r.json", {1005: "Yes", 15220: "No"})
    assert [(r.key, r.split, r.label) for r in Amber.responses(path)] \
        == [("1005", "", None), ("15220", "", None)]
    write_responses(path, {1005: "Yes", 1004: "A dog."})
    assert "item 1: id 1004 is no discriminative AMBER id" in _error(lambda: Amber.responses(path))


def _bad_data(root, change):
    annotations = [{"id": 1, "type": "generative", "truth": [], "hallu": []}]
    annotations += [{"id": i, "type": kind, "truth": truth}
                    for i, (kind, truth, _) in SMALL.items()]
    queries = [{"id": i, "image": "AMBER_1.jpg", "query": q} for i, (_, _, q) in SMALL.items()]
    change(annotations, queries)
    return _write_data(root, annotations, queries)


@pytest.mark.parametrize("change, file, needle", [
    (lambda a, q: a.__setitem__(4, a[5]), "annotations.json",
     "item 5: holds id 6, but the scorer reads id 5"),
    (lambda a, q: a[6].update(truth="maybe"), "annotations.json",
     "item 7: truth must be 'yes' or 'no'"),
    (lambda a, q: a[6].update(type="discriminative-colour"), "annotations.json",
     "item 7: unknown type"),
    (lambda a, q: q.append({"id": 40, "image": "AMBER_1.jpg", "query": "?"}), "annotations.json",
     "no entry for id 40"),
    (lambda a, q: q.append(dict(q[0])), "query_discriminative.json",
     "item 13: id 2 is there twice"),
    (lambda a, q: q[2].pop("query"), "query_discriminative.json", "item 3: 'query' must be a str"),
    (lambda a, q: q[3].update(id=5.0), "query_discriminative.json", "item 4: 'id' must be a int"),
], ids=["shifted-annotation", "bad-truth", "bad-type", "id-past-annotations", "duplicate-query",
        "no-query", "float-id"])
def test_bad_data(tmp_path, change, file, needle):
    root = _bad_data(tmp_path / "data", change)
    message = _error(lambda: Amber.questions(root))
    assert file in message and needle in message


def test_missing_or_malformed_data(tmp_path, small):
    alone = tmp_path / "elsewhere" / "query" / "query_discriminative.json"
    alone.parent.mkdir(parents=True)
    alone.write_text("[]")
    assert "elsewhere/annotations.json: no such AMBER annotation file" \
        in _error(lambda: Amber.questions(alone))
    (small / "annotations.json").write_text('[{"id": 1,')
    assert "annotations.json:1: malformed JSON" in _error(lambda: Amber.questions(small))


def test_detect(small, tmp_path):
    responses = write_responses(tmp_path / "responses.json", TEXTS)
    pope = tmp_path / "coco_pope_random.json"
    pope.write_text('{"question_id": 1, "image": "a.jpg", "text": "Is there a dog?", '
                    '"label": "yes"}\n')
    labelled = tmp_path / "labelled.json"
    labelled.write_text('[{"id": 2, "response": "No", "label": "no"}]')
    assert Amber.detect(small) and Amber.detect(small / "query" / "query_discriminative.json")
    assert Amber.detect(responses)
    assert not Amber.detect(small / "annotations.json") and not Amber.detect(pope) \
        and not Amber.detect(labelled)
    assert not Amber.detect(tmp_path) and not Amber.detect(tmp_path / "absent.json")


# The real files (../shared/benchmarks/amber, AMBER @534babf6), counted as its README's table counts
# them.

@pytest.fixture(scope="module")
def real(request):
    shared = request.getfixturevalue("shared")
    data = shared / "benchmarks" / "amber" / "data"
    if not (data / "annotations.json").is_file():
        pytest.skip(f"{data} is absent: the real AMBER checks need it")
    return data, Amber.questions(data)


def test_real_counts(real):
    data, questions = real
    assert len(questions) == 14216 \
        and sorted(q.question_id for q in questions) == list(range(1005, 15221))
    assert Counter((q.split, q.label) for q in questions) == {
        ("attribute-state", "yes"): 2382, ("attribute-state", "no"): 2382,
        ("attribute-number", "yes"): 1036, ("attribute-number", "no"): 1036,
        ("attribute-action", "yes"): 396, ("attribute-action", "no"): 396,
        ("existence", "no"): 4924, ("relation", "yes"): 975, ("relation", "no"): 689}
    sizes = {name: len(Amber.questions(data / "query" / f"query_discriminative-{name}.json"))
             for name in ("attribute", "existence", "relation")}
    assert sizes == {"attribute": 7628, "existence": 4924, "relation": 1664}
    q13193 = next(q for q in questions if q.question_id == 13193)
    assert (q13193.text, q13193.image) == ("Is there a chair in this image?", "AMBER_931.jpg")


@pytest.mark.slow
def test_real_official_all_right_and_all_yes(real, tmp_path):
    data, questions = real
    right = {q.question_id: "Yes" if q.label == "yes" else "No" for q in questions}
    blocks = _scored(data, tmp_path, right, "official")
    # 14216/14216.001 = 99.99999 -> 100.0 (a one-question group gives 99.9); P = R = 100.0; F1 =
    # 2/2.0001 = 99.995000 -> 100.0; Existence: 4924/4924.001 -> 100.0, F1 2/2.001 = 99.950025 ->
    # 100.0.
    assert all(value == 100.0 for block in blocks.values() for value in block.values())
    blocks = _scored(data, tmp_path, dict.fromkeys(right, "Yes"), "official")
    # No "No" anywhere: P = R = F1 = 0.0. Accuracy = truth-yes share: 4789/14216.001 = 33.687 ->
    # 33.7; attribute 3814/(4764.001+2072.001+792.001) = 49.99998 -> 50.0; relation 975/1664.001 =
    # 58.594 -> 58.6.
    accuracy = {name: block["Accuracy"] for name, block in blocks.items()}
    assert accuracy == {"Descriminative Task": 33.7, "Exsitence": 0.0, "Attribute": 50.0,
                        "State": 50.0, "Number": 50.0, "Action": 50.0, "Relation": 58.6}
    assert {block["Precision"] for block in blocks.values()} == {0.0}


@pytest.mark.slow
def test_real_vlmevalkit_reads_what_official_refuses(real, tmp_path):
    data, questions = real
    texts = {q.question_id: "Yes." for q in questions}
    # "Yes." != "Yes"
    assert _scored(data, tmp_path, texts, "official")["Descriminative Task"]["Accuracy"] == 0.0
    scores = _scored(data, tmp_path, texts, "vlmevalkit")
    # Attribute 3814/7628 = 50.0; Existence 0/4924; Relation 975/1664 = 58.59375; mean of the three.
    assert scores == {"Attribute": 50.0, "Existence": 0.0, "Relation": 58.59375,
                      "Avg ACC": pytest.approx((50.0 + 0.0 + 58.59375) / 3, abs=1e-12)}


@pytest.mark.parametrize("key", ["image", "query"])
def test_a_lone_surrogate_in_a_query_is_named_by_item_and_field(tmp_path, key):
    """Issue 49: "\\ud800" is valid JSON but no Unicode text (no tokenizer or file name takes it).
    """
    queries = [{"id": i, "image": f"AMBER_{i % 3 + 1}.jpg", "query": q}
               for i, (_, _, q) in SMALL.items()]
    queries[1][key] = "A\ud800" + queries[1][key]
    root = _write_data(tmp_path / "data", queries=queries)
    message = _error(lambda: Amber.questions(root))
    assert message.endswith(f" item 2: {key!r} {queries[1][key]!r} holds a lone surrogate "
                            "('\\ud800' at character 2), which is no Unicode text "
                            "(a \\u escape of half a character pair?)"), message
