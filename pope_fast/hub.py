"""Checkpoints, tokenizers and question data named by hub id (`ORG/NAME[@REVISION]`), as lmms-eval
and VLMEvalKit users name them: read from the Hugging Face cache when the snapshot is there, else
downloaded through huggingface_hub (only the files a load reads, with the hub's own progress bars),
never when HF_HUB_OFFLINE is set. A local folder of the same name wins. What ran is a `Snapshot`:
the id, the revision asked and the commit it resolved to, which meta.json records and a resume
checks. A dataset's cards and data files are hub_datasets'.

Every failure is a HubError (a ValueError): one line naming the id and what to do. The hub library
writes a file under a temporary name and renames it when whole, so a download cut off leaves
nothing a load could read.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .hub_hashes import first_mismatch
from .readout.data import read_json_object

# `org/name` or `org/name@revision`: the hub's repo-id characters; a revision is a branch, tag or
# commit
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)"
                    r"(?:@(?P<revision>[\w./-]+))?$")
# What a load reads: config, tokenizer, processor and chat-template files, and the safetensors
# weights (PyTorch .bin shards are fetched only for a checkpoint that has no safetensors).
TOKENIZER_FILES = ("*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken")
MODEL_FILES = (*TOKENIZER_FILES, "*.safetensors")
BIN_FILES = ("pytorch_model*.bin",)
OFFLINE_VALUES = ("1", "on", "yes", "true")  # huggingface_hub's reading of HF_HUB_OFFLINE
# A ref name's parts as git and the hub allow them (git check-ref-format): the hub library writes
# a revision to refs/<revision> in the cache, so a part ".." would write outside it
REF_PART = re.compile(r"^(?!\.)(?!.*\.\.)[\w.-]+(?<!\.lock)$")


class HubError(ValueError):
    """A hub id that cannot be read; the message is the one line a command ends with."""


@dataclass(frozen=True)
class Snapshot:
    """A repository at one commit in the local cache."""

    folder: Path
    repo_id: str
    revision: str | None  # as asked; None: the default branch
    commit: str
    repo_type: str = "model"

    def to_json(self) -> dict:
        return {"id": self.repo_id, "revision": self.revision or "main", "commit": self.commit,
                **({"type": self.repo_type} if self.repo_type != "model" else {})}


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) of `ORG/NAME[@REVISION]`, or None for anything else."""
    match = HUB_ID.match(text)
    return (match["repo"], match["revision"]) if match else None


def revision_fault(revision: str) -> str | None:
    """Why `revision` is no branch, tag or commit name the hub could hold, or None."""
    if all(REF_PART.match(part) for part in revision.split("/")) and not revision.endswith("."):
        return None
    return (f"revision {revision!r} is not a branch, tag or commit name (its parts are never "
            "empty, never begin with '.', never end with '.lock' and hold no '..')")


def offline() -> str | None:
    """The variable that switches the hub off (HF_HUB_OFFLINE, or transformers'
    TRANSFORMERS_OFFLINE), or None."""
    return next((name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
                 if os.environ.get(name, "").strip().lower() in OFFLINE_VALUES), None)


def cache_dir() -> Path:
    """The hub cache as huggingface_hub finds it, read now (not when the library was imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") \
        or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def local_or_hub(spec: str, option: str, files: tuple[str, ...] = MODEL_FILES
                 ) -> tuple[Path, Snapshot | None]:
    """The folder `spec` names: a local path as it is, else the snapshot of a hub id (its
    `files`)."""
    path = Path(spec).expanduser()
    if path.exists():
        return path, None
    kind = "tokenizer" if files == TOKENIZER_FILES else "checkpoint"
    parsed = parse_hub_id(spec)
    if parsed is None:
        raise HubError(f"{option} {spec}: no such {kind} folder, nor a hub id (ORG/NAME or "
                       "ORG/NAME@REVISION)")
    snapshot = fetch(*parsed, "model", files,
                     _model_missing if kind == "checkpoint" else _tokenizer_missing, option)
    if kind == "checkpoint" and _model_missing(snapshot.folder) == "weights" and not offline():
        snapshot = fetch(*parsed, "model", (*files, *BIN_FILES), _model_missing, option)
    return snapshot.folder, snapshot


def fetch(repo_id: str, revision: str | None, repo_type: str, files: tuple[str, ...], missing,
          option: str, required: bool = True) -> Snapshot:
    """The snapshot of `repo_id` at `revision` holding `files` (patterns): the cached one when
    `missing(folder)` finds nothing missing in it, else downloaded (HubError when offline, or when
    the download still lacks what `missing` names and the files are `required`)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    name = repo_id + (f"@{revision}" if revision else "")
    if revision is not None and revision_fault(revision):
        raise HubError(f"{option} {name}: {revision_fault(revision)}")
    common = dict(repo_id=repo_id, revision=revision, repo_type=repo_type, cache_dir=cache_dir(),
                  allow_patterns=list(files))
    try:
        folder = Path(snapshot_download(**common, local_files_only=True))
        absent = missing(folder)
    except LocalEntryNotFoundError:
        folder, absent = None, None
    if folder is not None and (absent is None or (not required and offline())):
        return Snapshot(folder, repo_id, revision, folder.name, repo_type)
    reason = _uncached(repo_id, revision, repo_type) if folder is None else \
        f"its cached snapshot lacks {absent} ({cache_dir()})"
    if offline():
        raise HubError(f"{option} {name}: {reason} and {offline()} is set; unset it to download, "
                       "or give a local folder")
    try:
        folder = Path(snapshot_download(**common, endpoint=os.environ.get("HF_ENDPOINT") or None))
    # the hub library's and its HTTP client's errors, each said in one line
    except Exception as err:  # noqa: BLE001
        raise HubError(f"{option} {name}: "
                       f"{_download_failure(err, repo_id, repo_type, reason)}") from None
    bad = first_mismatch(matching_files(folder, files))
    if bad is not None:
        bad.remove()
        raise HubError(f"{option} {name}: {bad.link.relative_to(folder)} as downloaded is not the "
                       f"file the hub announced (its {bad.algorithm} is {bad.actual}, the hub's "
                       f"{bad.expected}); it is removed from the cache: run the same command again "
                       "to download it again")
    absent = missing(folder)
    if absent is not None and required:
        # the hub library returns a cached part when it is
        unreached = _unreached(repo_id, revision, repo_type)
        if unreached is not None:
            raise HubError(f"{option} {name}: {_no_answer(unreached, reason)}")
        raise HubError(f"{option} {name}: the repository has no {absent} (is it a {repo_type} "
                       "repository of the layout pope-fast reads?)")
    return Snapshot(folder, repo_id, revision, folder.name, repo_type)


def _unreached(repo_id: str, revision: str | None, repo_type: str) -> Exception | None:
    """The HTTP client's error where the hub gives no answer at all to a question about the
    repository, else None."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).repo_info(
            repo_id, revision=revision or "main", repo_type=repo_type)
    except HfHubHTTPError:  # an answer, whatever it says
        return None
    # the HTTP client's errors: no connection, no answer in time
    except Exception as err:  # noqa: BLE001
        return err
    return None


def _uncached(repo_id: str, revision: str | None, repo_type: str) -> str:
    """Why the cache holds no snapshot of `repo_id` at `revision`, in words naming what it holds
    instead."""
    # the hub library's repo_folder_name
    root = cache_dir() / f"{repo_type}s--{repo_id.replace('/', '--')}"
    if not root.is_dir():
        return f"not in the local cache ({cache_dir()})"
    wanted = revision or "main"
    refs = {p.relative_to(root / "refs").as_posix(): p.read_text().strip()
            for p in (root / "refs").rglob("*") if p.is_file()}
    snapshots = root / "snapshots"
    if (snapshots / refs.get(wanted, wanted)).is_dir():
        return (f"its cached snapshot of {wanted} is incomplete "
                f"({snapshots / refs.get(wanted, wanted)})")
    held = [f"{ref} at {commit[:12]}" for ref, commit in sorted(refs.items())]
    # commits no ref names
    held = held or sorted(p.name[:12] for p in snapshots.glob("*") if p.is_dir())
    return (f"revision {wanted} is not in the local cache ({cache_dir()}; it holds "
            f"{', '.join(held) or 'no snapshot'})")


def _download_failure(err: Exception, repo_id: str, repo_type: str, uncached: str) -> str:
    """What went wrong with a download, and what to do, in words (`uncached`: why the cache could
    not answer)."""
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    page = f"https://huggingface.co/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"
    login = "log in with `hf auth login` (or set HF_TOKEN)"
    if isinstance(err, GatedRepoError):
        return f"a gated repository: accept its terms at {page}, then {login}"
    if isinstance(err, RevisionNotFoundError):
        return "no such revision (a branch, tag or commit of the repository)"
    if isinstance(err, RepositoryNotFoundError):
        return (f"no local folder of that name, and no such {repo_type} repository on the hub "
                f"(or a private one: check the id, or {login})")
    # what the hub library raises when the hub does not answer
    if isinstance(err, LocalEntryNotFoundError):
        return _no_answer(err.__cause__ or err, uncached)
    return (f"the download stopped ({type(err).__name__}: {_first_line(err)}); run the same "
            "command again to finish it (whole files are kept in the cache; a cut-off one is never "
            "read)")


def _no_answer(cause: BaseException, uncached: str) -> str:
    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    return (f"{uncached}, and the hub cannot be reached at {endpoint} "
            f"({type(cause).__name__}: {_first_line(cause)}); check the network or HF_ENDPOINT "
            "(HF_HUB_OFFLINE=1 reads the cache alone)")


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else ""


def _model_missing(folder: Path) -> str | None:
    """The first file a checkpoint load needs that `folder` lacks ("weights" for no weights at
    all), or None."""
    if not (folder / "config.json").is_file():
        return "config.json"
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            return next((shard for shard in _index_shards(folder / index)
                         if not (folder / shard).is_file()), None)
    if any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin")):
        return None
    return "weights"


def _index_shards(index: Path) -> list[str]:
    """The weights files a shard index names (its weight_map's values), in name order."""
    weight_map = read_json_object(index, HubError).get("weight_map")
    if not isinstance(weight_map, dict):
        raise HubError(f"{index}: weight_map is not an object of tensor names to file names "
                       f"(found {type(weight_map).__name__ if weight_map is not None else None})")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise HubError(f"{index}: weight_map[{name!r}] {shard!r} is not a file name")
    if not weight_map:
        raise HubError(f"{index}: weight_map names no weights file")
    return sorted(set(weight_map.values()))


def _tokenizer_missing(folder: Path) -> str | None:
    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
    return None if any((folder / n).is_file() for n in names) else "tokenizer files"


def matching_files(folder: Path, patterns: tuple[str, ...]) -> list[Path]:
    found = [p for p in folder.rglob("*") if p.is_file()
             and any(fnmatch.fnmatch(str(p.relative_to(folder)), pat) for pat in patterns)]
    return sorted(found)
