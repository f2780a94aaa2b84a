"""One generic safetensors loader. A model family declares how checkpoint names map to its own
parameter names and which names and shapes it expects; this file does the rest and fails loudly,
naming every missing, unexpected or misshapen tensor."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file or tensor."""


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (a checkpoint folder needs its config.json)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}:{err.lineno}: malformed JSON: {err.msg}") from None


def tensor_files(folder: Path) -> dict[str, Path]:
    """Checkpoint tensor name → the safetensors file holding it (sharded with an index, or not)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = {name: folder / fname for name, fname in weight_map.items()}
        absent = sorted({str(p) for p in files.values() if not p.is_file()})
        if absent:
            raise CheckpointError(f"{index} lists shard(s) that are missing: {', '.join(absent)}")
        return files
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{folder}: no *.safetensors weights (and no model.safetensors.index.json)")
    files = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            files.update({name: shard for name in f.keys()})
    return files


def map_names(files: dict[str, Path], rename: Callable[[str], str | None],
              expected: dict[str, tuple[int, ...]], folder: Path) -> dict[str, str]:
    """Our parameter name → checkpoint name; raises naming every missing and unexpected tensor."""
    ours: dict[str, str] = {}
    unexpected = []
    for name in files:
        target = rename(name)
        if target is None or target not in expected:
            unexpected.append(name)
        elif target in ours:
            raise CheckpointError(f"{folder}: tensors {ours[target]} and {name} both map to {target}")
        else:
            ours[target] = name
    missing = [n for n in expected if n not in ours]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing[:20])}" + (" ..." if len(missing) > 20 else ""))
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected[:20])}" + (" ..." if len(unexpected) > 20 else ""))
    if problems:
        raise CheckpointError(f"{folder}: " + "; ".join(problems))
    return ours


def iter_tensors(folder: Path, files: dict[str, Path], names: dict[str, str],
                 expected: dict[str, tuple[int, ...]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(our name, tensor on CPU in its stored dtype), one shard open at a time; shapes are checked."""
    by_file: dict[Path, list[str]] = {}
    for ours, theirs in names.items():
        by_file.setdefault(files[theirs], []).append(ours)
    for path, ours_list in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for ours in ours_list:
                tensor = f.get_tensor(names[ours])
                if tuple(tensor.shape) != tuple(expected[ours]):
                    raise CheckpointError(f"{path}: tensor {names[ours]} has shape {tuple(tensor.shape)}, "
                                          f"the config implies {tuple(expected[ours])}")
                yield ours, tensor


def load_grouped(folder: Path, rules: list[tuple[str, str]], expected: dict[str, tuple[int, ...]],
                 optional: set[str] = frozenset()) -> dict[str, dict[str, torch.Tensor]]:
    """Every expected tensor, named ours ("group.rest") by the first matching rule, read, shape-checked
    and grouped by the first part of its name; names in `optional` may be absent."""
    files = tensor_files(folder)
    names = map_names(files, lambda n: rename(n, rules),
                      {k: v for k, v in expected.items() if k not in optional}, folder)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in iter_tensors(folder, files, names, {k: v for k, v in expected.items() if k in names}):
        group, _, rest = name.partition(".")
        groups.setdefault(group, {})[rest] = tensor
    return groups


def load_module(module: torch.nn.Module, weights: dict[str, torch.Tensor], folder: Path, what: str) -> None:
    """A borrowed transformers module gets its tensors; position_ids buffers are never stored."""
    missing, unexpected = module.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not m.endswith("position_ids")]
    if missing or unexpected:
        raise CheckpointError(f"{folder}: {what} tensors missing {missing}, unexpected {unexpected}")


def rename(name: str, rules: list[tuple[str, str]]) -> str | None:
    """A checkpoint name under the first (pattern, replacement) rule that matches, or None."""
    for pattern, target in rules:
        if re.match(pattern, name):
            return re.sub(pattern, target, name, count=1)
    return None


def no_init():
    """Skip random initialisation of borrowed transformers modules: every weight is loaded right after."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: plain init, only slower
        from contextlib import nullcontext
        return nullcontext()
    return no_init_weights()


def stop_ids(folder: Path, tokenizer) -> set[int]:
    """What ends a greedy continuation: generate() stops at generation_config's eos ids (the
    tokenizer's eos when the checkpoint has none)."""
    ids = {tokenizer.eos_token_id}
    path = folder / "generation_config.json"
    if path.is_file():
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
        ids = set(eos) if isinstance(eos, list) else {eos} if eos is not None else ids
    return ids - {None}
