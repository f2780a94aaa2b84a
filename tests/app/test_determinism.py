"""Records are a function of the checkpoint, the inputs and the settings, by construction: every
batch a sweep runs has the shape a clean run gives it, whatever is cached or recorded already, so
the same rounding and the same bytes follow on any machine. These tests check the shapes directly (a
test whose verdict depended on which BLAS kernel a shape picks would test the machine) and the bytes
besides."""
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from tinymodels import make_tiny_llava, write_pope_set

from pope_fast.cli import main
from pope_fast.engine import Engine, Settings
from pope_fast.readout import load_questions
from pope_fast.sweep import run_plain

pytestmark = pytest.mark.slow  # eval and score end to end on tiny checkpoints

SETTINGS = dict(batch_size=5, image_batch=4, max_new_tokens=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("determinism") / "ckpt", builtin_tokenizer=True)


@pytest.fixture(scope="module")
def pope(tmp_path_factory):
    """10 images (steps of 4, 4 and 2), two splits of 40 questions sharing their yes-questions."""
    images, files = write_pope_set(tmp_path_factory.mktemp("pope"), n_images=10)
    return images, [q for f in files for q in load_questions(f)]


class Shapes:
    """Every model call of a sweep, per image step (the images Engine.run_methods was given): each
    vision call's images and pixel shapes, each prefix and suffix prefill's token shape, lengths and
    prefixes."""

    def __init__(self, engine: Engine):
        self.steps: dict[tuple[str, ...], list] = {}
        calls = None
        model, lm, run_methods = engine.model, engine.model.lm, engine.run_methods

        def step(prepared, questions, methods):
            nonlocal calls
            calls = self.steps.setdefault(tuple(p.image.path.name for p in prepared), [])
            return run_methods(prepared, questions, methods)

        def wrap(owner, name, describe):
            original = getattr(owner, name)

            def recorded(*args, **kwargs):
                calls.append((name, *describe(*args)))
                return original(*args, **kwargs)

            setattr(owner, name, recorded)

        engine.run_methods = step
        wrap(model, "encode_images",
             lambda pixels: (len(pixels), tuple(np.shape(p) for p in pixels)))
        wrap(lm, "prefill_prefix", lambda batch, *_: (tuple(batch.ids.shape),))
        wrap(lm, "prefill_suffix", lambda prefix, index, batch, *_: (
            tuple(batch.ids.shape), tuple(batch.lengths.tolist()), tuple(index or ())))



def _sweep(checkpoint, pope, out, **settings):
    images, questions = pope
    engine = Engine.load(checkpoint, Settings(**{**SETTINGS, **settings}),
                         readouts="template_aware,string_parse")
    shapes = Shapes(engine)
    result = run_plain(engine, questions, images, out)
    return shapes.steps, result


@pytest.fixture(scope="module")
def clean(checkpoint, pope, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "out"
    steps, _ = _sweep(checkpoint, pope, out)
    return out, steps


def test_steps_are_image_batch_images_and_each_image_its_own_vision_call(clean):
    _, steps = clean
    assert [len(s) for s in steps] == [4, 4, 2]
    vision = [call for calls in steps.values() for call in calls if call[0] == "encode_images"]
    assert len(vision) == 10 and all(call[1] == 1 for call in vision)


def _lines(out):
    return (out / "records.jsonl").read_text().splitlines(keepends=True)


def test_a_resumed_run_recomputes_whole_steps_in_their_clean_shapes(checkpoint, pope, clean,
                                                                    tmp_path):
    """Records lost from the middle of one step and a torn last line of another: the two steps run
    again, each whole (every prompt of its images, in the clean run's batches), and nothing else
    does."""
    reference, clean_steps = clean
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    lines = _lines(out)
    lost = [i for i, line in enumerate(lines) if json.loads(line)["image"] == "img_1.png"][:3]
    kept = [line for i, line in enumerate(lines) if i not in lost]
    (out / "records.jsonl").write_text("".join(kept[:-1]) + kept[-1][:30])  # and the last line torn
    torn = json.loads(kept[-1])["image"]
    steps, result = _sweep(checkpoint, pope, out)
    damaged = {step for step in clean_steps if "img_1.png" in step or torn in step}
    assert set(steps) == damaged and len(damaged) == 2
    for step, calls in steps.items():
        assert calls == clean_steps[step], step
    assert result.recorded_before == len(lines) - 4
    assert (out / "records.jsonl").read_bytes() == (reference / "records.jsonl").read_bytes()


def test_cached_features_never_change_a_vision_call(checkpoint, pope, clean, tmp_path):
    """Some images' features on disk, others not: each image is still its own vision call, in the
    shape of the clean run's, and the records are the clean run's."""
    reference, clean_steps = clean
    cache = tmp_path / "cache"
    images, questions = pope
    engine = Engine.load(checkpoint, Settings(**SETTINGS), readouts="template_aware,string_parse",
                         cache_dir=cache)
    engine.encode(engine.prepare([images / "img_0.png", images / "img_5.png",
                                  images / "img_9.png"]))
    engine = Engine.load(checkpoint, Settings(**SETTINGS), readouts="template_aware,string_parse",
                         cache_dir=cache)
    shapes = Shapes(engine)
    run_plain(engine, questions, images, tmp_path / "out")
    for step, calls in shapes.steps.items():
        vision, clean_vision = ([c for c in cs if c[0] == "encode_images"]
                                for cs in (calls, clean_steps[step]))
        # one image a call, as in the clean run
        assert all(c[1] == 1 and c in clean_vision for c in vision), step
        language = [c for c in calls if c[0] != "encode_images"]
        assert language == [c for c in clean_steps[step] if c[0] != "encode_images"], step
    # 10 less 3 cached
    assert sum(c[0] == "encode_images" for calls in shapes.steps.values() for c in calls) == 7
    assert ((tmp_path / "out/records.jsonl").read_bytes()
            == (reference / "records.jsonl").read_bytes())


def test_the_step_layout_does_not_depend_on_what_is_recorded(checkpoint, pope, clean, tmp_path):
    """A run that holds every record of the first step already runs the other steps as a clean run
    does."""
    reference, clean_steps = clean
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    first = set(next(iter(clean_steps)))
    (out / "records.jsonl").write_text("".join(l for l in _lines(out)
                                               if json.loads(l)["image"] in first))
    steps, _ = _sweep(checkpoint, pope, out)
    assert list(steps) == list(clean_steps)[1:] and all(steps[s] == clean_steps[s] for s in steps)
    assert (out / "records.jsonl").read_bytes() == (reference / "records.jsonl").read_bytes()


def test_a_skip_bad_rerun_writes_the_same_bytes(checkpoint, tmp_path):
    """An image that stays missing: each rerun meets the same error and records nothing new, and the
    error text is the same in every process (no object address)."""
    images, files = write_pope_set(tmp_path / "pope", n_images=3)
    (images / "img_1.png").write_bytes(b"not an image at all")
    args = ["eval", "--model", str(checkpoint), "--images", str(images), "--questions",
            str(files[0]), "--out", str(tmp_path / "out"), "--readouts", "template_aware",
            "--skip-bad", "--device", "cpu"]
    outputs = []
    for _ in range(3):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        outputs.append((tmp_path / "out/records.jsonl").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    errors = [json.loads(line)["error"] for line in outputs[0].decode().splitlines()
              if "error" in json.loads(line)]
    assert len(errors) == 4 and all("not a decodable image" in e and " at 0x" not in e
                                    for e in errors), errors
