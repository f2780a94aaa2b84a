"""Inference-time mitigation methods, each a set of forward passes whose answer-position logits it
combines, with its paper's settings (`--method NAME[:key=value,...]`).

POPE is read at one position, so a method here is what its paper does to the logits of the first
generated token; methods whose point is a long decode are out of scope. A method names its passes
(`Pass`): the image's features or a noised copy's, or no image at all; the template's prompt or one
with a system instruction; an attention edit. The engine runs each distinct pass once for every
method of a paired run that reads it (`Engine.run_methods`), so `none`, `vcd` and `pai` together
cost the baseline pass, VCD's noised pass, PAI's edited pass (sharing the baseline's prefixes: its
edit touches the answer position only) and one text-only pass per distinct question.

Contrastive methods change the logits over the whole vocabulary: their records' candidate logits and
first token are the method's (-inf where the plausibility constraint cuts a token), and they take
the readouts of the answer position only (logit and first-token readouts, not text readouts, which
would need the method inside a decode loop).

Each method lives in its family's module (contrastive.py, pai.py, ...) on base.py's Pass, Param and
Method; the registry and the `--method` parser are here, where every method is in sight (a registry
in base.py would import the modules that import it).
"""
from __future__ import annotations

from .avisc import AvisC
from .base import (ALPHA, BETA, PASS_IMAGES, Baseline, Intervened, Method, Param, Pass, layer_range,
                   plausible)
from .clearsight import ClearSight
from .contrastive import ICD, M3ID, VCD
from .memvr import MemVR
from .noise import (DIFFUSION_STEPS, VCD_NOISE_STEP, diffusion_alpha_bar, diffusion_noise,
                    noise_generator)
from .only import ONLY
from .pai import PAI
from .sid import SID
from .vista import VISTA, VISTASteering
from .vti import VTI, VTISteering

__all__ = ["ALPHA", "BETA", "DIFFUSION_STEPS", "ICD", "M3ID", "METHODS", "PAI", "PASS_IMAGES",
           "SID", "VCD", "VCD_NOISE_STEP", "VTI", "Baseline", "Intervened", "Method", "NOT_HERE",
           "Param", "Pass", "VTISteering", "diffusion_alpha_bar", "diffusion_noise", "layer_range",
           "noise_generator", "parse_method", "plausible", "MemVR", "ONLY", "VISTA",
           "VISTASteering", "ClearSight", "AvisC"]

METHODS: dict[str, type[Method]] = {m.name: m for m in (Baseline, VCD, PAI, ICD, M3ID, VTI, SID,
                                                         ONLY, MemVR, VISTA, ClearSight, AvisC)}

# Methods papers compare against that are not here, and what each needs that the engine does not
# give (docs/methods.md)
NOT_HERE: dict[str, str] = {}


def parse_method(spec: str) -> Method:
    """'NAME' or 'NAME:key=value,...' → the method with those settings
    (numbers parsed as numbers)."""
    name, _, rest = spec.strip().partition(":")
    if name in NOT_HERE:
        raise ValueError(f"method {name} is not available: {NOT_HERE[name]}")
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    settings = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"method {spec!r}: settings take key=value, not {item!r}")
        if key.strip() in settings:  # else the last would win unsaid
            raise ValueError(f"method {spec!r}: {key.strip()} is given twice; "
                             f"give each setting once")
        settings[key.strip()] = _number(value.strip())
    return METHODS[name](**settings)


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
