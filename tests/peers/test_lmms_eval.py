"""pope-fast's `eval --protocol lmms-eval` against lmms-eval 0.7.3 itself, question by question:
lmms-eval's own model class runs (tests/peers/lmms_eval_side.py, in its own process) on a tiny
random checkpoint and POPE questions over three synthetic images of odd sizes, and its stripped
texts and exact-match predictions must equal the run's, in fp32 (where the two agree to rounding).
Opt-in: lmms-eval and what its Qwen-VL classes import are not pope-fast's dependencies (`pip install
lmms-eval==0.7.3 decord qwen-vl-utils`, which also brings torchvision, so both sides use
transformers' torchvision image processors); without them the module is skipped, saying so. Measured
on 2026-12-04 (lmms-eval 0.7.3, transformers 5.24): 12 of 12 texts equal for each family below."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tinymodels import write_pope_set

pytest.importorskip("lmms_eval",
                    reason="lmms-eval is not installed (pip install lmms-eval==0.7.3 decord "
                           "qwen-vl-utils): the side-by-side with its own classes is opt-in")
pytest.importorskip("qwen_vl_utils",
                    reason="qwen-vl-utils is not installed (lmms-eval's Qwen-VL classes import it)")
pytest.importorskip("decord",
                    reason="decord is not installed (lmms-eval's Qwen-VL classes import it)")

from pope_fast.cli import main  # noqa: E402
from pope_fast.readout.readouts import exact_match  # noqa: E402

pytestmark = pytest.mark.slow
SIDE = Path(__file__).with_name("lmms_eval_side.py")
# what each tiny checkpoint needs to stand for the real one: Qwen2.5-VL-7B-Instruct's generation
# config sets repetition_penalty 1.05 (which lmms-eval's generate applies); gemma-3-4b-it's
# tokenizer pads on the left
EDITS = {"qwen2_5_vl": ("generation_config.json", {"repetition_penalty": 1.05}),
         "gemma3": ("tokenizer_config.json", {"padding_side": "left"})}


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3"])
def test_protocol_runs_are_lmms_evals_own(name, tiny, tmp_path):
    folder = shutil.copytree(tiny.checkpoint(name), tmp_path / "ckpt")
    if name in EDITS:
        file, edit = EDITS[name]
        path = folder / file
        path.write_text(json.dumps({**(json.loads(path.read_text()) if path.is_file() else {}),
                                    **edit}))
    images, (questions,) = write_pope_set(tmp_path / "pope", n_images=3, splits=("random",),
                                          questions_per_image=4)
    side = subprocess.run([sys.executable, "-P", str(SIDE), name, str(folder), str(questions),
                           str(images), json.dumps({"fp32": True})],
                          capture_output=True, text=True, timeout=900)
    assert side.returncode == 0, side.stderr[-2000:]
    theirs = {row["question_id"]: row for row in map(json.loads, side.stdout.splitlines())}
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["eval", "--model", str(folder), "--images", str(images),
                                       "--questions", str(questions), "--protocol", "lmms-eval",
                                       "--dtype", "fp32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    ours = {r["question_id"]: r
            for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
    assert sorted(ours) == sorted(theirs) and len(ours) == 12
    for qid, row in theirs.items():
        text = ours[qid]["texts"].get("exact_match", ours[qid]["decoded"])
        assert text.strip() == row["stripped"], (qid, text[:80], row["stripped"][:80])
        assert exact_match(text) == (row["prediction"] if row["prediction"] in ("yes", "no")
                                     else "unknown")
