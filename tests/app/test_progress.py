"""The command line's progress: where stderr is no terminal (a log file), plain lines, never a bar's
redraws."""
import io

import pytest

from pope_fast.progress import labelled_bars


def test_labelled_bars_write_one_plain_line_per_label_to_a_log():
    """`bench > log 2>&1` had its bars' carriage returns and cursor-up escapes in the file: into a
    stream that is no terminal each label writes one line once its count is done, and nothing
    before."""
    log = io.StringIO()
    with labelled_bars(log) as progress:
        progress("llava pope-fast", 4, 6)
        assert log.getvalue() == ""
        progress("llava pope-fast", 2, 6)
        progress("llava reference", 6, 6)
    assert log.getvalue() == "llava pope-fast: 6 done\nllava reference: 6 done\n"
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()


def test_a_sweep_in_a_log_says_how_far_it_is_and_how_far_a_long_continuation_is():
    """`eval > log 2>&1` showed nothing at all (no bar off a terminal), for 41 minutes of a
    2,048-token protocol: plain lines now, at most one every `every` seconds and one at the end,
    with a continuation's progress between them."""
    from pope_fast.progress import SweepProgress

    log = io.StringIO()
    progress = SweepProgress(10, log, every=0)
    progress(3)
    progress.decoding(32, 2048, 16)
    progress(7)
    assert log.getvalue().splitlines() == [
        "POPE: 3 of 10 questions recorded",
        "POPE: 3 of 10 questions recorded; decoding 16 questions: 32 of at most 2048 new tokens",
        "POPE: 10 of 10 questions recorded"]
    quiet = io.StringIO()
    progress = SweepProgress(10, quiet)  # every 30 s: nothing before the end
    progress(3)
    progress.decoding(32, 2048, 16)
    progress(7)
    assert quiet.getvalue() == "POPE: 10 of 10 questions recorded\n"


def test_a_sweep_of_another_benchmark_is_named_by_it():
    """MME and HallusionBench runs said `POPE: 84 of 84 questions recorded`."""
    from pope_fast.progress import progress_bar

    log = io.StringIO()
    with progress_bar(2, True, "HallusionBench", stream=log) as progress:
        progress(2)
    assert log.getvalue() == "HallusionBench: 2 of 2 questions recorded\n"


@pytest.mark.parametrize("before, evaluated, said", [
    # a fresh run: some prompts shared across splits
    (0, 20, "20 unique prompts evaluated for 24 questions;"),
    (12, 12, "12 unique prompts evaluated for the 12 questions not yet recorded;"),
    (23, 4, "4 unique prompts evaluated for the 1 question not yet recorded (and the recorded "
            "questions that share their image steps);"),
    (24, 0, "0 unique prompts evaluated for the 0 questions not yet recorded;")])
def test_a_resume_says_what_this_run_evaluated_and_for_which_questions(before, evaluated, said):
    """A resume printed `resumed: 12 of 24 questions were already recorded` then `24 unique prompts
    evaluated for 24 questions`: the prompts are those this run evaluated, for the questions it
    lacked (a step of images runs whole, as a clean run batches it, so a recorded question sharing
    one is asked again and kept as it was)."""
    from pathlib import Path

    from pope_fast.engine.utils.stats import Timings
    from pope_fast.evaluate import EvalOutcome
    from pope_fast.sweep import SweepResult

    result = SweepResult(Path("run"), 24, before, evaluated, 0, [])
    lines = EvalOutcome(Path("run"), [result], Timings(), False, None, None).summary().splitlines()
    resumed = [f"resumed: {before} of 24 questions were already recorded"] if before else []
    assert lines[:len(resumed)] == resumed and lines[len(resumed)].startswith(said)


@pytest.mark.slow  # the demo, end to end
def test_eval_tells_the_display_of_each_continuations_progress(monkeypatch):
    """The engine reports a continuation every 32 new tokens (Runner.on_decode) to eval's
    display."""
    from click.testing import CliRunner

    from pope_fast import progress
    from pope_fast.cli import main

    heard = []
    monkeypatch.setattr(progress.SweepProgress, "decoding", lambda self, *args: heard.append(args))
    with CliRunner().isolated_filesystem():
        result = CliRunner().invoke(main, ["eval", "--out", "run", "--demo-questions", "6",
                                           "--max-new-tokens", "64", "--readouts", "string_parse",
                                           "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert heard == [(32, 64, 6), (64, 64, 6)]


@pytest.mark.slow  # the demo's checkpoint, a 64-token continuation
def test_a_continuations_listener_survives_the_engines_reset(tmp_path):
    """eval set the runner's listener, which Engine.reset() (warmup's last step, bench's every run)
    replaced with a runner that told no one: the listener is the Engine's now, handed to every
    runner it makes."""
    from pope_fast.builtin import demo
    from pope_fast.engine import Engine, ImagePrompts, Settings, read_image

    inputs = demo(tmp_path, questions=2)
    engine = Engine.load(inputs.checkpoint, Settings(max_new_tokens=64), readouts="string_parse")
    heard = []
    engine.on_decode = lambda *told: heard.append(told)
    engine.reset()
    image = read_image(next(inputs.images_dir.iterdir()))
    engine.run_images([ImagePrompts(engine.features(image),
                                    [engine.prompt(q) for q in inputs.questions])])
    assert heard == [(32, 64, 2), (64, 64, 2)]
