"""A NaN or infinite logit keeps records.jsonl, meta.json and summary.json strict JSON (issue 33):
the value is written as null, the record names it (`non_finite`), scoring reads it back as it was (a
NaN logit: the logit readouts say unknown), and a resume gives the same bytes."""
import json
import math

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.engine import Engine
from pope_fast.readout import Question, TokenSets, make_record, read_records, score_records
from pope_fast.store import RecordWriter, write_meta


def _strict(text: str):
    """json.loads as a strict parser reads: a bare NaN or Infinity is an error."""
    def refuse(token):
        raise ValueError(f"bare {token}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_values_are_null_named_and_read_back(tmp_path):
    write_meta(tmp_path,
               {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}, "alpha": math.nan})
    q = [Question(i, f"img{i}.jpg", "Is there a dog?", "yes", "random") for i in (1, 2, 3)]
    records = [make_record(q[0], "t", first_token_id=5, candidate_logits={5: math.nan, 6: 0.5},
                           probe={"image_attention": [0.1, math.nan]}),
               make_record(q[1], "t", first_token_id=5,
                           candidate_logits={5: math.inf, 6: -math.inf}),
               make_record(q[2], "t", first_token_id=5, candidate_logits={5: 1.0, 6: -math.inf})]
    with RecordWriter(tmp_path) as w:
        w.write(records)
    lines = [_strict(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert (lines[0]["candidate_logits"] == {"5": None, "6": 0.5}
            and lines[0]["image_attention"] == [0.1, None])
    assert lines[0]["non_finite"] == {"candidate_logits": {"5": "nan"}, "image_attention": "nan"}
    assert lines[1]["non_finite"] == {"candidate_logits": {"5": "inf"}}  # -inf is null and no fault
    assert "non_finite" not in lines[2]
    assert _strict((tmp_path / "meta.json").read_text())["alpha"] is None
    entries = read_records(tmp_path).entries
    assert math.isnan(entries[0].candidate_logits[5]) and math.isnan(entries[0].image_attention[1])
    assert entries[1].candidate_logits == {5: math.inf, 6: -math.inf}
    assert entries[2].candidate_logits == {5: 1.0, 6: -math.inf}
    [run] = score_records(read_records(tmp_path), ["legacy_2tok"], resamples=10)
    # the NaN and the +inf (an overflow, not a preference: issue 48) never decide; the -inf of the
    # third is a cut
    legacy = run["readouts"]["legacy_2tok"]
    assert ((legacy["unknown"], legacy["tp"], legacy["unknown_reasons"])
            == (2, 1, {"non-finite logit": 2}))



def test_a_writer_never_writes_a_bare_nan(tmp_path):
    """The records are encoded by the writing thread: the error comes with the close (or the next
    write)."""
    with pytest.raises(ValueError, match="Out of range float"), RecordWriter(tmp_path) as w:
        w.write([{"question_id": 1, "split": "random", "label": "yes",
                  "candidate_logits": {"5": math.nan}}])
    assert (tmp_path / "records.jsonl").read_bytes() == b""


@pytest.mark.slow  # the demo's eval, twice
def test_a_nan_logit_in_a_run_stays_strict_json_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    original = Engine.run_methods

    # the first prompt of each step goes NaN, as fp16 overflow would
    def faulty(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        for results in out.values():
            logits = results[0][0].candidate_logits
            logits.update({i: math.nan for i in logits})
        return out

    monkeypatch.setattr(Engine, "run_methods", faulty)
    first = CliRunner().invoke(main, ["eval", "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    run = tmp_path / "a"
    text = (run / "records.jsonl").read_text()
    records = [_strict(line) for line in text.splitlines()]
    faulted = [r for r in records if "non_finite" in r]
    assert faulted and all(set(r["candidate_logits"].values()) == {None} for r in faulted)
    assert all(r["non_finite"]["candidate_logits"] == dict.fromkeys(r["candidate_logits"], "nan")
               for r in faulted)
    for name in ("meta.json", "summary.json"):
        _strict((run / name).read_text())
    scored = CliRunner().invoke(main, ["score", str(run), "--readouts", "legacy_2tok", "--format",
                                       "json"])
    assert scored.exit_code == 0, scored.output
    runs = _strict(scored.output)["runs"]
    assert sum(r["readouts"]["legacy_2tok"]["unknown"]
               for r in runs if not r.get("pooled")) == len(faulted)
    # records lost from the middle and the end: the resume writes them back, the same bytes
    lines = text.splitlines(keepends=True)
    (run / "records.jsonl").write_text("".join(lines[:3] + lines[len(lines) // 2:-3]))
    again = CliRunner().invoke(main, ["eval", "--out", str(run)])
    assert again.exit_code == 0, again.output
    assert (run / "records.jsonl").read_text() == text


def test_the_scores_name_the_questions_that_went_non_finite(tmp_path):
    write_meta(tmp_path, {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}})
    with RecordWriter(tmp_path) as w:
        w.write([make_record(Question(i, f"img{i}.jpg", "Is there a dog?", "yes", "random"), "t",
                             first_token_id=5,
                             candidate_logits={5: math.nan if i == 2 else 1.0, 6: 0.5})
                 for i in (1, 2, 3)])
    [run] = score_records(read_records(tmp_path), ["legacy_2tok"], resamples=10)
    assert run["non_finite"] == ["2"]
    table = CliRunner().invoke(main, ["score", str(tmp_path), "--readouts", "legacy_2tok"])
    assert ("non-finite values (NaN or inf, null in the records): questions 2"
            in table.output), table.output


def test_score_json_of_non_finite_values_is_strict(tmp_path):
    write_meta(tmp_path, {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}})
    with RecordWriter(tmp_path) as w:
        w.write([make_record(Question(i, f"img{i}.jpg", "Is there a dog?", "yes" if i % 2 else "no",
                                      "random"), "t",
                             first_token_id=5, candidate_logits={5: 1.0, 6: 0.5}, decoded="Yes",
                             probe={"image_attention": [math.nan] * 5}) for i in range(1, 7)])
    # the probe's mean of NaNs
    out = CliRunner().invoke(main, ["score", str(tmp_path), "--format", "json"])
    assert out.exit_code == 0, out.output
    _strict(out.output)
    assert "NaN" not in out.output


@pytest.mark.slow  # a tiny checkpoint's eval
def test_a_checkpoint_with_nan_weights_is_refused_naming_the_tensor(tiny, tmp_path):
    """Issue 48: every logit NaN scored as all unknown, F1 0, rc 0; refused at load instead, before
    any folder."""
    import shutil

    from safetensors.torch import load_file, save_file
    from tinymodels import write_pope_set

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny.checkpoint("llava"), ckpt)
    tensors = load_file(ckpt / "model.safetensors")
    [head] = [k for k in tensors if k.endswith("lm_head.weight")]
    tensors[head][:] = math.nan  # every logit NaN, as a broken conversion would give
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    for backend in ("engine", "transformers"):
        args = ["eval", "--model", ckpt, "--images", images, "--out", tmp_path / "run", "--device",
                "cpu", "--backend", backend, "--readouts", "legacy_2tok",
                *(a for f in files for a in ("--questions", f))]
        out = CliRunner().invoke(main, [str(a) for a in args])
        assert out.exit_code == 1 and "Traceback" not in out.output, out.output
        assert out.output.strip().splitlines()[-1] == (
            f"Error: {ckpt.resolve()}/model.safetensors: tensor {head} holds "
            f"{tensors[head].numel():,} NaN value(s) of {tensors[head].numel():,}; a weight is a "
            "finite number (a broken conversion or save, or a corrupted file)"), out.output
        assert not (tmp_path / "run").exists()
