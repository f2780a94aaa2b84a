"""Issue 33's first class: no file outside the folders a run was given. A question's image is read
only from inside `--images` (after symbolic links too); a name that would leave it stops the run in
one line naming the question, before anything is read or written."""
import json
import os

import pytest
from click.testing import CliRunner
from tinymodels import synthetic_image

from pope_fast.cli import main
from pope_fast.engine import ImageError, image_file


@pytest.fixture
def folder(tmp_path):
    images = tmp_path / "images"
    (images / "sub").mkdir(parents=True)
    synthetic_image(0, (40, 30)).save(images / "sub" / "a.png")
    synthetic_image(1, (40, 30)).save(tmp_path / "outside.png")
    return images


def test_a_name_inside_the_folder_is_its_file(folder):
    assert image_file(folder, "sub/a.png") == folder / "sub" / "a.png"
    os.symlink(folder / "sub" / "a.png", folder / "link.png")  # a link that stays inside
    assert image_file(folder, "link.png") == folder / "link.png"


@pytest.mark.parametrize("name, message", [
    ("/etc/passwd", "an absolute path"),
    ("../outside.png", "climbing out with '..'"),
    ("sub/../../outside.png", "climbing out with '..'"),
], ids=["absolute", "dotdot", "dotdot-deeper"])
def test_a_name_that_leaves_the_folder_is_refused(folder, name, message):
    with pytest.raises(ImageError, match=message):
        image_file(folder, name)


def test_a_symbolic_link_out_of_the_folder_is_refused(folder):
    os.symlink(folder.parent / "outside.png", folder / "out.png")
    os.symlink(folder.parent, folder / "up")  # a subfolder link out
    for name in ("out.png", "up/outside.png"):
        with pytest.raises(ImageError, match="a symbolic link out of the image folder"):
            image_file(folder, name)


@pytest.mark.slow  # loads the registry's tiny LLaVA
@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.png", "out.png"])
def test_eval_stops_at_a_question_whose_image_leaves_the_folder(name, folder, tiny, tmp_path):
    """One line naming the question, before the model loads; nothing recorded (no meta.json, no
    records)."""
    os.symlink(folder.parent / "outside.png", folder / "out.png")
    questions = tmp_path / "coco_pope_random.json"
    rows = [{"question_id": 1, "image": "sub/a.png", "text": "Is there a dog in the image?",
             "label": "no"},
            {"question_id": 2, "image": name, "text": "Is there a cat in the image?",
             "label": "yes"}]

    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["eval", "--model", str(tiny.checkpoint("llava")),
                                       "--questions", str(questions), "--images", str(folder),
                                       "--out", str(out), "--device", "cpu", "--skip-bad"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert line.startswith("Error: question 2 of split random: ") and "image folder" in line, line
    assert not (out / "meta.json").exists() and not (out / "records.jsonl").exists()
