"""One generic checkpoint loader (safetensors, or PyTorch `.bin` read safely). A model family
declares how checkpoint names map to its own parameter names and which names and shapes it expects;
this file does the rest and fails loudly, naming every missing, unexpected or misshapen tensor and
every file that cannot be read."""
from __future__ import annotations

import math
import pickle
import re
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import SafetensorError, safe_open

from ...readout.data import read_json_object


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file or tensor."""


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (a checkpoint folder needs its config.json)")
    return read_json_object(path, CheckpointError)


# config.json fields that every family reads as a positive count, size or constant, wherever they
# nest (text, vision, Q-Former configs): zero or less is in no real checkpoint, and would build an
# empty model or divide by zero deep in a forward pass instead of naming the field
POSITIVE = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim",
                      "max_position_embeddings", "rms_norm_eps", "layer_norm_eps", "rope_theta",
                      "query_pre_attn_scalar", "patch_size", "image_size", "spatial_merge_size",
                      "temporal_patch_size", "num_query_tokens", "out_hidden_size", "depth",
                      "num_heads", "embed_dim", "mm_tokens_per_image", "downsample_ratio"})


def check_config(config: dict, where: Path) -> None:
    """Refuse, naming the field, a config.json field of POSITIVE that is not a positive finite
    number."""
    def positive(value) -> bool:
        return not isinstance(value, bool) and isinstance(value, (int, float)) \
            and 0 < value < float("inf")

    def walk(node: dict, path: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{path}{key}.")
            # a size may be given per side: [448, 448]
            elif key in POSITIVE and value is not None and not (
                    positive(value)
                    or (isinstance(value, list) and value and all(map(positive, value)))):
                raise CheckpointError(f"{where}: {path}{key} is {value!r}; every real checkpoint's "
                                      "is a positive number")
    walk(config, "")


def checkpoint_dtype(folder: Path, config: dict) -> torch.dtype | None:
    """The dtype from_pretrained(dtype="auto") loads a checkpoint in: config.json's dtype
    (torch_dtype before transformers 5), else its weights' first floating tensor's (modeling_utils
    `_get_dtype`); None for neither."""
    named = config.get("dtype") or config.get("torch_dtype")
    if isinstance(named, str) and isinstance(getattr(torch, named, None), torch.dtype):
        return getattr(torch, named)
    for name, path in tensor_files(folder).items():
        with open_shard(path) as f:
            tensor = f.get_slice(name) if hasattr(f, "get_slice") else f.get_tensor(name)
            dtype = tensor.dtype if isinstance(tensor, torch.Tensor) \
                else _SAFETENSORS_DTYPES.get(tensor.get_dtype())
        if dtype is not None and dtype.is_floating_point:
            return dtype
    return None


_SAFETENSORS_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
                       "F64": torch.float64}


# Buffers that checkpoints store as integers (indices, not weights) where they store them at all:
# the modules recompute them, so load_grouped takes them as optional and load_module does not miss
# them.
INDEX_BUFFERS = ("position_ids",)
# What a checkpoint may store as integers besides them (a BatchNorm's step count), for a class
# transformers runs.
INTEGER_BUFFERS = (*INDEX_BUFFERS, "num_batches_tracked")
# Index file → the weight format it indexes; safetensors first, as transformers prefers them.
INDEXES = (("model.safetensors.index.json", "*.safetensors"),
           ("pytorch_model.bin.index.json", "pytorch_model*.bin"))


def tensor_files(folder: Path) -> dict[str, Path]:
    """Checkpoint tensor name → the file holding it: sharded safetensors with an index, unindexed
    safetensors, then the same for PyTorch `pytorch_model*.bin` files."""
    for index_name, pattern in INDEXES:
        index = folder / index_name
        if index.is_file():
            return _indexed_files(folder, index)
        shards = sorted(folder.glob(pattern))
        if shards:
            files: dict[str, Path] = {}
            for shard in shards:
                with open_shard(shard) as f:
                    files.update({name: shard for name in f.keys()})
            return files
    raise CheckpointError(f"{folder}: no weights (*.safetensors or pytorch_model*.bin, with or "
                          "without an index)")


def _indexed_files(folder: Path, index: Path) -> dict[str, Path]:
    weight_map = read_json_object(index, CheckpointError).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: no weight_map object (tensor name → shard file)")
    files = {name: folder / fname for name, fname in weight_map.items()}
    absent = sorted({str(p) for p in files.values() if not p.is_file()})
    if absent:
        raise CheckpointError(f"{index} lists shard(s) that are missing: {', '.join(absent)}")
    return files


class _BinShard:
    """A `.bin` state dict loaded with weights_only=True (no code runs) and memory-mapped."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def keys(self):
        return self.tensors.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.tensors[name]


@contextmanager
def open_shard(path: Path):
    """An open weight file with keys() and get_tensor(name); a file that cannot be read (truncated,
    not a checkpoint, unsafe pickle) is a CheckpointError naming it."""
    if path.suffix == ".safetensors":
        try:
            handle = safe_open(str(path), framework="pt")
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{path}: unreadable safetensors file ({err})") from None
        with handle as f:
            yield f
        return
    mmap = zipfile.is_zipfile(path)  # a legacy (pre-1.6, non-zip) file cannot be memory-mapped
    try:
        tensors = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path}: holds objects other than tensors (refused: only weights "
                              "are loaded, no pickled code runs)") from None
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        if not mmap and _head(path) == b"PK\x03\x04":  # a zip that lost its central directory
            reason = "a zip archive cut short"
        raise CheckpointError(f"{path}: unreadable PyTorch weights file, truncated or not a "
                              f"checkpoint ({reason})") from None
    if not isinstance(tensors, dict) \
            or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    yield _BinShard(tensors)


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


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
            raise CheckpointError(f"{folder}: tensors {ours[target]} and {name} both map to "
                                  f"{target}")
        else:
            ours[target] = name
    refuse_names(folder, [n for n in expected if n not in ours], unexpected)
    return ours


def refuse_names(folder: Path, missing: list[str], unexpected: list[str]) -> None:
    """Raise, naming (the first 20 of) each, where a checkpoint lacks tensors or holds ones nothing
    reads: the engine's loader and the transformers backend's refuse the same faults in the same
    line."""
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing[:20])}"
                        + (" ..." if len(missing) > 20 else ""))
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected[:20])}"
                        + (" ..." if len(unexpected) > 20 else ""))
    if problems:
        raise CheckpointError(f"{folder}: " + "; ".join(problems))


def iter_tensors(folder: Path, files: dict[str, Path], names: dict[str, str],
                 expected: dict[str, tuple[int, ...]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(our name, tensor on CPU in its stored dtype), one shard open at a time; shapes, dtypes and
    values are checked (check_tensor)."""
    ours_of = {theirs: ours for ours, theirs in names.items()}
    for path, name, tensor in stored_tensors(files, list(ours_of)):
        ours = ours_of[name]
        shapes = [tuple(s) for s in expected[ours]] if isinstance(expected[ours], list) \
            else [tuple(expected[ours])]  # a list: the layouts a checkpoint may store it in
        if tuple(tensor.shape) not in shapes:
            raise CheckpointError(f"{path}: tensor {name} has shape {tuple(tensor.shape)}, "
                                  f"the config implies {' or '.join(map(str, shapes))}")
        check_tensor(path, name, tensor, floating=not ours.endswith(INDEX_BUFFERS))
        yield ours, aligned(tensor)


def stored_tensors(files: dict[str, Path],
                   wanted: list[str]) -> Iterator[tuple[Path, str, torch.Tensor]]:
    """(file, checkpoint name, tensor) of each wanted name, one shard open at a time."""
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        with open_shard(path) as f:
            stored = set(f.keys())
            absent = [name for name in names if name not in stored]
            if absent:
                raise CheckpointError(f"{path}: tensor(s) the index places here are missing: "
                                      f"{', '.join(absent[:20])}")
            for name in names:
                yield path, name, f.get_tensor(name)


# The dtypes whose values check_tensor reads (fp8 has no CPU reduction, and a quantizer's own
# formats are its own)
FINITE_CHECKED = frozenset(_SAFETENSORS_DTYPES.values())


def check_tensor(path: Path, name: str, tensor: torch.Tensor, floating: bool = True) -> None:
    """Refuse, naming the file and tensor, a weight stored as integers (`floating`: one the model
    computes with in floating point) or a floating tensor holding a NaN or an infinity: either would
    run and be scored as numbers no model computed. aminmax propagates NaN and reads the tensor once
    (30 times faster than isfinite().all() on 2 cores: 0.6 ns an fp16 value)."""
    if floating and not tensor.is_floating_point():
        raise CheckpointError(f"{path}: tensor {name} is stored as {str(tensor.dtype)[6:]}, but it "
                              "is a weight the model computes with in floating point (its bits "
                              "would be read as numbers)")
    if tensor.dtype not in FINITE_CHECKED or not tensor.numel():
        return
    low, high = tensor.aminmax()
    if math.isfinite(low) and math.isfinite(high):
        return
    nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    held = " and ".join(f"{n:,} {what}" for n, what in ((nan, "NaN"), (inf, "infinite")) if n)
    raise CheckpointError(f"{path}: tensor {name} holds {held} value(s) of {tensor.numel():,}; "
                          "a weight is a finite number (a broken conversion or save, or a "
                          "corrupted file)")


def check_stored(folder: Path, quantized: bool = False) -> None:
    """Every tensor a checkpoint stores, checked as the engine's loader checks the ones it reads
    (check_tensor): the transformers backend's half of one loading contract. Integers are a weight's
    only where a quantization config packs them, or a stored index buffer."""
    files = tensor_files(folder)
    for path, name, tensor in stored_tensors(files, list(files)):
        check_tensor(path, name, tensor,
                     floating=not quantized and not name.endswith(INTEGER_BUFFERS))


# c10's CPU allocator places every tensor at a multiple of 64 bytes. A CPU matmul's kernel
# (oneDNN's, MKL's) can take another path for an operand that starts elsewhere, and so sum in
# another order: a weight read in place from its file, at whatever offset the file's layout gives
# it, would make the records depend on that layout (one float32 step on some CPUs for the same
# weights stored in another order or shape).
ALIGNMENT = 64


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor where torch's allocator would have put it: itself if it starts on an ALIGNMENT
    boundary and is contiguous, else an owned contiguous copy."""
    if tensor.data_ptr() % ALIGNMENT == 0 and tensor.is_contiguous():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def load_grouped(folder: Path, rules: list[tuple[str, str]], expected: dict[str, tuple[int, ...]],
                 optional: set[str] = frozenset(),
                 ignore: tuple[str, ...] = ()) -> dict[str, dict[str, torch.Tensor]]:
    """Every expected tensor, named ours ("group.rest") by the first matching rule, read,
    shape-checked and grouped by the first part of its name; names in `optional` (and INDEX_BUFFERS)
    may be absent, and checkpoint names matching an `ignore` pattern (stored buffers the model
    recomputes) are skipped."""
    optional = set(optional) | {k for k in expected if k.endswith(INDEX_BUFFERS)}
    files = {k: v for k, v in tensor_files(folder).items()
             if not any(re.match(p, k) for p in ignore)}
    names = map_names(files, lambda n: rename(n, rules),
                      {k: v for k, v in expected.items() if k not in optional}, folder)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in iter_tensors(folder, files, names,
                                     {k: v for k, v in expected.items() if k in names}):
        group, _, rest = name.partition(".")
        groups.setdefault(group, {})[rest] = tensor
    return groups


def load_module(module: torch.nn.Module, weights: dict[str, torch.Tensor], folder: Path,
                what: str) -> None:
    """A borrowed transformers module gets its tensors; position_ids buffers are never stored."""
    missing, unexpected = module.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not m.endswith(INDEX_BUFFERS)]
    if missing or unexpected:
        raise CheckpointError(f"{folder}: {what} tensors missing {missing}, unexpected "
                              f"{unexpected}")


def rename(name: str, rules: list[tuple[str, str]]) -> str | None:
    """A checkpoint name under the first (pattern, replacement) rule that matches, or None."""
    for pattern, target in rules:
        if re.match(pattern, name):
            return re.sub(pattern, target, name, count=1)
    return None


def no_init():
    """Skip random initialisation of borrowed transformers modules: every weight is loaded right
    after."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: plain init, only slower
        from contextlib import nullcontext
        return nullcontext()
    return no_init_weights()


def generation_config(folder: Path) -> dict:
    """The checkpoint's generation_config.json ({} where it has none), which generate() merges under
    its arguments; its eos_token_id checked here, the rules' fields where the rules are read
    (GreedyRules.of)."""
    path = folder / "generation_config.json"
    config = read_json_object(path, CheckpointError) if path.is_file() else {}
    eos = config.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    if eos is not None and not (ids and all(isinstance(i, int) and not isinstance(i, bool)
                                            and i >= 0 for i in ids)):
        raise CheckpointError(f"{path}: eos_token_id must be a token id or a non-empty list of "
                              f"them, not {eos!r}")
    return config


def stop_ids(config: dict, tokenizer) -> set[int]:
    """What ends a greedy continuation: generate() stops at the generation config's eos ids (the
    tokenizer's eos when the checkpoint has none)."""
    eos = config.get("eos_token_id")
    ids = set(eos) if isinstance(eos, list) else {eos} if eos is not None \
        else {tokenizer.eos_token_id}
    return ids - {None}


@contextmanager
def quiet_fallback():
    """transformers says on every load that `XImageProcessor` falls back to `XImageProcessorPil`
    without torchvision; the PIL processor is the one the families' exact pixel paths are checked
    against, so the notice only alarms (it comes from import_utils' logger, once per process)."""
    from transformers.utils import logging

    notices = logging.get_logger("transformers.utils.import_utils")
    level = notices.level
    notices.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notices.setLevel(level)
