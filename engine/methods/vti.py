"""VTI (Liu et al., ICLR 2025, "Reducing Hallucinations in Vision-Language Models via Latent Space
Steering"; shengliu66/VTI): each decoder layer's MLP output turned toward a steering direction
computed offline, its norm kept."""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..layers.interventions import Intervention
from .base import Method, Param, Pass

# VTILayer.forward (vti_utils/llm_layers.py:16-31): x -> normalize(normalize(x) + 0.1 * y) * |x|, y
# the mean over its directions of lam[i] * normalize(direction[i]); one direction
# (add_vti_layers(model, torch.stack([direction], dim=1), alpha=[alpha_text]),
# experiments/eval/run_mmhal_vti.py:77-78) makes y = alpha * normalize(direction).
VTI_STEP = 0.1


class VTISteering(Intervention):
    """VTI's textual steering: layer l's MLP output x [.., H] becomes |x| normalize(normalize(x) +
    0.1 alpha normalize(d_l)) at every position (prefix, question and generated tokens alike, as VTI
    wraps the MLP module), in fp32 and back to the model's dtype. directions [L, H], one per decoder
    layer; `source` names them in errors."""

    def __init__(self, directions: torch.Tensor, alpha: float, source: str = "directions"):
        self.unit = F.normalize(directions.float(), dim=-1)
        self.alpha, self.source = alpha, source

    def mlp(self, layer: int, out: torch.Tensor, part: str) -> torch.Tensor:
        if self.unit.shape[-1] != out.shape[-1]:
            raise ValueError(f"{self.source}: tensor text is {list(self.unit.shape)}, but the "
                             f"model's hidden size is {out.shape[-1]}: VTI's directions are "
                             "computed on the model they steer")
        if self.unit.device != out.device:
            self.unit = self.unit.to(out.device)
        x = out.float()
        steered = F.normalize(F.normalize(x, dim=-1) + VTI_STEP * self.alpha * self.unit[layer],
                              dim=-1)
        return (steered * x.norm(dim=-1, keepdim=True)).to(out.dtype)


class VTI(Method):
    """One pass under VTISteering: not a contrast, so its records are the model's own under the
    steering, text readouts included. Only VTI's textual direction is applied: its visual one steers
    the vision encoder's layers (run_mmhal_vti.py:67-68), where the engine's families have no
    hook."""

    name = "vti"
    reference = ("Liu et al., Reducing Hallucinations in Vision-Language Models via Latent Space "
                 "Steering, ICLR 2025 (shengliu66/VTI): each decoder layer's MLP output x becomes "
                 "||x|| normalize(normalize(x) + 0.1 alpha normalize(d_l)), d_l the layer's "
                 "textual direction from `directions`; alpha 0.9 (its README's alpha_text); the "
                 "visual direction is not applied")
    defaults = {"directions": None, "alpha": 0.9}
    params = {"directions": Param(str), "alpha": Param(float, 0.0)}

    def __init__(self, **settings):
        super().__init__(**settings)
        if self.settings["directions"] is None:
            raise ValueError("method vti: give directions=PATH, a safetensors file whose tensor "
                             "text [layers, hidden] holds VTI's textual direction per decoder "
                             "layer (docs/methods.md says how to compute it)")
        self._loaded: tuple[torch.Tensor, str] | None = None

    def directions(self) -> tuple[torch.Tensor, str]:
        """The file's `text` tensor and the file's sha256, read once;
        ValueError naming the file otherwise."""
        if self._loaded is None:
            path = Path(self.settings["directions"]).expanduser()
            try:
                data, tensors = path.read_bytes(), load_file(path)
            except (OSError, SafetensorError) as err:
                raise ValueError(f"method vti: directions {path}: {err}") from None
            if set(tensors) != {"text"}:
                raise ValueError(f"method vti: directions {path} holds "
                                 f"{', '.join(sorted(tensors)) or 'no tensor'}; it must hold one "
                                 "tensor, text [layers, hidden] (VTI's visual direction steers the "
                                 "vision encoder, which the engine does not)")
            text = tensors["text"]
            if text.ndim != 2 or not text.is_floating_point() or not torch.isfinite(text).all():
                raise ValueError(f"method vti: directions {path}: tensor text must be finite "
                                 f"floats [layers, hidden], not {text.dtype} {list(text.shape)}")
            self._loaded = (text, hashlib.sha256(data).hexdigest())
        return self._loaded

    def passes(self, num_layers):
        text, digest = self.directions()
        if text.shape[0] != num_layers:
            raise ValueError(f"method vti: directions {self.settings['directions']}: tensor text "
                             f"has {text.shape[0]} directions, the model {num_layers} decoder "
                             "layers (one each: VTI's obtain_textual_vti(...)[0][1:])")
        source = f"method vti: directions {self.settings['directions']}"
        steering = VTISteering(text, float(self.settings["alpha"]), source)
        return {"main": Pass(edit=steering, edit_name=f"vti:{self.settings['alpha']}:{digest}")}

    def resolved(self, num_layers):
        return {**self.settings, "directions_sha256": self.directions()[1]}
