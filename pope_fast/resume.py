"""What a resumed run must prove before it adds records to a folder: that the folder holds this
run's records (the same checkpoint bytes, method, template, token sets, settings and tokenizer),
that each recorded question is this question (its image name, label and text), asked of the same
image bytes, and that no record of this run's splits comes from another question file."""
from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .engine.inputs.images import embedded_path
from .readout import META_FILE, RECORDS_FILE, Question
from .readout.compare import leaf_differences
from .readout.records import rank_parts, record_key
from .store import RecordWriter

COMPARE_FILE = "compare.json"  # a paired run's comparison of its methods, beside their folders
# Settings that only change how work is batched, never a value; any other difference between the
# run on disk and this one (dtype, quantization, image aspect, kernels, continuation length, ...)
# would mix two runs' records in one folder.
BATCHING_ONLY = ("batch_size", "image_batch")


def _resume_fingerprint(meta: dict) -> dict:
    """What must be equal for two runs' records to share a folder: the checkpoint's files by content
    (not its path), the template, token sets, settings and tokenizer."""
    settings = {k: v for k, v in meta.get("settings", {}).items() if k not in BATCHING_ONLY}
    tokenizer = {k: meta.get("tokenizer", {}).get(k) for k in ("class", "vocab_size")}
    model = meta.get("model") or {}
    method = meta.get("method") or {}  # absent before paired runs: the model as it is
    return {"model": {"family": model.get("family"), "files": model.get("files") or {},
                      # absent before the transformers backend
                      "backend": model.get("backend", "engine")},
            "method": {"name": method.get("name", "none"),
                       "settings": method.get("settings") or {}},
            "template": meta.get("template"), "token_sets": meta.get("token_sets"),
            "settings": settings,
            # the prompt itself: a template's text fixed under the same name (llava_official's
            # system text) is another run; absent before meta.json recorded it
            **({"prompt_example": meta["prompt_example"]} if "prompt_example" in meta else {}),
            # a thinking checkpoint's mode and cap
            **({"thinking": meta["thinking"]} if "thinking" in meta else {}),
            "tokenizer": tokenizer, "generation": meta.get("generation") or {}}


def check_resumable(out_dir: Path, old: dict, meta: dict) -> None:
    """Refuse to add this run's records to a folder that holds another run's, naming what
    differs."""
    if not old:
        return
    _check_snapshot(out_dir, old, meta)
    diffs = leaf_differences(_resume_fingerprint(old), _resume_fingerprint(meta), "recorded", "now")
    if diffs:
        more = f" (and {len(diffs) - 4} more)" if len(diffs) > 4 else ""
        raise ValueError(f"{out_dir / META_FILE}: this folder holds records of a different run "
                         f"({'; '.join(diffs[:4])}{more}); choose a new --out")


def _check_snapshot(out_dir: Path, old: dict, meta: dict) -> None:
    """A run of a hub id resumes on the snapshot it began on: a branch moved since (a new commit of
    `main`) is another checkpoint, even where the files a load reads are the same bytes, and the
    user is told how to pin it."""
    before = (old.get("hub") or {}).get("model") or {}
    now = (meta.get("hub") or {}).get("model") or {}
    if before.get("commit") and now.get("commit") and before["commit"] != now["commit"]:
        raise ValueError(f"{out_dir / META_FILE}: its records come from {before['id']} at commit "
                         f"{before['commit'][:12]}, but {now['id']}@{now['revision']} is commit "
                         f"{now['commit'][:12]} now; resume with --model "
                         f"{before['id']}@{before['commit']}, or choose a new --out")


def check_has_meta(out_dir: Path) -> None:
    """Records without the meta.json that says which run wrote them (deleted, or never copied along)
    cannot be proven to be this run's: refused, rather than mixed with this run's."""
    if (out_dir / META_FILE).exists():
        return
    files = [out_dir / RECORDS_FILE, *rank_parts(out_dir)]
    held = [f for f in files if f.is_file() and f.read_bytes().strip()]
    if held:
        raise ValueError(f"{held[0]}: holds records but {out_dir / META_FILE} is missing, so "
                         "nothing proves they are this run's; restore meta.json or choose a new "
                         "--out")


def check_layout(out_dir: Path, paired: bool) -> None:
    """A plain run's folder holds its records; a paired run's holds a folder per method and
    compare.json. One kind written into the other's folder would sit beside it, and `report` and
    `compare` read the folder as the kind it holds: refused, naming what it holds."""
    if not out_dir.is_dir():
        return
    own = (any((out_dir / name).exists() for name in (META_FILE, RECORDS_FILE))
           or bool(rank_parts(out_dir)))
    held = sorted(f"{f.name}/" for f in out_dir.iterdir()
                  if f.is_dir() and (f / META_FILE).is_file())
    held += [COMPARE_FILE] * (out_dir / COMPARE_FILE).is_file()
    if paired and own:
        raise ValueError(f"{out_dir}: holds a plain run (its {META_FILE} and records); a paired "
                         "run (--method) writes a folder per method and compare.json, which would "
                         "sit beside it unread; choose a new --out")
    if not paired and not own and held:
        raise ValueError(f"{out_dir}: holds a paired run ({', '.join(held)}); a plain run's "
                         "records here would sit beside its method folders and `report` would show "
                         "this run alone; resume it with its --method options, or choose a new "
                         "--out")


def check_done(writer: RecordWriter, questions: list[Question], images_dir: Path | None,
               embedded: dict[str, bytes], workers: int) -> None:
    """A recorded question must be this question, asked of these bytes: the same image name, label
    and text (another question file under the same split name, or an edited one, would otherwise be
    taken as done), and its image (a file, or the bytes a parquet row embeds) must still be the
    bytes it was answered from."""
    _check_strays(writer, questions)
    keys = {q: record_key(q.split, q.key, q.dataset) for q in questions}
    recorded = [(q, writer.done[keys[q]]) for q in questions if keys[q] in writer.done]
    for q, rec in recorded:
        where = f"{writer.path}: question {q.question_id} of split {q.split}"
        # a text-only question has no image
        if "text" not in rec or ("image_sha256" not in rec and q.image):
            raise ValueError(f"{where} was recorded without its question text or image hash (an "
                             "older pope-fast), so resuming cannot prove it is this question; "
                             "choose a new --out")
        for field, now in (("image", q.image), ("label", q.label), ("text", q.text)):
            if rec.get(field) != now:
                raise ValueError(f"{where} was recorded with {field} {rec.get(field)!r}, but the "
                                 f"question file has {now!r}; choose a new --out")
    # the bytes of the questions asked of an image
    recorded = [(q, rec) for q, rec in recorded if q.image]
    names = list(dict.fromkeys(q.image for q, _ in recorded))

    def digest(name):
        if name in embedded:
            return hashlib.sha256(embedded[name]).hexdigest()
        return _image_sha256(images_dir / name) if images_dir is not None else None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = dict(zip(names, pool.map(digest, names)))
    for q, rec in recorded:
        if digests[q.image] != rec["image_sha256"]:
            now = ("missing now" if digests[q.image] is None
                   else f"sha256 {digests[q.image][:12]} now")
            source = (embedded_path(q.image) if q.image in embedded
                      else (images_dir or Path(".")) / q.image)
            raise ValueError(f"{source}: question {q.question_id} of split {q.split} was answered "
                             f"from other bytes (sha256 {rec['image_sha256'][:12]} recorded, "
                             f"{now}); choose a new --out")


def _check_strays(writer: RecordWriter, questions: list[Question]) -> None:
    """Records of this run's splits that its question files lack would be counted in their summaries
    (another question file under the same split name): refused."""
    asked = {record_key(q.split, q.key, q.dataset) for q in questions}
    splits = {(q.dataset, q.split) for q in questions}
    strays = sorted(k for k in writer.recorded if k[:2] in splits and k not in asked)
    if strays:
        raise ValueError(f"{writer.path}: question {strays[0][2]} of split {strays[0][1]} is "
                         f"recorded here but not in this run's question file ({len(strays)} such); "
                         "choose a new --out, or --split for another name")


def question_counts(questions: list[Question]) -> dict[str, int]:
    """meta.json's count of the questions a run asks per split ("dataset/split" where it names one),
    so that scoring can tell a run that stopped part way from one that finished."""
    counts: dict[str, int] = {}
    for q in questions:
        name = f"{q.dataset}/{q.split}" if q.dataset else q.split
        counts[name] = counts.get(name, 0) + 1
    return counts


def held_counts(before: dict | None, held: list[Question], every: list[Question]) -> dict[str, int]:
    """meta.json's questions of a run folder, per split: what it holds of the question file (the
    questions asked and those recorded past --limit), or what an earlier run into it asked where
    that is more (a run that stopped part way stays marked so after a rerun with a smaller --limit),
    never more than the file has. Without a limit, the questions asked."""
    before, whole = before if isinstance(before, dict) else {}, question_counts(every)
    return {name: min(whole[name], max(n, before[name] if isinstance(before.get(name), int) else 0))
            for name, n in question_counts(held).items()}


def _image_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
