"""One loading contract for both paths (issues 48 and 49): a checkpoint missing a tensor, holding
one nothing reads, one of another shape, a weight stored as integers or a tensor holding a NaN or an
infinity is refused at load in one line naming it, by the engine's loader and by the transformers
backend alike (docs/design.md)."""
import math
import os
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from pope_fast.engine import CheckpointError, Settings, load_engine
from pope_fast.engine.utils.loader import check_stored, check_tensor, load_grouped


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("value, says",
                         [(math.nan, "3 NaN"), (math.inf, "3 infinite"), (-math.inf, "3 infinite")])
def test_a_non_finite_value_anywhere_is_refused_naming_the_tensor(tmp_path, dtype, value, says):
    tensor = torch.randn(37, 53, generator=torch.Generator().manual_seed(0)).to(dtype)
    # first, middle, last: a reduction that skipped any would pass it
    for index in (0, 1000, 37 * 53 - 1):
        tensor.view(-1)[index] = value
    with pytest.raises(CheckpointError,
                       match=rf"^{re.escape(str(tmp_path))}: tensor lm_head\.weight holds {says} "
                                              r"value\(s\) of 1,961; a weight is a finite number"):
        check_tensor(tmp_path, "lm_head.weight", tensor)


def test_nan_and_infinity_are_counted_apart(tmp_path):
    tensor = torch.zeros(10)
    tensor[2], tensor[5], tensor[7] = math.nan, math.inf, -math.inf
    with pytest.raises(CheckpointError, match=r"holds 1 NaN and 2 infinite value\(s\) of 10;"):
        check_tensor(tmp_path, "w", tensor)


def test_finite_weights_and_index_buffers_pass(tmp_path):
    check_tensor(tmp_path, "w", torch.finfo(torch.float16).max * torch.ones(4, dtype=torch.float16))
    check_tensor(tmp_path, "b", torch.zeros(0))  # an empty tensor has no value to be wrong
    check_tensor(tmp_path, "model.position_ids", torch.arange(6), floating=False)
    with pytest.raises(CheckpointError,
                       match=r"tensor w is stored as int8, but it is a weight the model computes"):
        check_tensor(tmp_path, "w", torch.ones(4, dtype=torch.int8))


def _write(folder, tensors):
    folder.mkdir(exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_the_engines_loader_refuses_a_nan_it_reads(tmp_path):
    weight = torch.ones(2, 3)
    weight[1, 2] = math.nan
    folder = _write(tmp_path / "ckpt", {"a.weight": torch.ones(3), "b.weight": weight})
    with pytest.raises(CheckpointError,
                       match=rf"^{re.escape(str(folder / 'model.safetensors'))}: tensor b\.weight "
                                              r"holds 1 NaN value\(s\) of 6"):
        load_grouped(folder, [(r"^(.*)$", r"g.\1")], {"g.a.weight": (3,), "g.b.weight": (2, 3)})


def test_every_stored_tensor_is_checked_for_the_backend(tmp_path):
    """check_stored reads each tensor a checkpoint stores: integers only where a quantization config
    packs them or as an index buffer; a non-finite float never."""
    ints = {"model.position_ids": torch.arange(4), "bn.num_batches_tracked": torch.tensor(7)}
    clean = _write(tmp_path / "clean", {"w": torch.ones(2, 2), **ints})
    check_stored(clean)
    packed = _write(tmp_path / "int8",
                    {"w": torch.ones(2, 2, dtype=torch.int8), "absmax": torch.ones(2)})
    with pytest.raises(CheckpointError,
                       match=r"int8/model\.safetensors: tensor w is stored as int8, but it is a"):
        check_stored(packed)
    check_stored(packed, quantized=True)
    scale = torch.ones(2)
    scale[0] = math.inf
    broken = _write(tmp_path / "quantized",
                    {"w": torch.ones(2, 2, dtype=torch.int8), "absmax": scale})
    with pytest.raises(CheckpointError, match=r"tensor absmax holds 1 infinite value"):
        check_stored(broken, quantized=True)


# --- the same fault, the same line, on both backends (the registry's tiny LLaVA)
# ---------------------------------

def _variant(checkpoint, folder, edit):
    """The checkpoint with its tensors edited (edit(dict) in place), its other files hard-linked."""
    folder.mkdir()
    for path in checkpoint.iterdir():
        if path.name != "model.safetensors":
            os.link(path, folder / path.name)
    tensors = load_file(str(checkpoint / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


# the tiny LLaVA's names: llava-hf's original spelling
DOWN = "language_model.model.layers.1.mlp.down_proj.weight"


def _nan_head(t):
    t["language_model.lm_head.weight"][3, :5] = math.nan


FAULTS = {  # fault -> (edit, what both lines say, after the folder or its weights file)
    "missing": (lambda t: t.pop(DOWN), r": missing tensors: \S*layers\.1\.mlp\.down_proj\.weight$"),
    "unexpected": (lambda t: t.update({"model.language_model.layers.9.mlp.down_proj.weight":
                                       t[DOWN].clone()}),
                   r": unexpected tensors: "
                   r"model\.language_model\.layers\.9\.mlp\.down_proj\.weight$"),
    "shape": (lambda t: t.update({DOWN: t[DOWN][:, :-1].clone()}),
              r": tensor \S*layers\.1\.mlp\.down_proj\.weight has shape \(64, 127\), the config "
              r"implies \(64, 128\)$"),
    "int8": (lambda t: t.update({DOWN: (t[DOWN] * 100).to(torch.int8)}),
             rf"/model\.safetensors: tensor {re.escape(DOWN)} is stored as int8, but it is a "
             rf"weight the model"),
    "nan": (_nan_head,
            r"/model\.safetensors: tensor language_model\.lm_head\.weight holds 5 NaN value\(s\) "
            r"of "),
}


@pytest.mark.slow  # the backend loads transformers' class of a tiny checkpoint
@pytest.mark.parametrize("fault", FAULTS)
def test_both_backends_refuse_the_same_fault_in_the_same_line(tiny, tmp_path, fault):
    edit, says = FAULTS[fault]
    folder = _variant(tiny.checkpoint("llava"), tmp_path / fault, edit)
    lines = {}
    for backend in ("engine", "transformers"):
        with pytest.raises(CheckpointError) as refused:
            load_engine(folder, Settings(), backend=backend)
        lines[backend] = str(refused.value)
        assert lines[backend].startswith(str(folder)) and re.search(says, lines[backend]), \
            lines[backend]
        assert "\n" not in lines[backend]
    if fault in ("unexpected", "int8", "nan"):  # the same checkpoint names on both paths
        assert lines["engine"] == lines["transformers"]


def test_engines_of_one_checkpoint_share_its_tokenizer_until_a_file_changes(tmp_path):
    """Family.shared's memo: one load per loader and version of the folder's files (a tokenizer
    rewritten, even to the same size, is loaded anew; so is a file added, e.g. a sub-folder's), the
    last SHARED_KEPT kept, and a load that raises kept by no one."""
    from pope_fast.engine.models.base import SHARED_KEPT, shared_pretrained

    loads = []

    def load():
        loads.append(object())
        return loads[-1]

    (tmp_path / "tokenizer.json").write_text('{"a": 1}')
    first = shared_pretrained("AutoTokenizer", tmp_path, load)
    assert shared_pretrained("AutoTokenizer", tmp_path, load) is first and len(loads) == 1
    assert shared_pretrained("AutoProcessor", tmp_path, load) is loads[1]
    stat = (tmp_path / "tokenizer.json").stat()
    (tmp_path / "tokenizer.json").write_text('{"b": 2}')
    os.utime(tmp_path / "tokenizer.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert shared_pretrained("AutoTokenizer", tmp_path, load) is loads[2]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "vocab.txt").write_text("a")
    assert shared_pretrained("AutoTokenizer", tmp_path, load) is loads[3]
    for n in range(SHARED_KEPT):
        shared_pretrained(n, tmp_path, load)
    assert shared_pretrained("AutoTokenizer", tmp_path, load) is loads[-1] is not loads[3]

    def fails():
        raise OSError("no tokenizer.json")

    with pytest.raises(OSError):
        shared_pretrained("Failing", tmp_path, fails)
    assert shared_pretrained("Failing", tmp_path, load) is loads[-1]
