"""Question data named by hub dataset id: the data files of a dataset card's config and split (as
its README's `configs:` declares them, else every parquet file), each split's numbered shards
complete, and `eval`'s --model and --questions as local paths (`resolve_inputs`)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .hub import HubError, Snapshot, fetch, local_or_hub, matching_files, parse_hub_id

# a dataset shard's place in its split: test-00000-of-00003.parquet
SHARD = re.compile(r"-(\d+)-of-(\d+)\.")


def dataset_files(spec: str, option: str, subset: str | None = None, split: str | None = None
                  ) -> tuple[list[Path], Snapshot]:
    """The data files of a hub dataset id (a config's splits as its README's `configs:` declares
    them, else every parquet file), from the cache or downloaded, in name order."""
    repo_id, revision = parse_hub_id(spec) or (None, None)
    if repo_id is None:
        raise HubError(f"{option} {spec}: no such file or folder, nor a hub id (ORG/NAME or "
                       "ORG/NAME@REVISION)")
    card = fetch(repo_id, revision, "dataset", ("README.md",), _card_missing, option,
                 required=False)
    patterns = _data_patterns(card.folder / "README.md", f"{option} {spec}", subset, split)
    snapshot = fetch(repo_id, card.commit, "dataset", patterns,
                     lambda f: _data_missing(f, patterns), option)
    snapshot = Snapshot(snapshot.folder, repo_id, revision, snapshot.commit, "dataset")
    return matching_files(snapshot.folder, patterns), snapshot


def _card_missing(folder: Path) -> str | None:
    return None if (folder / "README.md").is_file() else "README.md"


def _data_patterns(card: Path, where: str, subset: str | None, split: str | None
                   ) -> tuple[str, ...]:
    """The data-file patterns of a dataset card's config `subset` (default: the one named
    "default", else the only one) and of its `split` (default: all of its splits)."""
    subsets = _card_configs(card)
    if not subsets:
        if subset or split:
            raise HubError(f"{where}: its card declares no configs or splits, so --subset/--split "
                           "cannot pick one")
        return ("*.parquet", "**/*.parquet")
    names = list(subsets)
    if subset is None:
        subset = "default" if "default" in names else names[0] if len(names) == 1 else None
        if subset is None:
            raise HubError(f"{where}: the dataset has several subsets ({', '.join(names)}); name "
                           "one with --subset")
    if subset not in names:
        raise HubError(f"{where}: --subset {subset}: no such subset; it has {', '.join(names)}")
    splits = subsets[subset]
    if split is not None and split not in splits:
        raise HubError(f"{where}: --split {split}: subset {subset} has splits "
                       f"{', '.join(splits)}")
    chosen = [splits[split]] if split else list(splits.values())
    return tuple(p for paths in chosen for p in paths)


def _card_configs(card: Path) -> dict[str, dict[str, list[str]]]:
    """subset → split → path patterns, as a dataset card's YAML header declares them (`configs:`),
    or {} (no card, no header, no configs); every field checked as it is read."""
    import yaml  # huggingface_hub's own dependency

    if not card.is_file():
        return {}
    text = card.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return {}
    try:
        header = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError as err:
        raise HubError(f"{card}: unreadable YAML header ({str(err).splitlines()[0]})") from None
    if not isinstance(header, dict):
        raise HubError(f"{card}: its YAML header is not a mapping of fields")
    configs = header.get("configs") or []
    if not isinstance(configs, list):
        raise HubError(f"{card}: configs {configs!r} is not a list of subsets")
    subsets: dict[str, dict[str, list[str]]] = {}
    for i, config in enumerate(configs):
        if not isinstance(config, dict):
            raise HubError(f"{card}: configs[{i}] {config!r} is not a mapping (config_name, "
                           "data_files)")
        name = config.get("config_name", "default")
        if not isinstance(name, str) or not name:
            raise HubError(f"{card}: configs[{i}].config_name {name!r} is not a name")
        if name in subsets:
            raise HubError(f"{card}: configs[{i}].config_name {name!r} names a subset declared "
                           "before")
        subsets[name] = _splits(config.get("data_files") or [], f"{card}: configs[{i}].data_files")
    return subsets


def _splits(files, where: str) -> dict[str, list[str]]:
    """split → its path patterns, as a card's config lists its data_files (a pattern, a list of
    patterns or of {split, path} entries, or a mapping of split to patterns, as the datasets library
    reads them); split names that YAML reads as numbers are their text."""
    if isinstance(files, str):
        return {"train": [files]}
    if isinstance(files, dict):
        files = [{"split": split, "path": paths} for split, paths in files.items()]
    if not isinstance(files, list):
        raise HubError(f"{where} {files!r} is not a path pattern, a list of them or of splits "
                       "(split, path)")
    splits: dict[str, list[str]] = {}
    for j, entry in enumerate(files):
        if isinstance(entry, str):
            splits.setdefault("train", []).append(entry)
            continue
        if not isinstance(entry, dict):
            raise HubError(f"{where}[{j}] {entry!r} is not a path pattern or a split (split, path)")
        split, paths = entry.get("split", "train"), entry.get("path")
        if isinstance(split, bool) or not isinstance(split, (str, int)) or split == "":
            raise HubError(f"{where}[{j}].split {split!r} is not a split name")
        patterns = [paths] if isinstance(paths, str) else paths
        if not isinstance(patterns, list) or not patterns \
                or not all(isinstance(p, str) and p for p in patterns):
            raise HubError(f"{where}[{j}].path {paths!r} is not a path pattern or a list of them")
        splits.setdefault(str(split), []).extend(patterns)
    return splits


def _data_missing(folder: Path, patterns: tuple[str, ...]) -> str | None:
    """"data files" when none match, the first absent shard of a split whose shards are numbered,
    else None."""
    files = matching_files(folder, patterns)
    if not files:
        return "data files (" + ", ".join(patterns) + ")"
    for path in files:
        match = SHARD.search(path.name)
        if match:
            width, total = len(match[1]), int(match[2])
            for i in range(total):
                name = path.name[:match.start(1)] + f"{i:0{width}d}" + path.name[match.end(1):]
                if not (path.parent / name).is_file():
                    return str((path.parent / name).relative_to(folder))
    return None


@dataclass(frozen=True)
class Inputs:
    """What `eval --model/--questions` name, as local paths, and where the hub ids among them came
    from."""

    model_dir: Path | None
    question_files: tuple[str, ...]
    # --split as it still applies: a hub dataset's split is chosen by it, not renamed
    split: str | None
    # meta.json's "hub": {"model": Snapshot.to_json(), "questions": [...]}
    sources: dict | None


# a missing file, not a hub id
DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".tsv", ".xlsx")


def resolve_inputs(model: str | None, questions: tuple[str, ...], subset: str | None = None,
                   split: str | None = None) -> Inputs:
    """The local paths of `eval`'s --model and --questions, each hub id among them fetched (or found
    cached)."""
    sources: dict = {}
    model_dir = None
    if model is not None:
        model_dir, snapshot = local_or_hub(model, "--model")
        if snapshot is not None:
            sources["model"] = snapshot.to_json()
    files: list[str] = []
    hub_data = [q for q in questions if not Path(q).expanduser().exists()
                and not q.endswith(DATA_SUFFIXES) and parse_hub_id(q)]
    if subset is not None and not hub_data:
        raise HubError(f"--subset {subset}: picks a subset of a hub dataset; give --questions "
                       "ORG/NAME")
    for source in questions:
        if source not in hub_data:
            files.append(source)
            continue
        paths, snapshot = dataset_files(source, "--questions", subset, split)
        files += [str(p) for p in paths]
        sources.setdefault("questions", []).append(snapshot.to_json())
    return Inputs(model_dir, tuple(files), None if hub_data else split, sources or None)
