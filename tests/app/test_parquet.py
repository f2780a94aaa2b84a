"""lmms-lab/POPE parquet input: both layouts load to the questions and images of the equivalent JSON
files + image folder, and a sweep over them writes the same records."""
import io
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tinymodels import QUESTIONS, make_tiny_llava, synthetic_image

from pope_fast.cli import main
from pope_fast.engine import Engine, ImageError, Settings
from pope_fast.sweep import run_plain
from pope_fast.readout import DataError, load_question_sources

pytestmark = pytest.mark.slow  # eval and score end to end on tiny checkpoints

SPLITS = ("adversarial", "popular", "random")


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    synthetic_image(i, ((90, 70), (64, 64), (50, 120))[i % 3]).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _rows(n_images: int = 3) -> list[dict]:
    """POPE-shaped rows of three splits: string ids 1.. per split (as lmms-lab stores them), the
    yes-questions shared by every split, one image per 4 questions."""
    rows = []
    for s, split in enumerate(SPLITS):
        for i in range(n_images):
            for j in range(4):
                text = QUESTIONS[j] if j % 2 == 0 else QUESTIONS[(j + s + i) % len(QUESTIONS)]
                rows.append({"question_id": str(i * 4 + j + 1),
                             "image": f"COCO_val2014_{i:012d}.jpg", "text": text,
                             "label": "yes" if j % 2 == 0 else "no", "split": split})
    return rows


def _table(rows: list[dict], images: dict[str, bytes], with_path: bool) -> pa.Table:
    return pa.table({
        "id": [str(k) for k in range(len(rows))],
        "question_id": [r["question_id"] for r in rows],
        "question": [r["text"] for r in rows],
        "answer": [r["label"] for r in rows],
        "image_source": [r["image"] for r in rows],
        # every row holds its own copy of the image, as the lmms-lab files do
        "image": [{"bytes": bytes(bytearray(images[r["image"]])),
                   "path": r["image"] if with_path else None}
                  for r in rows],
        "category": [r["split"] for r in rows],
    })


@pytest.fixture(scope="module")
def pope_sources(tmp_path_factory):
    """The same questions as JSON files + an image folder, as lmms-lab's Full/ (a file per split)
    and as its default config (one test file with a category column)."""
    root = tmp_path_factory.mktemp("pope")
    rows = _rows()
    images = {name: _jpeg(k) for k, name in enumerate(dict.fromkeys(r["image"] for r in rows))}
    (root / "images").mkdir()
    (root / "json").mkdir()
    (root / "Full").mkdir()
    (root / "data").mkdir()
    for name, data in images.items():
        (root / "images" / name).write_bytes(data)
    for split in SPLITS:
        mine = [r for r in rows if r["split"] == split]
        (root / "json" / f"pope_{split}.json").write_text(json.dumps([
            {k: r[k] for k in ("question_id", "image", "text", "label")} for r in mine]))
        pq.write_table(_table(mine, images, with_path=False),
                       root / "Full" / f"{split}-00000-of-00001.parquet")
    pq.write_table(_table(rows, images, with_path=True),
                   root / "data" / "test-00000-of-00001.parquet", row_group_size=7)
    return root, images


@pytest.mark.parametrize("layout", ["Full", "data"])
def test_parquet_loads_to_the_json_questions_and_images(pope_sources, layout):
    root, images = pope_sources
    expected = load_question_sources([root / "json"], dataset="coco")
    questions = load_question_sources([root / layout], dataset="coco")
    assert questions == expected and len(questions) == 3 * 12
    assert ([(q.question_id, q.split) for q in questions]
            == [(q.question_id, q.split) for q in expected])
    assert all(q.image_data == images[q.image] for q in questions)
    assert all(q.image_data is None for q in expected)
    # one copy of each image in memory, however many rows carried it
    assert len({id(q.image_data) for q in questions}) == len(images)
    assert {q.dataset for q in load_question_sources([root / layout])} == {"lmms-lab"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("tiny_llava") / "ckpt")


def _records(out):
    return sorted((out / "records.jsonl").read_text().splitlines())


def test_sweeps_over_parquet_write_the_json_records(checkpoint, pope_sources, tmp_path):
    root, images = pope_sources
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware,legacy_2tok")
    run_plain(engine, load_question_sources([root / "json"], dataset="coco"), root / "images",
              tmp_path / "json")
    fresh = Engine.load(checkpoint, Settings(), readouts="template_aware,legacy_2tok")
    result = run_plain(fresh, load_question_sources([root / "Full"], dataset="coco"), None,
                       tmp_path / "full")
    assert _records(tmp_path / "full") == _records(tmp_path / "json")
    assert fresh.cache.misses == len(images)   # each distinct image decoded and encoded once
    assert result.evaluated_prompts == len({(q.image, q.text)
                                            for q in load_question_sources([root / "json"])})


    args = ["eval", "--model", str(checkpoint), "--questions", str(root / "data"), "--dataset",
            "coco", "--out", str(tmp_path / "cli"), "--device", "cpu", "--readouts",
            "template_aware,legacy_2tok",
            "--batch-size", "32"]   # the batching of the runs above: same sums, same bits

    cli = CliRunner().invoke(main, args)   # no --images: they are embedded
    assert cli.exit_code == 0, cli.output
    assert _records(tmp_path / "cli") == _records(tmp_path / "json")


def test_bad_embedded_images(checkpoint, pope_sources, tmp_path):
    root, images = pope_sources
    questions = load_question_sources([root / "Full" / "random-00000-of-00001.parquet"])
    name = questions[0].image
    broken = [q.__class__(q.question_id, q.image, q.text, q.label, q.split, q.dataset,
                          b"not a jpeg" if q.image == name else q.image_data) for q in questions]
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    with pytest.raises(ImageError, match=rf"{name} \(embedded\): not a decodable image"):
        run_plain(engine, broken, None, tmp_path / "out")
    result = run_plain(engine, broken, None, tmp_path / "out", skip_bad=True)
    assert result.error_records == sum(q.image == name for q in questions)
    # a name embedded in one source and a file in another would pick one of two images: refused
    mixed = questions[:1] + [q.__class__(q.question_id, q.image, q.text, q.label, "popular",
                                         q.dataset)
                             for q in questions[:1]]
    with pytest.raises(ValueError,
                       match=rf"image {name} is embedded in one question file and a file name"):
        run_plain(engine, mixed, root / "images", tmp_path / "mixed")


def test_bad_parquet_files_are_named(pope_sources, tmp_path):
    root, images = pope_sources
    rows = _rows(2)
    table = _table(rows, images, with_path=False)
    pq.write_table(table.drop_columns(["answer"]), tmp_path / "no_answer.parquet")
    with pytest.raises(DataError, match=r"no_answer\.parquet: missing column\(s\) answer"):
        load_question_sources([tmp_path / "no_answer.parquet"])
    other = dict(images, **{rows[0]["image"]: _jpeg(7)})
    pq.write_table(_table(rows[4:], other, with_path=False), tmp_path / "b_other.parquet")
    pq.write_table(_table(rows[:4], images, with_path=False), tmp_path / "a.parquet")
    # same image name, other bytes: a later row (here in another file) cannot silently stand for it
    with pytest.raises(DataError,
                       match=rf"b_other\.parquet item \d+: image '{rows[0]['image']}' differs"):
        load_question_sources([tmp_path / "a.parquet", tmp_path / "b_other.parquet"])
    (tmp_path / "torn.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=r"torn\.parquet: not a readable parquet file"):
        load_question_sources([tmp_path / "torn.parquet"])


def test_parquet_without_pyarrow_says_which_extra(pope_sources):
    root, _ = pope_sources
    code = ("import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None\n"
            "from pope_fast.readout import DataError, load_question_sources\n"
            f"try:\n    load_question_sources([{str(root / 'Full')!r}])\n"
            "except DataError as err:\n    print(err)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith('adversarial-00000-of-00001.parquet: reading parquet needs '
                                        'pyarrow: pip install -e ".[parquet]"')
