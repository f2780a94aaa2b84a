"""The loader gives every weight the address torch's allocator would: a CPU matmul's kernel can take
another path for an operand that starts off a 64-byte boundary, so a weight read in place from its
file would make the records depend on where the file's layout puts it
(tests/families/test_qwen3_vl_moe.py holds the end-to-end promise)."""
import torch
from safetensors.torch import save_file

from pope_fast.engine.utils.loader import ALIGNMENT, iter_tensors


def test_every_weight_starts_on_the_allocators_boundary(tmp_path):
    # 3, 5 and 7 floats: each tensor after the first starts at an offset that is no multiple of 64
    # in the file
    tensors = {f"w{i}": torch.arange(n, dtype=torch.float32) + i
               for i, n in enumerate((3, 5, 7, 16))}
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    names = {name: name for name in tensors}
    loaded = dict(iter_tensors(tmp_path, {name: path for name in tensors}, names,
                               {name: tuple(t.shape) for name, t in tensors.items()}))
    assert sorted(loaded) == sorted(tensors)
    for name, tensor in loaded.items():
        assert tensor.data_ptr() % ALIGNMENT == 0, name
        assert tensor.is_contiguous() and torch.equal(tensor, tensors[name])
