"""Issue 34: models, tokenizers and question data by hub id. Read from a cache built here in the
hub's layout, or downloaded from a stand-in hub on 127.0.0.1 (tests/hubserver.py); every failure one
line with no run folder left behind; meta.json says which snapshot ran, and a resume on another
snapshot is refused."""
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hubserver import HubServer, Repo
from tinymodels import QUESTIONS, synthetic_image, write_pope_set

from pope_fast.cli import main
from pope_fast.hub import HubError, parse_hub_id
from pope_fast.hub_datasets import _data_missing, _data_patterns

COMMIT = "a" * 40
NEW_COMMIT = "b" * 40


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """A fresh hub cache and no token, read when each command runs; the hub library switched on."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH",
                        str(tmp_path / "hf-home" / "token"))  # none
    return tmp_path / "hf-cache"


def cache_snapshot(cache, repo_id: str, files: dict, commit: str = COMMIT,
                   kind: str = "models") -> None:
    """A snapshot in the hub cache's own layout: blobs by content, the snapshot's files linked to
    them, refs/main."""
    root = cache / f"{kind}--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    for rel, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, (snapshot / rel).parent), snapshot / rel)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)


def folder_files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def error_line(result) -> str:
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    return line


@pytest.fixture
def pope(tmp_path):
    images, [questions] = write_pope_set(tmp_path / "pope", n_images=2, splits=("random",),
                                         questions_per_image=2)
    return images, questions


def records(out) -> list[dict]:
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().split("\n") if line]
    return sorted(rows, key=lambda r: (r["split"], str(r["question_id"])))


# --- parsing: ids, a dataset card's configs, numbered shards --------------------------------------

def test_hub_ids_parse_with_and_without_a_revision():
    assert parse_hub_id("llava-hf/llava-1.5-7b-hf") == ("llava-hf/llava-1.5-7b-hf", None)
    assert parse_hub_id("Qwen/Qwen2-VL-7B-Instruct@v1.0") == ("Qwen/Qwen2-VL-7B-Instruct", "v1.0")
    assert parse_hub_id("org/name@" + COMMIT) == ("org/name", COMMIT)
    for not_an_id in ("name", "a/b/c", "/abs/path", "./x/y", "org/name@", "org/na me"):
        assert parse_hub_id(not_an_id) is None, not_an_id


POPE_CARD = """---
configs:
- config_name: Full
  data_files:
  - split: adversarial
    path: Full/adversarial-*
  - split: popular
    path: Full/popular-*
- config_name: default
  data_files:
  - split: test
    path: data/test-*
---
# POPE
"""


def test_a_cards_configs_choose_the_data_files(tmp_path):
    card = tmp_path / "README.md"
    card.write_text(POPE_CARD)
    assert _data_patterns(card, "x", None, None) == ("data/test-*",)
    assert _data_patterns(card, "x", "Full", None) == ("Full/adversarial-*", "Full/popular-*")
    assert _data_patterns(card, "x", "Full", "popular") == ("Full/popular-*",)
    with pytest.raises(HubError, match=r"--subset Fulll: no such subset; it has Full, default"):
        _data_patterns(card, "x", "Fulll", None)
    with pytest.raises(HubError,
                       match=r"--split random: subset Full has splits adversarial, popular"):
        _data_patterns(card, "x", "Full", "random")
    card.write_text(POPE_CARD.replace("- config_name: default", "- config_name: other"))
    with pytest.raises(HubError, match="several subsets \\(Full, other\\); name one with --subset"):
        _data_patterns(card, "x", None, None)
    assert _data_patterns(tmp_path / "absent.md", "x", None, None) == ("*.parquet", "**/*.parquet")


def test_a_split_with_a_numbered_shard_missing_is_incomplete(tmp_path):
    (tmp_path / "data").mkdir()
    for i in (0, 2):
        (tmp_path / "data" / f"test-0000{i}-of-00003.parquet").write_bytes(b"x")
    assert _data_missing(tmp_path, ("data/test-*",)) == "data/test-00001-of-00003.parquet"
    (tmp_path / "data" / "test-00001-of-00003.parquet").write_bytes(b"x")
    assert _data_missing(tmp_path, ("data/test-*",)) is None
    assert _data_missing(tmp_path, ("Full/*",)).startswith("data files")


# --- one line each, nothing left behind -----------------------------------------------------------

def test_offline_and_not_cached_is_one_line(hub_env, pope, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    images, questions = pope
    out = tmp_path / "out"
    line = error_line(run("eval", "--model", "org/absent", "--questions", questions, "--images",
                          images, "--out", out))
    assert line == (f"Error: --model org/absent: not in the local cache ({hub_env}) and "
                    "HF_HUB_OFFLINE is set; unset it to download, or give a local folder")

    assert not out.exists()


def test_neither_a_folder_nor_a_hub_id(hub_env, pope, tmp_path):
    images, questions = pope
    line = error_line(run("eval", "--model", tmp_path / "no" / "such" / "ckpt", "--questions",
                          questions, "--images", images, "--out", tmp_path / "out"))
    assert line.endswith("/no/such/ckpt: no such checkpoint folder, nor a hub id (ORG/NAME or "
                         "ORG/NAME@REVISION)"), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["gated", "revision", "missing"])
def test_hub_refusals_are_one_line(case, hub_env, pope, tmp_path):
    images, questions = pope
    spec = {"gated": "org/gated", "revision": "org/open@v9", "missing": "org/nothing"}[case]
    repos = {("model", "org/gated"): Repo({"config.json": b"{}"}, gated=True),
             ("model", "org/open"): Repo({"config.json": b"{}"})}
    with HubServer(repos) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            line = error_line(run("eval", "--model", spec, "--questions", questions, "--images",
                                  images, "--out", tmp_path / "out"))
        finally:
            del os.environ["HF_ENDPOINT"]
    expected = {
        "gated": "Error: --model org/gated: a gated repository: accept its terms at "
                 "https://huggingface.co/org/gated, then log in with `hf auth login` (or set "
                 "HF_TOKEN)",
        "revision": "Error: --model org/open@v9: no such revision (a branch, tag or commit of the "
                    "repository)",
        "missing": "Error: --model org/nothing: no local folder of that name, and no such model "
                   "repository on the hub (or a private one: check the id, or log in with `hf auth "
                   "login` (or set HF_TOKEN))",
    }[case]
    assert line == expected
    assert not (tmp_path / "out").exists()
    assert not list(hub_env.glob("models--*/snapshots/*/*"))  # nothing a later load could read


def test_a_tokenizer_by_hub_id_from_the_cache_offline(hub_env, shared, monkeypatch):
    """audit-tokens reads the cached snapshot with the hub switched off; the folder gives the same
    audit."""
    folder = shared / "tokenizers" / "llama2" / "llava-1.5-7b-hf"
    cache_snapshot(hub_env, "llava-hf/llava-1.5-7b-hf", folder_files(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    by_id = run("audit-tokens", "--tokenizer", "llava-hf/llava-1.5-7b-hf", "--format", "json")
    by_folder = run("audit-tokens", "--tokenizer", folder, "--format", "json")
    assert by_id.exit_code == 0, by_id.output
    audit_by_id, audit_by_folder = json.loads(by_id.output), json.loads(by_folder.output)
    assert audit_by_id["tokenizer"].pop("name_or_path").endswith(f"/snapshots/{COMMIT}")
    audit_by_folder["tokenizer"].pop("name_or_path")
    assert audit_by_id == audit_by_folder and audit_by_id["readouts"]


# --- end to end: a tiny LLaVA by hub id -----------------------------------------------------------

@pytest.mark.slow  # eval on the registry's tiny LLaVA, three times
def test_eval_from_the_cache_offline_equals_the_folder(hub_env, tiny, pope, tmp_path, monkeypatch):
    ckpt = tiny.checkpoint("llava")
    cache_snapshot(hub_env, "org/tiny-llava", folder_files(ckpt))
    images, questions = pope
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    by_id, by_folder = tmp_path / "by_id", tmp_path / "by_folder"
    for model, out in (("org/tiny-llava", by_id), (ckpt, by_folder)):
        result = run("eval", "--model", model, "--questions", questions, "--images", images,
                     "--out", out, "--device", "cpu")
        assert result.exit_code == 0, result.output
    strip = ("elapsed_s",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in records(by_id)] == \
        [{k: v for k, v in r.items() if k not in strip} for r in records(by_folder)]
    meta = json.loads((by_id / "meta.json").read_text())
    assert meta["hub"] == {"model": {"id": "org/tiny-llava", "revision": "main", "commit": COMMIT}}
    assert (meta["model"]["files"]
            == json.loads((by_folder / "meta.json").read_text())["model"]["files"])
    assert "hub" not in json.loads((by_folder / "meta.json").read_text())


@pytest.mark.slow  # downloads and runs the tiny LLaVA
def test_download_then_a_moved_branch_is_refused_on_resume(hub_env, tiny, pope, tmp_path):
    from huggingface_hub import snapshot_download

    ckpt = tiny.checkpoint("llava")
    files = {**folder_files(ckpt), "original/consolidated.pth": b"not read by a load",
             "README.md": b"card"}
    repo = Repo(files, commit=COMMIT)
    images, questions = pope
    out = tmp_path / "out"
    with HubServer({("model", "org/tiny-llava"): repo}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            first = run("eval", "--model", "org/tiny-llava", "--questions", questions, "--images",
                        images, "--out", out, "--device", "cpu", "--limit", "2")
            assert first.exit_code == 0, first.output
            fetched = {path.split("/resolve/")[1].split("/", 1)[1]
                       for method, path, _ in hub.requests
                       if method == "GET" and "/resolve/" in path}
            # weights, config, tokenizer; no README, no original/
            assert fetched == set(folder_files(ckpt))
            assert json.loads((out / "meta.json").read_text())["hub"]["model"]["commit"] == COMMIT
            # another tool updates the cache to a new commit of main (same files but one)
            repo.commit, repo.files["config.json"] = NEW_COMMIT, files["config.json"] + b"\n"
            snapshot_download("org/tiny-llava", cache_dir=hub_env, endpoint=hub.url)
            hub.requests.clear()
            line = error_line(run("eval", "--model", "org/tiny-llava", "--questions", questions,
                                  "--images", images, "--out", out, "--device", "cpu"))
            assert not hub.requests  # the cache answered: the snapshot of refs/main was complete
        finally:
            del os.environ["HF_ENDPOINT"]
    assert line == (f"Error: {out / 'meta.json'}: its records come from org/tiny-llava at commit "
                    f"{COMMIT[:12]}, but org/tiny-llava@main is commit {NEW_COMMIT[:12]} now; "
                    f"resume with --model org/tiny-llava@{COMMIT}, or choose a new --out")
    resumed = run("eval", "--model", f"org/tiny-llava@{COMMIT}", "--questions", questions,
                  "--images", images, "--out", out, "--device", "cpu")
    assert resumed.exit_code == 0, resumed.output
    assert "resumed: 2 of 4 questions were already recorded" in resumed.output


@pytest.mark.slow  # the hub library retries a cut-off download five times, a second apart
def test_a_cut_off_download_is_one_line_and_the_next_run_finishes_it(hub_env, tiny, pope, tmp_path):
    ckpt = tiny.checkpoint("llava")
    files = folder_files(ckpt)
    weights = next(name for name in files if name.endswith(".safetensors"))
    repo = Repo(files, cut={weights: len(files[weights]) // 3})
    images, questions = pope
    out = tmp_path / "out"
    args = ("eval", "--model", "org/tiny-llava", "--questions", questions, "--images", images,
            "--out", out, "--device", "cpu", "--limit", "1")
    with HubServer({("model", "org/tiny-llava"): repo}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            line = error_line(run(*args))
            assert not out.exists()
            # no partial file
            assert not list(hub_env.glob(f"models--org--tiny-llava/snapshots/*/{weights}"))
            repo.cut.clear()
            result = run(*args)
        finally:
            del os.environ["HF_ENDPOINT"]
    assert (line.startswith("Error: --model org/tiny-llava: the download stopped (")
            and line.endswith("run the same command again to finish it (whole files are kept in "
                              "the cache; a cut-off one is never read)"))

    assert result.exit_code == 0, result.output
    [snapshot] = hub_env.glob("models--org--tiny-llava/snapshots/*")
    assert folder_files(snapshot) == files


@pytest.mark.slow  # loads the family check of a checkpoint through the hub
def test_a_family_the_engine_lacks_is_one_line(hub_env, pope, tmp_path):
    config = json.dumps({"model_type": "paligemma",
                         "architectures": ["PaliGemmaForConditionalGeneration"]})
    cache_snapshot(hub_env, "google/paligemma-tiny",
                   {"config.json": config.encode(), "model.safetensors": b"x"})
    images, questions = pope
    eval_ = ["eval", "--model", "google/paligemma-tiny", "--questions", questions, "--images",
             images, "--out", tmp_path / "out"]
    line = error_line(run(*eval_, "--backend", "engine"))
    assert "paligemma" in line and "not supported" in line, line
    assert not (tmp_path / "out").exists()
    # on transformers' class (auto), the snapshot's broken weights file is named in one line too:
    # the loading contract reads every stored tensor before transformers does
    line = error_line(run(*eval_))
    assert line.endswith("/model.safetensors: unreadable safetensors file (Error while "
                         "deserializing header: header too small)") \
        and "google--paligemma-tiny" in line, line

    assert not (tmp_path / "out").exists()


# --- question data by hub id ----------------------------------------------------------------------

def _pope_parquet(split: str, n_images: int = 2) -> bytes:
    rows = []
    for i in range(n_images):
        buf = io.BytesIO()
        synthetic_image(i, (48, 40)).save(buf, format="PNG")
        for j in range(2):
            rows.append({"question_id": str(i * 2 + j + 1),
                         "question": QUESTIONS[(i + j) % len(QUESTIONS)],
                         "answer": "yes" if j == 0 else "no", "image_source": f"COCO_{i}.jpg",
                         "image": {"bytes": buf.getvalue(), "path": None}, "category": split})
    table = pa.table({k: [r[k] for r in rows] for k in rows[0]})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


@pytest.mark.slow  # eval on the registry's tiny LLaVA
def test_questions_by_hub_id_need_no_images_folder(hub_env, tiny, tmp_path):
    files = {"README.md": POPE_CARD.encode(),
             "data/test-00000-of-00001.parquet": _pope_parquet("random"),
             "Full/adversarial-00000-of-00001.parquet": _pope_parquet("adversarial"),
             "Full/popular-00000-of-00001.parquet": _pope_parquet("popular")}
    out = tmp_path / "out"
    with HubServer({("dataset", "lmms-lab/POPE"): Repo(files)}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            refused = run("eval", "--model", tiny.checkpoint("llava"), "--questions",
                          "lmms-lab/POPE", "--subset", "Fulll", "--out", out)
            result = run("eval", "--model", tiny.checkpoint("llava"), "--questions",
                         "lmms-lab/POPE", "--subset", "Full", "--split", "popular", "--out", out,
                         "--device", "cpu")
        finally:
            del os.environ["HF_ENDPOINT"]
    assert error_line(refused) == ("Error: --questions lmms-lab/POPE: --subset Fulll: no such "
                                   "subset; it has Full, default")
    assert result.exit_code == 0, result.output
    fetched = sorted(path.rsplit("/", 1)[1] for method, path, _ in hub.requests
                     if method == "GET" and "/resolve/" in path)
    assert fetched == ["README.md", "popular-00000-of-00001.parquet"]
    assert {r["split"] for r in records(out)} == {"popular"} and len(records(out)) == 4
    meta = json.loads((out / "meta.json").read_text())
    assert meta["hub"] == {"questions": [{"id": "lmms-lab/POPE", "revision": "main",
                                          "commit": Repo({}).commit, "type": "dataset"}]}
    shutil.rmtree(out)


def test_a_local_folder_wins_over_the_hub_id_it_spells(hub_env, tmp_path, monkeypatch):
    from pope_fast.hub import local_or_hub

    cache_snapshot(hub_env, "org/name", {"config.json": b"{}", "model.safetensors": b"x"})
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert local_or_hub("org/name", "--model") == (Path("org/name"), None)
    # no such folder: the cached snapshot
    folder, snapshot = local_or_hub("org/name@main", "--model")
    assert (folder == hub_env / "models--org--name" / "snapshots" / COMMIT
            and snapshot.commit == COMMIT)


def test_bench_takes_hub_ids_for_its_checkpoints_and_tokenizer(hub_env, shared, monkeypatch):
    from pope_fast.bench import BenchConfig

    cache_snapshot(hub_env, "org/ckpt", {"config.json": b"{}", "model.safetensors": b"x"})
    cache_snapshot(hub_env, "org/tok",
                   folder_files(shared / "tokenizers" / "llama2" / "llava-1.5-7b-hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = BenchConfig.from_options(
        models="llava", model_dirs=["llava=org/ckpt"], size=None, n_questions=6, pope_dir=None,
        device="cpu", quant=None, dtype=None, batch_size=8, probe="none", method_specs=(),
        no_reference=True, repeat=1, reference_sample=None, tokenizer_dir="org/tok", work_dir=None,
        shard=None)
    assert config.model_dirs == {"llava": hub_env / "models--org--ckpt" / "snapshots" / COMMIT}
    assert config.tokenizer_dir == hub_env / "models--org--tok" / "snapshots" / COMMIT


def test_mme_by_hub_id_reads_as_its_parquet(hub_env, shared):
    from pope_fast.hub_datasets import resolve_inputs
    from pope_fast.readout.benchmarks import benchmark_questions

    local = sorted((shared / "benchmarks" / "mme_synthetic").glob("**/*.parquet"))
    card = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: test\n"
            "    path: data/test-*\n---\n")
    files = {"README.md": card.encode(),
             **{f"data/test-{i:05d}-of-{len(local):05d}.parquet": p.read_bytes()
                for i, p in enumerate(local)}}
    with HubServer({("dataset", "lmms-lab/MME"): Repo(files)}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            inputs = resolve_inputs(None, ("lmms-lab/MME",))
        finally:
            del os.environ["HF_ENDPOINT"]
    assert inputs.sources == {"questions": [{"id": "lmms-lab/MME", "revision": "main",
                                             "commit": Repo({}).commit, "type": "dataset"}]}
    name, questions = benchmark_questions(list(inputs.question_files))
    _, expected = benchmark_questions([str(p) for p in local])
    assert name == "mme" and len(questions) == len(expected) > 0
    assert ([(q.question_id, q.text, q.label) for q in questions]
            == [(q.question_id, q.text, q.label) for q in expected])


# --- issue 49: a revision is a branch, tag or commit name, never a path ---------------------------

@pytest.mark.parametrize("revision",
                         ["../../../outside", "v1/../../x", "..", ".hidden", "a//b", "x.lock"])
def test_a_revision_that_is_no_ref_name_is_refused_before_the_hub_is_asked(revision, hub_env,
                                                                           tmp_path):
    from pope_fast.hub import local_or_hub

    repo = Repo({"config.json": b"{}", "model.safetensors": b"x"}, refs=("main", revision))
    with HubServer({("model", "org/tiny"): repo}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            with pytest.raises(HubError) as refused:
                local_or_hub(f"org/tiny@{revision}", "--model")
        finally:
            del os.environ["HF_ENDPOINT"]
    assert str(refused.value) == (f"--model org/tiny@{revision}: revision {revision!r} is not a "
                                  "branch, tag or commit name (its parts are never empty, never "
                                  "begin with '.', never end with '.lock' and hold no '..')")
    assert not hub.requests
    assert not list(tmp_path.iterdir())  # nothing written, in the cache or beside it


def test_the_ref_names_the_hub_gives_are_revisions():
    from pope_fast.hub import revision_fault

    for revision in ("main", "v1.0", "refs/pr/12", "release/2024.1_b-2", COMMIT):
        assert revision_fault(revision) is None, revision
    for revision in ("a/", "/a", "a/./b", "v1.", "refs/pr/..", "x..y"):
        assert revision_fault(revision), revision


# --- issue 48: every field read from a hub file is checked where it enters ------------------------

@pytest.mark.parametrize("header, fault", [
    ("- a\n- b\n", "its YAML header is not a mapping of fields"),
    ("configs: default\n", "configs 'default' is not a list of subsets"),
    ("configs:\n- 3\n", "configs[0] 3 is not a mapping (config_name, data_files)"),
    ("configs:\n- config_name: [a]\n  data_files: x/*\n",
     "configs[0].config_name ['a'] is not a name"),
    ("configs:\n- config_name: a\n  data_files: x/*\n- config_name: a\n  data_files: y/*\n",
     "configs[1].config_name 'a' names a subset declared before"),
    ("configs:\n- config_name: a\n  data_files: 7\n",
     "configs[0].data_files 7 is not a path pattern, a list of them or of splits (split, path)"),
    ("configs:\n- config_name: a\n  data_files:\n  - split: null\n    path: x/*\n",
     "configs[0].data_files[0].split None is not a split name"),
    ("configs:\n- config_name: a\n  data_files:\n  - split: [t]\n    path: x/*\n",
     "configs[0].data_files[0].split ['t'] is not a split name"),
    ("configs:\n- config_name: a\n  data_files:\n  - split: test\n",
     "configs[0].data_files[0].path None is not a path pattern or a list of them"),
    ("configs:\n- config_name: a\n  data_files:\n  - split: test\n    path: [x/*, 5]\n",
     "configs[0].data_files[0].path ['x/*', 5] is not a path pattern or a list of them"),
    ("configs:\n- config_name: a\n  data_files:\n  - [x/*]\n",
     "configs[0].data_files[0] ['x/*'] is not a path pattern or a split (split, path)"),
], ids=["header-list", "configs-str", "config-int", "name-list", "name-twice", "files-int",
        "split-null", "split-list", "path-absent", "path-int", "entry-list"])
def test_a_card_of_another_shape_is_named_by_its_field(header, fault, tmp_path):
    card = tmp_path / "README.md"
    card.write_text(f"---\n{header}---\n# card\n")
    with pytest.raises(HubError) as refused:
        _data_patterns(card, "--questions org/data", None, None)
    assert str(refused.value) == f"{card}: {fault}"


def test_a_cards_split_names_and_data_files_read_as_the_datasets_library_reads_them(tmp_path):
    card = tmp_path / "README.md"
    card.write_text("---\nconfigs:\n- config_name: a\n  data_files:\n  - split: 2023\n"
                    "    path: y/*\n- config_name: b\n  data_files:\n    test: t/*\n"
                    "    dev: [d/1-*, d/2-*]\n---\n")

    assert _data_patterns(card, "x", "a", "2023") == ("y/*",)
    assert _data_patterns(card, "x", "b", None) == ("t/*", "d/1-*", "d/2-*")
    assert _data_patterns(card, "x", "b", "dev") == ("d/1-*", "d/2-*")


@pytest.mark.parametrize("index, fault", [
    ('{"metadata": {}}', "weight_map is not an object of tensor names to file names (found None)"),
    ('{"weight_map": ["model-00001-of-00002.safetensors"]}',
     "weight_map is not an object of tensor names to file names (found list)"),
    ('{"weight_map": {"a.weight": 3}}', "weight_map['a.weight'] 3 is not a file name"),
    ('{"weight_map": {}}', "weight_map names no weights file"),
    ('{"weight_map": {"a": ', ":1: malformed JSON: Expecting value"),
    ('[1]', "expected a JSON object, found list"),
], ids=["no-map", "map-list", "file-int", "map-empty", "malformed", "array"])
def test_a_shard_index_of_another_shape_is_named_by_its_field(index, fault, hub_env, monkeypatch):
    from pope_fast.hub import local_or_hub

    cache_snapshot(hub_env, "org/sharded",
                   {"config.json": b"{}", "model.safetensors.index.json": index.encode(),
                    "model-00001-of-00002.safetensors": b"x"})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as refused:
        local_or_hub("org/sharded", "--model")
    folder = hub_env / "models--org--sharded" / "snapshots" / COMMIT
    index = folder / "model.safetensors.index.json"
    assert str(refused.value) == (f"{index}{fault}" if fault.startswith(":")
                                  else f"{index}: {fault}")


# --- issue 48: a hub that cannot be reached, a revision the cache lacks ---------------------------

@pytest.fixture
def unreachable(monkeypatch):
    """HF_ENDPOINT at a port of 127.0.0.1 where nothing listens (connections refused at once)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    return url


def test_a_hub_that_cannot_be_reached_is_named_so(hub_env, unreachable):
    from pope_fast.hub import local_or_hub

    with pytest.raises(HubError) as refused:
        local_or_hub("org/absent", "--model")
    message = str(refused.value)
    assert message.startswith(f"--model org/absent: not in the local cache ({hub_env}), and the "
                              f"hub cannot be reached at {unreachable} (ConnectError: "), message
    assert message.endswith("); check the network or HF_ENDPOINT (HF_HUB_OFFLINE=1 reads the cache "
                            "alone)"), message
    assert "run the same command again" not in message


def test_a_revision_the_cache_lacks_is_named(hub_env, unreachable, monkeypatch):
    from pope_fast.hub import local_or_hub

    cache_snapshot(hub_env, "org/name", {"config.json": b"{}", "model.safetensors": b"x"})
    with pytest.raises(HubError) as refused:
        local_or_hub("org/name@v2", "--model")
    assert str(refused.value).startswith(f"--model org/name@v2: revision v2 is not in the local "
                                         f"cache ({hub_env}; it holds main at {COMMIT[:12]}), and "
                                         f"the hub cannot be reached at ")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as refused:
        local_or_hub("org/name@v2", "--model")
    assert str(refused.value) == (f"--model org/name@v2: revision v2 is not in the local cache "
                                  f"({hub_env}; it holds main at {COMMIT[:12]}) and HF_HUB_OFFLINE "
                                  "is set; unset it to download, or give a local folder")


# --- issue 48: a download is the file the hub announced, or it is not read ------------------------

@pytest.mark.parametrize("corrupt", ["model.safetensors", "config.json"])
def test_a_download_whose_bytes_are_not_the_hubs_is_refused_and_removed(corrupt, hub_env, pope,
                                                                        tmp_path):
    """The hub states each file's hash (an LFS file's sha256, a git file's blob id); a stand-in
    serving other bytes of the same length (the last 100 zeroed) is refused naming the file, and the
    next run downloads it again."""
    from pope_fast.hub import local_or_hub

    files = {"config.json": b'{"model_type": "llava"}' + b" " * 200,
             "model.safetensors": os.urandom(4000)}
    repo = Repo(files, served={corrupt: files[corrupt][:-100] + bytes(100)})
    images, questions = pope
    with HubServer({("model", "org/tiny"): repo}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            line = error_line(run("eval", "--model", "org/tiny", "--questions", questions,
                                  "--images", images, "--out", tmp_path / "out"))
            cached = sorted(p.name for p in hub_env.glob("models--org--tiny/snapshots/*/*"))
            blobs = {p.name: p.stat().st_size for p in hub_env.glob("models--org--tiny/blobs/*")}
            repo.served.clear()
            folder, _ = local_or_hub("org/tiny", "--model")
        finally:
            del os.environ["HF_ENDPOINT"]
    algorithm = "sha256" if corrupt.endswith(".safetensors") else "git blob id"
    expected = hashlib.sha256(files[corrupt]).hexdigest() if corrupt.endswith(".safetensors") else \
        hashlib.sha1(b"blob %d\0" % len(files[corrupt]) + files[corrupt]).hexdigest()
    assert line.startswith(f"Error: --model org/tiny: {corrupt} as downloaded is not the file the "
                           f"hub announced (its {algorithm} is "), line
    assert line.endswith(f", the hub's {expected}); it is removed from the cache: run the same "
                         "command again to download it again"), line

    assert not (tmp_path / "out").exists()
    # the other file's, kept
    assert corrupt not in cached and expected not in blobs and len(blobs) == 1
    assert folder_files(folder) == files  # downloaded again, whole


def test_a_cached_part_while_the_hub_cannot_be_reached_is_not_called_the_repositorys_all(
        hub_env, unreachable):
    """The hub library hands back a cached snapshot that lacks files when the hub does not answer:
    the line says the hub cannot be reached, not that the repository lacks them; a hub that answers
    without them says that."""
    from pope_fast.hub import local_or_hub

    cache_snapshot(hub_env, "org/name", {"config.json": b"{}"})
    with pytest.raises(HubError) as refused:
        local_or_hub("org/name", "--model")
    assert str(refused.value).startswith(f"--model org/name: its cached snapshot lacks weights "
                                         f"({hub_env}), and the hub cannot be reached at "
                                         f"{unreachable} (ConnectError: "), str(refused.value)
    with HubServer({("model", "org/name"): Repo({"config.json": b"{}"}, commit=COMMIT)}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        with pytest.raises(HubError) as refused:
            local_or_hub("org/name", "--model")
    assert str(refused.value) == ("--model org/name: the repository has no weights (is it a model "
                                  "repository of the layout pope-fast reads?)")
