"""What a piece of code launches: the torch ops that compute and the Triton kernels, counted on any
device (on a CPU under the interpreter too), for the benchmark's kernels-per-layer figures."""
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .common import interpreter_on


class LaunchCounter(TorchDispatchMode):
    """While entered: `triton`, the Triton launches, and `ops`, the torch ops that compute a tensor
    by name (one kernel launch or more each on CUDA). Views that alias, allocations (empty) and the
    ops the interpreter runs to carry a launch's tensors are left out; a view op that cannot alias
    (x.to(dtype), converting) computes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out, name = func(*args, **(kwargs or {})), func._schema.name.removeprefix("aten::")
        aliased = func.is_view and (out.untyped_storage().data_ptr()
                                    == args[0].untyped_storage().data_ptr())
        if isinstance(out, torch.Tensor) and not (self.inside or aliased
                                                  or name.startswith("empty")):
            self.ops[name] += 1
        return out

    def __enter__(self):
        from triton.runtime import interpreter, jit

        self.ops, self.triton, self.inside = Counter(), 0, False
        self.kind = interpreter.InterpretedFunction if interpreter_on() else jit.JITFunction
        self.run = self.kind.run
        self.kind.run = lambda kernel, *args, **kwargs: self.launch(kernel, *args, **kwargs)
        return super().__enter__()

    def launch(self, kernel, *args, **kwargs):
        self.triton, self.inside = self.triton + 1, True
        try:
            return self.run(kernel, *args, **kwargs)
        finally:
            self.inside = False

    def __exit__(self, *exc):
        self.kind.run = self.run
        return super().__exit__(*exc)
