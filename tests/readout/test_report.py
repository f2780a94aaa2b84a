"""`pope-fast report` and the F1 tables: figures, their numbers against `pope-fast score`, the HTML
page, and the LaTeX table against the markdown one."""
import base64
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import Question, TokenSets, make_record
from pope_fast.readout.report import figure_data
from pope_fast.readout.report.tables import f1_tables, format_f1_tables
from pope_fast.store import RecordWriter, write_meta

SETS = {"legacy_2tok": TokenSets((3582,), (1217,)),
        "legacy_8tok": TokenSets((3582, 3869), (1217, 1939)),
        "dynamic_single": TokenSets((3869,), (1939,)),
        "template_aware": TokenSets((3869, 8241), (1939, 694)),
        "first_token": TokenSets((3869, 8241), (1939, 694))}
IDS = (3582, 1217, 3869, 1939, 8241, 694)


def _write_run(folder, seed: int, groups=(("coco", "random"), ("coco", "adversarial")), sets=SETS,
               texts=True):
    """A run folder of 24 questions per group whose logits, first tokens and texts vary with the
    seed; `sets` its token sets, and without `texts` no decoded text (no text readout): a figure a
    readout costs."""
    folder.mkdir(parents=True)
    write_meta(folder, {"token_sets": {n: s.to_json() for n, s in sets.items()}})
    records = []
    for dataset, split in groups:
        for i in range(24):
            q = Question(i + 1, f"img{i // 6}.jpg", "Is there a dog in the image?",
                         "yes" if i % 2 == 0 else "no", split, dataset)
            k = (i * 7 + seed * 5 + len(split)) % 11
            logits = {t: float((t * (k + 3) + seed) % 13) for t in IDS}
            first = (3869, 1939, 8241, 29871)[k % 4]
            decoded = (("Yes", "No", "yes, there is", "I cannot tell")[(k + seed) % 4] if texts
                       else None)
            records.append(make_record(q, "llava_plain", first_token_id=first,
                                       candidate_logits=logits, decoded=decoded))
    with RecordWriter(folder) as w:
        w.write(records)
    return folder


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.slow
def test_tables_md_holds_each_dataset_and_split_and_their_average(tmp_path):
    """A run of several datasets (POPE's three as one benchmark): tables.md ends with score's
    by-dataset-and-split table and its average row. One readout: the rows are the datasets' and
    splits' whatever the readouts."""
    run = _write_run(tmp_path / "run", 1, groups=(("gqa", "random"), ("coco", "random")),
                     sets={"legacy_2tok": SETS["legacy_2tok"]}, texts=False)
    result = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "report"),
                                       "--resamples", "20", "--formats", "png"])
    assert result.exit_code == 0, result.output
    tables = (tmp_path / "report/tables.md").read_text()
    block = tables[tables.index("by dataset and split"):].splitlines()
    assert [line.split(" | ")[:2] for line in block[3:]] == [["| coco", "random"],
                                                             ["| gqa", "random"],
                                                             ["| average", "2 rows"]]
    # --formats png: each figure's PNG and numbers alone, and no caption names a one-column PDF
    written = {p.suffix for p in (tmp_path / "report").rglob("*") if p.is_file()}
    assert written == {".png", ".json", ".md", ".tex", ".html"}
    assert "One column wide" not in (tmp_path / "report/report.html").read_text()


def test_formats_without_png_or_with_an_unknown_one_are_refused_before_anything_is_written(
        tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for formats, line in (("pdf,svg",
                           "--formats must name png: the report's page embeds each figure's PNG"),
                          ("png,jpg",
                           "--formats: 'jpg' is not a figure format "
                           "(any of png, pdf, svg, column, ")):
        result = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "r"),
                                           "--formats", formats])
        assert result.exit_code == 1 and line in result.output, result.output
        assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_report_on_two_runs(tmp_path):
    from PIL import Image

    runs = [_write_run(tmp_path / "llava-a", 1), _write_run(tmp_path / "llava-b", 2)]
    # llava-b stopped 6 questions short of its random split
    stopped = json.loads((runs[1] / "meta.json").read_text())
    write_meta(runs[1], {**stopped, "questions": {"coco/random": 30, "coco/adversarial": 24}})
    out = tmp_path / "report"
    # the PNGs alone: each vector copy draws the figure again (they are test_demo_report_...'s)
    result = CliRunner().invoke(main, ["report", *map(str, runs), "--out", str(out),
                                       "--formats", "png"])
    assert result.exit_code == 0, result.output
    score = json.loads(CliRunner().invoke(
        main, ["score", *map(str, runs), "--format", "json"]).output)["runs"]
    assert len(score) == 2 * 3 and json.loads((out / "scores.json").read_text())["runs"] == score

    for run in score:
        # one folder per run below the report's, each figure named by its split (it was three
        # folders deep)
        folder, split = out / run["source"].split("/")[-2], f"{run['dataset']}-{run['split']}"
        readouts = run["readouts"]
        # every readout available: token sets, first tokens, texts (all but the sequence)
        assert len(readouts) == 11
        numbers = {name: json.loads((folder / f"{split}_{name}.json").read_text())
                   for name in ("confusion", "f1", "yes_rate", "first_tokens")}
        for name, m in readouts.items():
            answered = m["tp"] + m["tn"] + m["fp"] + m["fn"]
            assert numbers["confusion"]["readouts"][name] == {
                k: m[k] for k in ("tp", "tn", "fp", "fn", "unknown")}
            assert numbers["f1"]["readouts"][name] == {"f1": m["f1"], "f1_ci95": m["f1_ci95"],
                                                       "unknown": m["unknown"]}
            assert numbers["yes_rate"]["readouts"][name] == {
                "yes_rate": m["yes_rate"] if answered else None, "yes_rate_all": m["yes_rate_all"],
                "answered": answered, "unknown": m["unknown"]}
        assert numbers["yes_rate"]["label_yes_rate"] == 0.5   # 12 yes-labels of 24
        tokens = numbers["first_tokens"]
        assert tokens["first_token_counts"] == run["first_token_counts"]
        assert {t["id"]: t["count"] for t in tokens["tokens"] if t["count"]} == \
            {int(i): c for i, c in run["first_token_counts"].items()}
        by_id = {t["id"]: t["readouts"] for t in tokens["tokens"]}
        assert by_id[3582] == {"legacy_2tok": "yes", "legacy_8tok": "yes"} and by_id[29871] == {}
        assert by_id[694] == {"template_aware": "no", "first_token": "no"}
        # expected layout sizes at 100 dpi, saved at 200: a 4-column grid of 11 matrices, one row
        # per readout in the bars
        assert _png_size(folder / f"{split}_confusion.png") == (2000, 1500)
        assert _png_size(folder / f"{split}_f1.png") \
            == _png_size(folder / f"{split}_yes_rate.png") == (1600, 2 * (90 + 32 * 11))
        assert _png_size(folder / f"{split}_first_tokens.png")[0] \
            == 2 * (220 + 40 * len(tokens["tokens"]))
    # one figure: models x (readout, split)
    grid = json.loads((out / "f1_models_readouts_splits.json").read_text())
    assert (grid["groups"] == ["coco random", "coco adversarial", "coco Overall"]
            and grid["models"] == ["llava-a", "llava-b"])
    for group in grid["groups"]:
        split = group.split()[1]
        assert grid["readouts"][group] == list(score[0]["readouts"])
        assert grid["f1"][group] == [[r["readouts"][n]["f1"] for n in grid["readouts"][group]]
                                     for r in score if r["split"] == split]
        assert [row.count(True) >= 1 for row in grid["best"][group]] == [True, True]

    pngs = sorted(out.rglob("*.png"))
    # per run and split (and Overall); the paper's pair per run; the F1 grid
    assert len(pngs) == 2 * 3 * 4 + 2 + 1
    for png in pngs:
        with Image.open(png) as image:
            image.verify()
    page = (out / "report.html").read_text()
    embedded = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', page)
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(p.read_bytes() for p in pngs)
    assert (page.count("<img") == len(pngs)
            and not re.search(r"(src|href)=\"(?!data:)|<script|<link", page))
    tables = CliRunner().invoke(main, ["score", *map(str, runs), "--format", "models"]).output
    assert (out / "tables.md").read_text() == tables
    # the stopped split is marked as `score` marks it, in the page's tables, its section and its
    # figures' captions
    assert (tables.count("| llava-b | 24 of 30 asked (incomplete) |") == 1
            and "| llava-a | 24 |" in tables)
    assert (page.count("<td>24 of 30 asked (incomplete)</td>") == 1
            and page.count("(incomplete)") == 2)  # + Overall
    assert "<h2>llava-b, coco random (n=24 of 30 asked, incomplete)</h2>\n" \
           "<p><b>Incomplete</b>: 24 of 30 asked (incomplete: the run stopped part way); " \
           "every number of this split is partial.</p>" in page
    # its figures' captions
    assert "(n=24 of 30 asked (incomplete: the run stopped part way))" in page
    assert (out / "tables.tex").read_text() == CliRunner().invoke(
        main, ["score", *map(str, runs), "--format", "latex"]).output


def _latex_cells(tex: str) -> list[list[list[str]]]:
    """Each tabular's rows as cells, bold unwrapped and escapes undone."""
    tables = []
    for body in re.findall(r"\\toprule\n(.*?)\\bottomrule", tex, re.S):
        rows = [line[:-len(r" \\")] for line in body.splitlines() if line.endswith(r" \\")]
        tables.append([[re.sub(r"\\textbf\{(.*)\}", r"\1", c).replace(r"\_", "_")
                        .replace(r"\&", "&").replace("$n$", "n").replace("Model", "model")
                        for c in row.split(" & ")]
                       for row in rows])
    return tables


def _markdown_cells(md: str) -> list[list[list[str]]]:
    tables = []
    for block in md.split("### ")[1:]:
        rows = [line.strip("|").split(" | ") for line in block.splitlines()
                if line.startswith("| ")]
        tables.append([[c.strip().strip("*") for c in row] for row in rows])
    return tables


def _answered(f1: float) -> dict:
    """A readout's metrics as the F1 tables read them: its F1 and counts of a readout that
    answered."""
    return {"f1": f1, "tp": 1, "tn": 1, "fp": 1, "fn": 0, "unknown": 0}


def test_latex_and_markdown_tables_agree_cell_for_cell():
    runs = [{"source": "runs/llava_1.5/records.jsonl", "dataset": "coco", "split": "adversarial",
             "n": 3000,
             "readouts": {"legacy_2tok": _answered(0.7608), "template_aware": _answered(0.8221)}},
            {"source": "runs/qwen&co/records.jsonl", "dataset": "coco", "split": "adversarial",
             "n": 3000,
             "readouts": {"legacy_2tok": _answered(0.85), "template_aware": _answered(0.85)}},
            {"source": "ugaa_pope_random.json", "split": "random", "n": 600,
             "readouts": {"legacy_8tok": _answered(0.5)}}]
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


def test_a_run_that_stopped_part_way_is_marked_in_its_tables_and_captions(tmp_path):
    """`report`'s tables (tables.md, tables.tex, `score --format models`) and figure captions mark a
    split that recorded fewer questions than its meta.json asked, as `score`'s own tables do; a
    finished run's n stays bare."""
    from pope_fast.readout import read_records, score_records
    from pope_fast.readout.report.tables import format_runs

    runs = []
    for name, asked in (("whole", 24), ("stopped", 40)):
        folder = _write_run(tmp_path / name, 1, groups=(("coco", "random"),))
        write_meta(folder, {**json.loads((folder / "meta.json").read_text()),
                            "questions": {"coco/random": asked}})
        runs += score_records(read_records(folder), ["legacy_2tok"])
    assert [r["n"] for r in f1_tables(runs)[0]["rows"]] == ["24", "24 of 40 asked (incomplete)"]
    assert "| stopped | 24 of 40 asked (incomplete) | " in format_f1_tables(runs, "markdown")
    assert r"stopped & 24 of 40 asked (incomplete) & " in format_f1_tables(runs, "latex")
    assert "n=24 of 40 asked (incomplete: the run stopped part way)" \
        in format_runs(runs[1:], "markdown")
    caption = figure_data.confusion(runs[1])[1]
    assert "(n=24 of 40 asked (incomplete: the run stopped part way))" in caption
    assert ("(n=24)" in figure_data.confusion(runs[0])[1]
            and figure_data.f1(runs[1], 0, 9)[0]["asked"] == 40)
    assert figure_data.f1_grid(runs)[1].endswith(
        " INCOMPLETE RUNS (stopped part way, partial F1): stopped, coco random: 24 of 40 asked.")


def test_a_pipe_in_a_models_name_stays_in_its_cell():
    """A run folder named `a|b` is one cell of the markdown tables (`score --format models`,
    tables.md), and one cell again where the page renders markdown tables."""
    from pope_fast.readout.report.markup import markdown_html

    runs = [{"source": "runs/llava|nf4/records.jsonl", "dataset": "coco", "split": "random",
             "n": 30,
             "readouts": {"legacy_2tok": _answered(0.75), "template_aware": _answered(0.5)}}]
    md = format_f1_tables(runs, "markdown")
    assert md.splitlines()[-1] == r"| llava\|nf4 | 30 | **0.7500** | 0.5000 |"
    assert "<td style=\"text-align:left\">llava|nf4</td><td>30</td>" in markdown_html(md)


def test_latex_compiles_as_a_fragment(tmp_path):
    engine = next((e for e in ("pdflatex", "lualatex", "xelatex", "tectonic")
                   if shutil.which(e)), None)
    if engine is None:
        pytest.skip("no LaTeX engine (pdflatex, lualatex, xelatex, tectonic) on this machine")
    runs = [{"source": "runs/a_b&c%#~^{x}/records.jsonl", "dataset": "gqa", "split": "random",
             "n": 10, "readouts": {"legacy_2tok": _answered(0.5), "exact_match": _answered(0.25)}}]
    (tmp_path / "t.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n"
                                    "\\begin{document}\n"
                                    + format_f1_tables(runs, "latex") + "\n\\end{document}\n")
    args = ([engine, "t.tex"] if engine == "tectonic"
            else [engine, "-interaction=nonstopmode", "-halt-on-error", "t.tex"])
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "t.pdf").is_file()


def test_report_without_matplotlib_says_which_extra(tmp_path):
    run = _write_run(tmp_path / "run", 1, groups=(("coco", "random"),))
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from click.testing import CliRunner\nfrom pope_fast.cli import main\n"
            f"r = CliRunner().invoke(main, ['report', {str(run)!r}, "
            f"'--out', {str(tmp_path / 'out')!r}])\n"
            "print(r.exit_code, r.output)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith('1 Error: pope-fast report draws with matplotlib, '
                                  'which is not installed: pip install -e ".[report]"')
    assert not (tmp_path / "out").exists()  # refused before any table is written
    assert "Traceback" not in done.stdout


def test_readout_and_cli_import_no_plotting_or_parquet_library():
    code = ("import sys, pope_fast.readout, pope_fast.cli, pope_fast.readout.report.figures, "
            "pope_fast.readout.report.page; "
            "assert not {'matplotlib', 'pyarrow'} & set(sys.modules), 'imported at import time'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_report_draws_the_probe_by_outcome(tmp_path):
    """A run with the image-attention probe gets its right-vs-wrong figure; the numbers beside it
    are the per-question layer means split by each readout's decision, with score's d and p."""
    import numpy as np

    folder = tmp_path / "probed"
    folder.mkdir()
    write_meta(folder, {"token_sets": {n: s.to_json() for n, s in SETS.items()}})
    rng = np.random.default_rng(11)
    records, attention = [], []
    for i in range(30):
        q = Question(i + 1, f"img{i // 6}.jpg", "Is there a dog?", "yes" if i % 2 == 0 else "no",
                     "adversarial", "coco")
        layers = rng.uniform(0, 1, 10).tolist()
        logits = {t: float(rng.normal()) for t in IDS}
        records.append(make_record(q, "llava_plain", first_token_id=3869, candidate_logits=logits,
                                   probe={"image_attention": layers}))
        attention.append(float(np.mean(layers[4:6])))  # the middle fifth of 10 layers: 4-5
    with RecordWriter(folder) as w:
        w.write(records)
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", str(folder), "--out", str(out),
                                       "--formats", "png,column"])
    assert result.exit_code == 0, result.output
    [run] = json.loads(CliRunner().invoke(
        main, ["score", str(folder), "--format", "json"]).output)["runs"]
    data = json.loads((out / "probed" / "coco-adversarial_image_attention.json").read_text())
    assert data["layers"] == run["image_attention"]["layers"] == [4, 5]
    for name, groups in data["readouts"].items():
        stats = run["image_attention"]["readouts"][name]["correct_vs_wrong"]
        assert (len(groups["correct"]) == stats["a"]["n"]
                and len(groups["wrong"]) == stats["b"]["n"])
        assert (groups["cohens_d"] == stats["cohens_d"]
                and groups["mann_whitney_p"] == stats["mann_whitney_p"])
        # every one answered
        assert sorted(groups["correct"] + groups["wrong"]) == pytest.approx(sorted(attention))
        assert sum(groups["correct"]) / len(groups["correct"]) \
            == pytest.approx(stats["a"]["mean"], abs=1e-6)
    assert _png_size(out / "probed" / "coco-adversarial_image_attention.png")[0] == 2 * 860
    assert "coco adversarial (n=30): Image attention at the answer position " \
        "(mean over layers 4-5 of 10," in (out / "report.html").read_text()


META = {"model": {"path": "/models/llava-1.5-7b-hf", "family": "llava", "files": {}},
        "template": "llava_plain",
        "prompt_example": "USER: <image>\nIs there a dog in the image?\nASSISTANT:",
        "settings": {"dtype": "fp16", "resolved_dtype": "float16", "quant": "nf4",
                     "quantize_lm_head": False},
        "method": {"name": "none", "settings": {}}, "created": "2026-11-30T12:00:00+00:00",
        "pope_fast_version": "0.9.1"}


def _figures(page: str) -> list[tuple[int, str]]:
    """(number, caption) of every figure of the page, in order."""
    found = re.findall(r'<figure id="figure-(\d+)" style="width:\d+px"><img alt="Figure \1" '
                       r'src="data:image/png;base64,[A-Za-z0-9+/=]+">'
                       r"<figcaption><b>Figure \1\.</b> (.*?)</figcaption></figure>", page)
    return [(int(k), caption) for k, caption in found]


@pytest.mark.slow
def test_report_names_what_made_each_run_and_captions_every_figure(tmp_path):
    """The header row of each run: model, family, template, method, dtype, quantization, created,
    version, "-" where meta.json records none; every figure numbered in order with a caption naming
    its numbers. The paper's pair of readouts alone: what a header and a caption say holds whichever
    readouts a run has."""
    pair = {name: SETS[name] for name in ("legacy_2tok", "template_aware")}
    made = _write_run(tmp_path / "llava-nf4", 1, groups=(("coco", "adversarial"),), sets=pair,
                      texts=False)
    meta = json.loads((made / "meta.json").read_text())
    command = f"/home/me/venv/bin/pope-fast eval --model llava-1.5-7b-hf " \
              f"--images {tmp_path}/images --out={made} --device cpu"
    (made / "meta.json").write_text(json.dumps({**meta, **META, "command": command}))
    older = _write_run(tmp_path / "older", 2, groups=(("coco", "adversarial"),), sets=pair,
                       texts=False)
    out = tmp_path / "report"
    assert CliRunner().invoke(main, ["report", str(made), str(older), "--out", str(out),
                                     "--formats", "png"]).exit_code == 0
    page = (out / "report.html").read_text()
    header = re.search(r'<table class="runs"><thead><tr>(.*?)</tr></thead><tbody>(.*?)</tbody>',
                       page)
    assert re.findall(r"<th>(.*?)</th>", header[1]) == ["run", "model", "family", "template",
                                                        "method", "dtype", "quantization",
                                                        "created", "pope-fast"]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", header[2])]
    assert rows == [["llava-nf4", "llava-1.5-7b-hf", "llava", "llava_plain", "none", "float16",
                     "nf4", "2026-11-30T12:00:00+00:00", "0.9.1"],
                    ["older", "-", "-", "-", "none", "-", "-", "-", "-"]]
    # a shared page names no folder of the machine: the checkpoint's name, the command and sources
    # from the page
    assert str(tmp_path) not in page and "/venv/bin" not in page and "/models/" not in page
    assert "llava-nf4: <code>pope-fast eval --model llava-1.5-7b-hf --images ../images " \
           "--out=../llava-nf4 --device cpu</code>" in page
    assert "llava-nf4 (<code>../llava-nf4/records.jsonl</code>), " \
           "older (<code>../older/records.jsonl</code>)" in page
    assert "Template llava_plain: " \
        "<code>USER: &lt;image&gt;&#92;nIs there a dog in the image?&#92;nASSISTANT:</code>" \
        in page
    shown = _figures(page)
    assert ([k for k, _ in shown] == list(range(1, page.count("<figure") + 1))
            and len(shown) == 1 + 2 + 2 * 4)
    for _, caption in shown:
        numbers = re.search(r"Numbers: <code>(.*?)</code>\.$", caption)[1]
        assert (out / numbers).is_file() and (out / numbers).with_suffix(".png").is_file()
    captions = [c for _, c in shown]
    assert captions[0].startswith("F1 of every model (rows) under every readout (columns)")
    assert captions[1].startswith("llava-nf4: The paper&#x27;s Fig. 2 on coco adversarial (n=24)")
    assert ("legacy_2tok (yes 3582; no 1217) and by template_aware (yes 3869, 8241; no 1939, 694)"
            in captions[1])
    assert sum(c.startswith("older, coco adversarial (n=24): Confusion matrix of every readout")
               for c in captions) == 1
    # each F1 figure
    assert sum("1000 resamples of the questions, seed 0" in c for c in captions) == 2


@pytest.mark.slow
def test_first_token_bars_are_labelled_with_token_strings(tmp_path):
    """The histogram's labels are the token strings meta.json records (with the id), ids alone where
    it has none; matplotlib's mathtext never reads a `$` in one."""
    from pope_fast.readout.report import figures

    run = _write_run(tmp_path / "run", 1, groups=(("coco", "random"),))
    meta = json.loads((run / "meta.json").read_text())
    strings = {"3869": "▁Yes", "1939": "▁No", "8241": "Yes", "694": "$no$", "3582": "yes",
               "1217": "no"}
    (run / "meta.json").write_text(json.dumps({**meta, "token_strings": strings}))
    # a run from before token strings: ids alone whatever its readouts (one here: its figures cost
    # the least)
    older = _write_run(tmp_path / "older", 1, groups=(("coco", "random"),),
                       sets={"legacy_2tok": SETS["legacy_2tok"]}, texts=False)
    out = tmp_path / "report"
    assert CliRunner().invoke(main, ["report", str(run), str(older), "--out", str(out),
                                     "--formats", "png"]).exit_code == 0
    data = json.loads((out / "run" / "coco-random_first_tokens.json").read_text())
    assert {t["id"]: t["token"] for t in data["tokens"]} \
        == {int(i): s for i, s in strings.items()} | {29871: None}
    fig = figures.first_tokens("t", data)
    fig.canvas.draw()
    labels = {t.get_text() for t in fig.axes[0].get_xticklabels()}
    assert {"▁Yes  3869", "▁No  1939", r"\$no\$  694", "29871"} <= labels
    assert all(t["token"] is None
               for t in json.loads((out / "older" / "coco-random_first_tokens.json")
                                   .read_text())["tokens"])
    page = (out / "report.html").read_text()
    assert ("This run&#x27;s meta.json records no token strings" in page
            and "meta.json&#x27;s token_strings" in page)


@pytest.mark.slow
def test_demo_report_labels_first_tokens_with_the_engines_strings(tmp_path):
    """End to end: `pope-fast eval`'s meta.json carries the candidate ids' strings and the report
    draws them."""
    assert CliRunner().invoke(main, ["eval", "--out", str(tmp_path / "demo")]).exit_code == 0
    meta = json.loads((tmp_path / "demo" / "meta.json").read_text())
    assert meta["token_strings"] and set(meta["token_strings"]) <= {
        str(i) for i in meta["candidate_ids"]}
    assert CliRunner().invoke(main, ["report", str(tmp_path / "demo"), "--out",
                                     str(tmp_path / "r")]).exit_code == 0
    tokens = json.loads((tmp_path / "r" / "demo" / "demo_first_tokens.json").read_text())["tokens"]
    assert {str(t["id"]): t["token"] for t in tokens
            if t["token"] is not None} == meta["token_strings"]
    # every format by default: the vector copies, the column layout
    pngs = sorted((tmp_path / "r").rglob("*.png"))
    for png in pngs:  # vector copies for a paper beside each PNG
        assert png.with_suffix(".pdf").read_bytes().startswith(b"%PDF-")
        assert b"<svg" in png.with_suffix(".svg").read_bytes()[:2000]
        assert png.with_name(png.stem + ".column.pdf").read_bytes().startswith(b"%PDF-")
    assert pngs
    assert (tmp_path / "r/report.html").read_text().count("One column wide (3.3 in, 8 pt)") \
        == len(pngs)


@pytest.mark.slow
def test_yes_rate_marks_readouts_and_splits_with_no_answered_question(tmp_path):
    """A readout that answered nothing (first_token when no first token is a candidate, text
    readouts on text without yes or no) and a split whose every record is an error have no yes-rate:
    null, answered 0, and a grey band that says so rather than a bar of 0. Two token sets (each
    readout's yes-rate is its own: the text readouts and these two are the kinds there are)."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_meta(folder, {"token_sets": {n: SETS[n].to_json()
                                       for n in ("legacy_2tok", "first_token")}})
    records = []
    for i in range(12):
        q = Question(i + 1, f"img{i}.jpg", "Is there a dog?", "yes" if i < 4 else "no", "random",
                     "coco")
        records.append(make_record(q, "llava_plain", first_token_id=29871, decoded="I cannot tell",
                                   candidate_logits={t: float(t % 7) for t in IDS}))
        q = Question(i + 1, f"img{i}.jpg", "Is there a dog?", "yes", "popular", "coco")
        records.append(make_record(q, "llava_plain", error="unreadable image"))
    with RecordWriter(folder) as w:
        w.write(records)
    out = tmp_path / "report"
    assert CliRunner().invoke(main, ["report", str(folder), "--out", str(out),
                                     "--formats", "png"]).exit_code == 0
    answered = json.loads((out / "run" / "coco-random_yes_rate.json").read_text())
    assert answered["label_yes_rate"] == 4 / 12
    assert answered["readouts"]["first_token"] == {"yes_rate": None, "yes_rate_all": 0.0,
                                                   "answered": 0, "unknown": 12}
    assert answered["readouts"]["string_parse"]["yes_rate"] is None
    # 3582 % 7 = 5 against 1217 % 7 = 6: every answer no
    legacy = answered["readouts"]["legacy_2tok"]
    assert legacy == {"yes_rate": 0.0, "yes_rate_all": 0.0, "answered": 12, "unknown": 0}
    errors = json.loads((out / "run" / "coco-popular_yes_rate.json").read_text())
    assert errors["errors"] == 12 and errors["label_yes_rate"] is None
    assert all(r["yes_rate"] is None and r["answered"] == 0 for r in errors["readouts"].values())
    grid = json.loads((out / "f1_models_readouts_splits.json").read_text())
    assert all(v is None for v in grid["f1"]["coco popular"][0])   # no answer at all: no F1 to show


def _paired(out, seeds=(1, 3), groups=(("coco", "random"), ("coco", "adversarial"))):
    """A paired folder as `pope-fast eval --method none --method vcd` leaves it: OUT/none, OUT/vcd
    and OUT/compare.json written by compare_runs."""
    from pope_fast.readout import compare_runs, format_compare

    for name, seed in zip(("none", "vcd"), seeds):
        folder = _write_run(out / name, seed, groups)
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(
            json.dumps({**meta, "method": {"name": name, "settings": {}}}))
    result = compare_runs([out / "none", out / "vcd"])
    (out / "compare.json").write_text(format_compare(result, "json") + "\n")
    return out


@pytest.mark.slow
def test_report_of_a_paired_folder_draws_delta_f1_from_compare_json(tmp_path):
    """`pope-fast report OUT` on a paired folder: both runs' figures, and ΔF1 per readout and split
    with the paired interval and McNemar's p, the numbers of compare.json, found where the folder
    lies now."""
    written = _paired(tmp_path / "methods")
    saved = json.loads((written / "compare.json").read_text())
    moved = tmp_path / "elsewhere" / "methods"   # compare.json names the folders as they were
    moved.parent.mkdir()
    written.rename(moved)
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", str(moved), "--out", str(out),
                                       "--formats", "png,column"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "compare-methods" / "delta_f1_vcd_vs_none.json").read_text())
    [pair] = saved["pairs"]
    assert data["splits"] == {
        split: {n: {k: r[k] for k in ("f1_a", "f1_b", "delta_f1", "delta_f1_ci95", "mcnemar_p")}
                for n, r in table.items()}
        for split, table in pair["splits"].items()}
    assert data["readouts"] == pair["readouts"] and data["questions"] == {
        "random": 24, "adversarial": 24, "Overall": 48}
    assert any(r["delta_f1"] != 0 for t in data["splits"].values() for r in t.values())
    assert (data["a"], data["b"], data["level"], data["resamples"]) == (
        pair["a"], pair["b"], 0.95, 1000)
    assert (out / "none" / "coco-random_confusion.png").is_file()
    assert (out / "vcd" / "coco-adversarial_f1.png").is_file()
    # no figure two folders down
    assert not [p for p in out.rglob("*") if len(p.relative_to(out).parts) > 2]
    page = (out / "report.html").read_text()
    caption = next(c for _, c in _figures(page) if c.startswith("ΔF1"))
    # the compare.json it came from, as the page's folder reaches it (a shared page names no
    # machine's folders)
    assert ("B vcd (vcd) against A none (none)" in caption
            and os.path.relpath(moved / "compare.json", out) in caption)
    grid = json.loads((out / "f1_models_readouts_splits.json").read_text())
    assert grid["models"] == ["none", "vcd"]
    # the yes-bias section, from compare.json
    bias = pair["splits"]["random"]["template_aware"]["bias"]
    assert "Does the gain survive a yes-bias?" in page and "resampling IMAGES" in page
    cells = re.sub(r"<td[^>]*>", "<td>", page)
    assert (f"<td>{bias['n']} ({bias['images']} images)</td>"
            f"<td>{bias['a']['yes_rate']:.4f} → ") in cells
    from pope_fast.readout.report import column

    # its one-column layout: a panel a split and Overall, each legible (every other layout:
    # test_every_pair_...)
    assert (out / "compare-methods" / "delta_f1_vcd_vs_none.column.pdf").is_file()
    _legible_at_one_column(column.delta_f1("ΔF1 of vcd against none, a title as long as a hub id "
                                           "and its split: llava-hf/llava-1.5-7b-hf", data))


def test_attention_figure_puts_d_and_p_on_each_readouts_row_and_ticks_apart():
    """Close values (0.97760 to 0.97763) get distinct tick labels that do not overlap; each
    readout's d and p sit on its own row, at the right of the axes."""
    import numpy as np

    from pope_fast.readout.report import figures

    rng = np.random.default_rng(3)
    readouts = {name: {"correct": (0.9776 + rng.uniform(0, 3e-5, 20)).tolist(),
                       "wrong": (0.9776 + rng.uniform(0, 3e-5, 9)).tolist(),
                       "mean_difference": 1e-6,
                       "cohens_d": 0.1 * k, "mann_whitney_p": 0.01 * (k + 1)}
                for k, name in enumerate(list(SETS))}
    fig = figures.attention_plot("t", {"layers": [14, 19], "num_layers": 32, "readouts": readouts})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticklabels() if t.get_text()]
    assert 3 <= len(ticks) <= 7 and len({t.get_text() for t in ticks}) == len(ticks)
    boxes = sorted((t.get_window_extent(renderer) for t in ticks), key=lambda b: b.x0)
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))
    rows = {t.get_text(): t.get_window_extent(renderer) for t in ax.get_yticklabels()}
    notes = [t for t in ax.texts if t.get_text().startswith("d ")]
    assert len(notes) == len(SETS)
    for k, (name, note) in enumerate(zip(SETS, notes)):
        box, row = note.get_window_extent(renderer), rows[name]
        assert note.get_text().startswith(f"d {0.1 * k:.2f}, p {0.01 * (k + 1):.2g}")
        assert (box.y0 < (row.y0 + row.y1) / 2 < box.y1
                and box.x0 > ax.get_window_extent(renderer).x1)


@pytest.mark.slow
def test_grid_and_the_papers_pair_across_unlike_sources(tmp_path, shared):
    """A run and a published file: the grid has a panel per group with the readouts supplied there
    and a row per model ("-" where a model has no such group); the paper's pair is legacy_2tok
    against template_aware on the adversarial split (not the run's first), else the two readouts
    whose F1 differ most. The run has that pair's readouts alone: a panel holds the readouts
    supplied there, whichever they are."""
    pair = {name: SETS[name] for name in ("legacy_2tok", "template_aware")}
    # coco random, then coco adversarial
    run = _write_run(tmp_path / "llava-a", 1, sets=pair, texts=False)
    published = shared / "fixtures" / "ugaa_pope_adversarial_2tok_vs_8tok_first600.json"
    out = tmp_path / "report"
    assert CliRunner().invoke(main, ["report", str(run), str(published), "--out", str(out),
                                     "--formats", "png"]).exit_code == 0
    grid = json.loads((out / "f1_models_readouts_splits.json").read_text())
    assert grid["groups"] == ["coco random", "coco adversarial", "coco Overall", "adversarial"]
    assert grid["models"] == ["llava-a", published.stem]
    assert grid["readouts"]["adversarial"] == ["legacy_2tok", "legacy_8tok"]
    assert grid["f1"]["adversarial"] == [[None, None], [2 * 290 / (2 * 290 + 169 + 10),
                                                        2 * 236 / (2 * 236 + 39 + 64)]]
    assert grid["best"]["adversarial"] == [[False, False], [False, True]]
    assert grid["f1"]["coco random"][1] == [None] * len(grid["readouts"]["coco random"])
    ours = json.loads((out / "llava-a" / "two_readouts_coco-adversarial.json").read_text())
    assert (ours["split"] == "adversarial"
            and list(ours["readouts"]) == ["legacy_2tok", "template_aware"])
    theirs = json.loads((out / published.stem / "two_readouts_adversarial.json").read_text())
    assert theirs["readouts"] == {
        "legacy_2tok": {"tp": 290, "tn": 131, "fp": 169, "fn": 10, "unknown": 0,
                        "f1": 2 * 290 / (2 * 290 + 169 + 10)},
        "legacy_8tok": {"tp": 236, "tn": 261, "fp": 39, "fn": 64, "unknown": 0,
                        "f1": 2 * 236 / (2 * 236 + 39 + 64)}}
    assert "the two readouts whose F1 differ most here" in (out / "report.html").read_text()


def test_model_table_rows_name_the_model_not_the_folder(tmp_path):
    """`score --format models` rows: the hub id a run came from, else its checkpoint folder's name
    (a cache snapshot's repository); the run folder beside it where two runs share the model; the
    folder when none."""
    from pope_fast.readout import read_records, score_records

    made = {"hub": ("none",
                    {"model": {"path": "/c/models--llava-hf--llava-1.5-7b-hf/snapshots/abc"},
                     "hub": {"model": {"id": "llava-hf/llava-1.5-7b-hf"}}}),
            "snapshot": ("vcd",
                         {"model": {"path": "/c/models--llava-hf--llava-1.5-7b-hf/snapshots/abc"}}),
            "folder": ("qwen", {"model": {"path": "/ckpt/Qwen2-VL-7B-Instruct"}}),
            "bare": ("bare", {})}
    runs = []
    for key, (folder_name, meta) in made.items():
        folder = _write_run(tmp_path / folder_name, 1, groups=(("coco", "random"),))
        write_meta(folder, {**json.loads((folder / "meta.json").read_text()), **meta})
        runs += score_records(read_records(folder), ["legacy_2tok"])
    [table] = f1_tables(runs)
    assert [r["model"] for r in table["rows"]] == ["llava-hf/llava-1.5-7b-hf (none)",
                                                   "llava-hf/llava-1.5-7b-hf (vcd)",
                                                   "Qwen2-VL-7B-Instruct", "bare"]
    grid, _ = figure_data.f1_grid(runs)  # the figure's rows are the table's, values and all
    assert grid["models"] == [r["model"] for r in table["rows"]]
    assert grid["f1"]["coco random"] == [r["values"] for r in table["rows"]]


@pytest.mark.slow
def test_every_pair_under_one_readout_in_one_figure_on_one_scale(tmp_path):
    """Two paired folders on one page (issue 35): every ΔF1 figure is drawn on the axis that holds
    all of their intervals (a ±0.006 panel beside a ±0.2 one would look as large), and the JSON says
    which; and a figure per readout holds every pair's ΔF1 (rows), the numbers of each pair's own
    figure, on that scale; each of the report's interval and bar figures is legible one column wide
    too. One split a run: the scale, the rows and the layouts hold for any number of splits (a
    pair's panels, one a split: test_report_of_a_paired_folder...), and each split costs every run
    four figures."""
    random = (("coco", "random"),)
    first, second = (_paired(tmp_path / "one", (1, 3), random),
                     _paired(tmp_path / "two", (1, 5), random))
    out = tmp_path / "report"
    assert CliRunner().invoke(main, ["report", str(first), str(second), "--out", str(out),
                                     "--formats", "png,column"]).exit_code == 0
    drawn = [json.loads(p.read_text()) for p in sorted(out.glob("compare-*/delta_f1_*.json"))
             if p.parent.name != "compare-all"]  # the pairs' own figures, not the per-readout ones
    assert len(drawn) == 2
    reach = max(abs(v) for d in drawn for t in d["splits"].values() for r in t.values()
                for v in r["delta_f1_ci95"] + [r["delta_f1"]])
    assert [d["axis_half_width"] for d in drawn] == [pytest.approx(max(reach, 0.01) * 1.1)] * 2
    from pope_fast.readout.report.figures import delta_reach

    # each alone would have drawn its own scale
    assert delta_reach([drawn[0]]) != delta_reach([drawn[1]])
    own = {p.parent.name: json.loads(p.read_text())
           for p in sorted(out.glob("compare-*/delta_f1_vcd_vs_none.json"))}
    combined = json.loads((out / "compare-all" / "delta_f1_legacy_2tok.json").read_text())
    assert combined["readout"] == "legacy_2tok" and len(combined["readouts"]) == 2
    for (label, row), data in zip(combined["splits"]["random"].items(), own.values()):
        assert row == data["splits"]["random"]["legacy_2tok"]
    assert combined["axis_half_width"] == next(iter(own.values()))["axis_half_width"]
    assert len(list((out / "compare-all").glob("*.png"))) \
        == len(next(iter(own.values()))["readouts"])
    _column_layouts_are_legible(out)  # the same report's figures, one column wide
    assert (not list(out.rglob("*.svg"))
            and all(p.name.endswith(".column.pdf") for p in out.rglob("*.pdf")))


@pytest.mark.parametrize("reach", [0.33, 0.0733, 0.8, 1e-3, 0.021])
def test_tick_labels_say_where_their_ticks_are(reach):
    """Each tick label reads as its tick's position: a ΔF1 axis of ±0.33 has ticks 0.15 apart, which
    one decimal labelled -0.2 and 0.2 (a point at -0.067 then looked like -0.09)."""
    from pope_fast.readout.report.figures import new_figure, readable_ticks

    ax = new_figure(300, 200).add_axes((0.1, 0.2, 0.8, 0.7))
    ax.set_xlim(-reach, reach)
    readable_ticks(ax.xaxis, -reach, reach, count=4)
    ticks, labels = ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()]
    assert len(ticks) >= 3 and all(float(label) == pytest.approx(t, abs=1e-12)
                                   for t, label in zip(ticks, labels))


def _legible_at_one_column(fig) -> None:
    """3.3 in wide; every text at least 8 pt, inside the figure, and clear of every other text."""
    from matplotlib.text import Text

    assert fig.get_size_inches()[0] == pytest.approx(3.3, abs=0.01)
    fig.canvas.draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert len(texts) > 5
    extents = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    for t, (text, e) in zip(texts, extents):
        assert t.get_fontsize() >= 8, (text, t.get_fontsize())
        assert (e.x0 >= -0.5 and e.y0 >= -0.5
                and e.x1 <= box.x1 + 0.5 and e.y1 <= box.y1 + 0.5), (text, e)
    # no text drawn over another (a title over a panel's, rows' labels)
    for k, (text, e) in enumerate(extents):
        for other, f in extents[k + 1:]:
            assert (min(e.x1, f.x1) - max(e.x0, f.x0) <= 0.5
                    or min(e.y1, f.y1) - max(e.y0, f.y0) <= 0.5), (text, other)


def _column_layouts_are_legible(out) -> None:
    """Issue 35: every figure of the report (F1, yes-rate, confusion, the paper's two readouts,
    first tokens, the F1 grid, ΔF1 per pair and per readout, the probe's, a benchmark's headline)
    also as `<name>.column.pdf`: 3.3 in wide, nothing under 8 pt, every label inside; the numbers
    are the page figure's (its JSON)."""
    from pope_fast.readout.report import column

    kinds = {"f1": column.f1_intervals, "yes_rate": column.yes_rates, "delta_f1": column.delta_f1,
             "confusion": column.confusion,
             "two_readouts": lambda title, data: column.confusion(title, data, 2),
             "f1_models_readouts_splits": lambda title, data: column.f1_grid(data),
             "first_tokens": column.first_tokens}
    found: dict[str, list] = {kind: [] for kind in kinds}
    for numbers in sorted(out.rglob("*.json")):
        stem = numbers.stem  # a run's figures are named by its split: `<split>_<kind>`
        kind = next((k for k in ("delta_f1", "two_readouts") if stem.startswith(k + "_")), None) \
            or next((k for k in kinds if stem == k or stem.endswith("_" + k)), stem)
        if kind in kinds:  # and each run's f1, yes_rate, confusion
            assert numbers.with_name(numbers.stem + ".column.pdf").is_file(), numbers
            found[kind].append(json.loads(numbers.read_text()))
    # each run's F1, yes-rate and confusion (a pair per section), both pairs' ΔF1 and a ΔF1 figure
    # per readout (rows: the pairs), and the paper's two readouts per run
    assert len(found["f1"]) == len(found["yes_rate"]) == len(found["confusion"]) \
        == len(found["first_tokens"]) >= 4
    assert (len(found["delta_f1"]) == 2 + 12 and found["two_readouts"]
            and len(found["f1_models_readouts_splits"]) == 1)
    drawn = [(kind, found[kind][0]) for kind in kinds] + [("delta_f1", found["delta_f1"][-1])]
    for kind, data in drawn:  # one of each layout drawn again
        fig = kinds[kind]("a title as long as a model's hub id and its split, to wrap: "
                          "llava-hf/llava-1.5-7b-hf, adversarial", data)
        _legible_at_one_column(fig)
        if kind == "f1":
            name, m = next(iter(data["readouts"].items()))
            assert f"{name}  {m['f1']:.3f}" in [t.get_text() for t in fig.axes[0].get_yticklabels()]
    bars = {"bars": [{"name": "string_parse_with_prompt", "value": 1234.5, "factor": 1,
                      "kind": "readout"},
                     {"name": "lmms-eval's rule", "value": 0.75, "factor": 100, "kind": "rule"}],
            "metric": "MME perception score (sum of the subtasks' acc + acc+)", "scale": 2000}
    _legible_at_one_column(column.benchmark_bars("MME: perception", bars))
    probe = {"layers": [0, 31], "readouts": {
        "dynamic_single": {"correct": [0.1, 0.2, 0.15, 0.3], "wrong": [0.05, 0.12, 0.2],
                           "cohens_d": 0.42},
        "string_parse_with_prompt": {"correct": [0.11, 0.25], "wrong": [], "cohens_d": None}}}
    _legible_at_one_column(column.attention("llava-1.5-7b-hf, adversarial (n=3000)", probe))
