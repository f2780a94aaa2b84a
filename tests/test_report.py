"""`pope-fast report` and the F1 tables: figures, their numbers against `pope-fast score`, the HTML page,
and the LaTeX table against the markdown one."""
import base64
import json
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import Question, RecordWriter, TokenSets, make_record, write_meta
from pope_fast.readout.report import f1_tables, format_f1_tables

SETS = {"legacy_2tok": TokenSets((3582,), (1217,)), "legacy_8tok": TokenSets((3582, 3869), (1217, 1939)),
        "dynamic_single": TokenSets((3869,), (1939,)), "template_aware": TokenSets((3869, 8241), (1939, 694)),
        "first_token": TokenSets((3869, 8241), (1939, 694))}
IDS = (3582, 1217, 3869, 1939, 8241, 694)


def _write_run(folder, seed: int, groups=(("coco", "random"), ("coco", "adversarial"))):
    """A run folder of 24 questions per group whose logits, first tokens and texts vary with the seed."""
    folder.mkdir(parents=True)
    write_meta(folder, {"token_sets": {n: s.to_json() for n, s in SETS.items()}})
    records = []
    for dataset, split in groups:
        for i in range(24):
            q = Question(i + 1, f"img{i // 6}.jpg", "Is there a dog in the image?", "yes" if i % 2 == 0 else "no",
                         split, dataset)
            k = (i * 7 + seed * 5 + len(split)) % 11
            logits = {t: float((t * (k + 3) + seed) % 13) for t in IDS}
            first = (3869, 1939, 8241, 29871)[k % 4]
            records.append(make_record(q, "llava_plain", first_token_id=first, candidate_logits=logits,
                                       decoded=("Yes", "No", "yes, there is", "I cannot tell")[(k + seed) % 4]))
    with RecordWriter(folder) as w:
        w.write(records)
    return folder


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_report_on_two_runs(tmp_path):
    from PIL import Image

    runs = [_write_run(tmp_path / "llava-a", 1), _write_run(tmp_path / "llava-b", 2)]
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", *map(str, runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    score = json.loads(CliRunner().invoke(main, ["score", *map(str, runs), "--format", "json"]).output)["runs"]
    assert len(score) == 4 and json.loads((out / "scores.json").read_text())["runs"] == score

    for run in score:
        folder = out / run["source"].split("/")[-2] / f"{run['dataset']}-{run['split']}"
        readouts = run["readouts"]
        assert len(readouts) == 8   # every readout available: token sets, first tokens, texts
        numbers = {name: json.loads((folder / f"{name}.json").read_text())
                   for name in ("confusion", "f1", "yes_rate", "first_tokens")}
        for name, m in readouts.items():
            assert numbers["confusion"]["readouts"][name] == {k: m[k] for k in ("tp", "tn", "fp", "fn", "unknown")}
            assert numbers["f1"]["readouts"][name] == {"f1": m["f1"], "f1_ci95": m["f1_ci95"]}
            assert numbers["yes_rate"]["readouts"][name] == {"yes_rate": m["yes_rate"]}
        assert numbers["yes_rate"]["label_yes_rate"] == 0.5   # 12 yes-labels of 24
        tokens = numbers["first_tokens"]
        assert tokens["first_token_counts"] == run["first_token_counts"]
        assert {t["id"]: t["count"] for t in tokens["tokens"] if t["count"]} == \
            {int(i): c for i, c in run["first_token_counts"].items()}
        by_id = {t["id"]: t["readouts"] for t in tokens["tokens"]}
        assert by_id[3582] == {"legacy_2tok": "yes", "legacy_8tok": "yes"} and by_id[29871] == {}
        assert by_id[694] == {"template_aware": "no", "first_token": "no"}
        # expected sizes at 100 dpi: a 4-column grid of 8 matrices, one row per readout in the bars
        assert _png_size(folder / "confusion.png") == (1000, 520)
        assert _png_size(folder / "f1.png") == _png_size(folder / "yes_rate.png") == (800, 90 + 32 * 8)
        assert _png_size(folder / "first_tokens.png") == (200 + 40 * len(tokens["tokens"]), 360 + 22 * 5)
    for split in ("random", "adversarial"):
        heat = json.loads((out / f"f1_heatmap_coco-{split}.json").read_text())
        assert heat["models"] == ["llava-a", "llava-b"]
        assert heat["f1"] == [[r["readouts"][n]["f1"] for n in heat["readouts"]]
                              for r in score if r["split"] == split]
        assert _png_size(out / f"f1_heatmap_coco-{split}.png") == (220 + 90 * 8, 150 + 40 * 2)

    pngs = sorted(out.rglob("*.png"))
    assert len(pngs) == 4 * 4 + 2
    for png in pngs:
        with Image.open(png) as image:
            image.verify()
    page = (out / "report.html").read_text()
    embedded = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', page)
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(p.read_bytes() for p in pngs)
    assert page.count("<img") == len(pngs) and not re.search(r"(src|href)=\"(?!data:)|<script|<link", page)
    tables = CliRunner().invoke(main, ["score", *map(str, runs), "--format", "models"]).output
    assert (out / "tables.md").read_text() == tables
    assert (out / "tables.tex").read_text() == CliRunner().invoke(main, ["score", *map(str, runs), "--format",
                                                                          "latex"]).output


def _latex_cells(tex: str) -> list[list[list[str]]]:
    """Each tabular's rows as cells, bold unwrapped and escapes undone."""
    tables = []
    for body in re.findall(r"\\toprule\n(.*?)\\bottomrule", tex, re.S):
        rows = [line[:-len(r" \\")] for line in body.splitlines() if line.endswith(r" \\")]
        tables.append([[re.sub(r"\\textbf\{(.*)\}", r"\1", c).replace(r"\_", "_").replace(r"\&", "&")
                        .replace("$n$", "n").replace("Model", "model") for c in row.split(" & ")] for row in rows])
    return tables


def _markdown_cells(md: str) -> list[list[list[str]]]:
    tables = []
    for block in md.split("### ")[1:]:
        rows = [line.strip("|").split(" | ") for line in block.splitlines() if line.startswith("| ")]
        tables.append([[c.strip().strip("*") for c in row] for row in rows])
    return tables


def test_latex_and_markdown_tables_agree_cell_for_cell():
    runs = [{"source": "runs/llava_1.5/records.jsonl", "dataset": "coco", "split": "adversarial", "n": 3000,
             "readouts": {"legacy_2tok": {"f1": 0.7608}, "template_aware": {"f1": 0.8221}}},
            {"source": "runs/qwen&co/records.jsonl", "dataset": "coco", "split": "adversarial", "n": 3000,
             "readouts": {"legacy_2tok": {"f1": 0.85}, "template_aware": {"f1": 0.85}}},
            {"source": "ugaa_pope_random.json", "split": "random", "n": 600,
             "readouts": {"legacy_8tok": {"f1": 0.5}}}]
    md, tex = format_f1_tables(runs, "markdown"), format_f1_tables(runs, "latex")
    assert _latex_cells(tex) == _markdown_cells(md) == [
        [["model", "n", "legacy_2tok", "template_aware"], ["llava_1.5", "3000", "0.7608", "0.8221"],
         ["qwen&co", "3000", "0.8500", "0.8500"]],
        [["model", "n", "legacy_8tok"], ["ugaa_pope_random", "600", "0.5000"]]]
    assert r"qwen\&co & 3000" in tex and r"legacy\_2tok" in tex
    # best per row: both ties marked, in both renderings
    assert r"\textbf{0.8221}" in tex and "0.7608 &" in tex and tex.count(r"\textbf{0.8500}") == 2
    assert "| **0.8221** |" in md and md.count("**0.8500**") == 2
    assert [t["group"] for t in f1_tables(runs)] == ["coco adversarial", "random"]
    assert tex.count(r"\toprule") == tex.count(r"\bottomrule") == 2


def test_latex_compiles_as_a_fragment(tmp_path):
    engine = next((e for e in ("pdflatex", "lualatex", "xelatex", "tectonic") if shutil.which(e)), None)
    if engine is None:
        pytest.skip("no LaTeX engine (pdflatex, lualatex, xelatex, tectonic) on this machine")
    runs = [{"source": "runs/a_b&c%#~^{x}/records.jsonl", "dataset": "gqa", "split": "random", "n": 10,
             "readouts": {"legacy_2tok": {"f1": 0.5}, "exact_match": {"f1": 0.25}}}]
    (tmp_path / "t.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                                    + format_f1_tables(runs, "latex") + "\n\\end{document}\n")
    args = [engine, "t.tex"] if engine == "tectonic" else [engine, "-interaction=nonstopmode", "-halt-on-error", "t.tex"]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "t.pdf").is_file()


def test_report_without_matplotlib_says_which_extra(tmp_path):
    run = _write_run(tmp_path / "run", 1, groups=(("coco", "random"),))
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from click.testing import CliRunner\nfrom pope_fast.cli import main\n"
            f"r = CliRunner().invoke(main, ['report', {str(run)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
            "print(r.exit_code, r.output)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("1 Error: pope-fast report draws with matplotlib: pip install \"pope-fast[report]\"")
    assert "Traceback" not in done.stdout


def test_readout_and_cli_import_no_plotting_or_parquet_library():
    code = ("import sys, pope_fast.readout, pope_fast.cli, pope_fast.readout.figures; "
            "assert not {'matplotlib', 'pyarrow'} & set(sys.modules), 'imported at import time'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_report_draws_the_probe_by_outcome(tmp_path):
    """A run with the image-attention probe gets its right-vs-wrong figure; the numbers beside it are the
    per-question layer means split by each readout's decision, with score's d and p."""
    import numpy as np

    folder = tmp_path / "probed"
    folder.mkdir()
    write_meta(folder, {"token_sets": {n: s.to_json() for n, s in SETS.items()}})
    rng = np.random.default_rng(11)
    records, attention = [], []
    for i in range(30):
        q = Question(i + 1, f"img{i // 6}.jpg", "Is there a dog?", "yes" if i % 2 == 0 else "no", "adversarial", "coco")
        layers = rng.uniform(0, 1, 10).tolist()
        logits = {t: float(rng.normal()) for t in IDS}
        records.append(make_record(q, "llava_plain", first_token_id=3869, candidate_logits=logits,
                                   probe={"image_attention": layers}))
        attention.append(float(np.mean(layers[4:6])))  # the middle fifth of 10 layers: 4-5
    with RecordWriter(folder) as w:
        w.write(records)
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    [run] = json.loads(CliRunner().invoke(main, ["score", str(folder), "--format", "json"]).output)["runs"]
    data = json.loads((out / "probed" / "coco-adversarial" / "image_attention.json").read_text())
    assert data["layers"] == run["image_attention"]["layers"] == [4, 5]
    for name, groups in data["readouts"].items():
        stats = run["image_attention"]["readouts"][name]["correct_vs_wrong"]
        assert len(groups["correct"]) == stats["a"]["n"] and len(groups["wrong"]) == stats["b"]["n"]
        assert groups["cohens_d"] == stats["cohens_d"] and groups["mann_whitney_p"] == stats["mann_whitney_p"]
        assert sorted(groups["correct"] + groups["wrong"]) == pytest.approx(sorted(attention))  # every one answered
        assert sum(groups["correct"]) / len(groups["correct"]) == pytest.approx(stats["a"]["mean"], abs=1e-6)
    assert _png_size(out / "probed" / "coco-adversarial" / "image_attention.png")[0] == 800
    assert "image attention, right vs wrong answers" in (out / "report.html").read_text()
