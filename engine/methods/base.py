"""What every method is built from: the passes it names (`Pass`), its settings' bounds (`Param`),
the `Method` itself, the plausibility cut the contrastive methods share, and the baseline and an
experiment's own intervention as methods."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..layers.interventions import Intervention
from .noise import DIFFUSION_STEPS, VCD_NOISE_STEP

PASS_IMAGES = ("image", "noised", "none")


@dataclass(frozen=True)
class Pass:
    """One forward pass a method reads. image: "image" (the image's features), "noised" (VCD's
    noised copy at `noise_step`, VCD's own step unless given, drawn per image from `seed`), or
    "none" (the prompt's tokens without the image tokens); system: an instruction rendered as the
    template's system text (ICD); edit: an Intervention (PAI's attention edit, VTI's MLP steering),
    named by `edit_name` (what tells two passes apart)."""

    image: str = "image"
    system: str | None = None
    noise_step: int | None = None  # a "noised" pass's only: None there is VCD_NOISE_STEP
    seed: int = 0
    edit_name: str = ""
    edit: Intervention | None = field(default=None, compare=False, hash=False)

    def __post_init__(self):
        if self.image not in PASS_IMAGES:
            raise ValueError(f"Pass: image must be one of {', '.join(PASS_IMAGES)}, "
                             f"not {self.image!r}")
        if self.image != "noised":
            if self.noise_step is not None:
                raise ValueError(f"Pass: noise_step applies to a 'noised' pass, "
                                 f"not to image={self.image!r}")
            return
        step = VCD_NOISE_STEP if self.noise_step is None else self.noise_step
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < DIFFUSION_STEPS:
            raise ValueError(f"Pass: noise_step must be an integer in [0, {DIFFUSION_STEPS - 1}], "
                             f"not {step!r}")
        # frozen: the step it runs at, as two equal passes compare
        object.__setattr__(self, "noise_step", step)


def plausible(logits: torch.Tensor, beta: float) -> torch.Tensor:
    """The adaptive plausibility constraint: tokens whose logit (or log-probability) is within
    log(beta) of the row's best. [B, V] bool."""
    return logits >= math.log(beta) + logits.max(dim=-1, keepdim=True).values


@dataclass(frozen=True)
class Param:
    """What a method's setting may be: a number (int, or float which an int also is) within [low,
    high] (low excluded with low_open), or a non-empty string."""

    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def check(self, method: str, name: str, value) -> None:
        kinds = (int, float) if self.kind is float else (self.kind,)
        what = {int: "an integer", float: "a number", str: "a text"}[self.kind]
        if isinstance(value, bool) or not isinstance(value, kinds) \
                or (self.kind is str and not value.strip()) \
                or (self.kind is float and not math.isfinite(value)):
            raise ValueError(f"method {method}: {name} must be {what}, not {value!r}")
        below = self.low is not None and (value < self.low or (self.low_open and value == self.low))
        if below or (self.high is not None and value > self.high):
            high = '∞)' if self.high is None else f'{self.high}]'
            bounds = f"{'(' if self.low_open else '['}{self.low}, {high}"
            raise ValueError(f"method {method}: {name} must lie in {bounds}, not {value!r}")


@dataclass(frozen=True)
class LayerSpan:
    """A setting naming decoder layers FIRST-LAST (inclusive): its form checked here, before any
    model loads; its layers against the model's once it is loaded (layer_range, in the method's
    passes)."""

    example: str  # what the message shows (each method's own published range)

    def check(self, method: str, name: str, value) -> None:
        first, sep, last = str(value).partition("-")
        if not (sep and first.isdigit() and last.isdigit()):
            raise ValueError(f"method {method}: {name} takes FIRST-LAST (e.g. {self.example}), "
                             f"not {value!r}")


# a contrast's weight; a plausibility cut
ALPHA, BETA = Param(float, 0.0), Param(float, 0.0, 1.0, low_open=True)


class Method:
    """A named mitigation method: its settings (with the paper's defaults, each checked against its
    Param before any model loads), its passes, and how it combines their [B, V] fp32 answer-position
    logits."""

    name = ""
    reference = ""
    # Why the method cannot answer a question asked without an image (None: it
    # runs on one as on any prompt).
    text_only_refusal: str | None = None
    defaults: dict = {}
    params: dict[str, Param | LayerSpan] = {}
    # whether its passes' results must hold every layer's output at the answer position (VISTA)
    residuals = False

    def __init__(self, **settings):
        unknown = sorted(set(settings) - set(self.defaults))
        if unknown:
            raise ValueError(f"method {self.name}: unknown setting(s) {', '.join(unknown)}; "
                             f"known: {', '.join(self.defaults) or 'none'}")
        for key, value in settings.items():
            self.check(key, value)
        self.settings = {**self.defaults, **settings}

    def check(self, key: str, value) -> None:
        self.params[key].check(self.name, key, value)

    def passes(self, num_layers: int) -> dict[str, Pass]:
        return {"main": Pass()}

    def check_model(self, lm) -> None:
        """ValueError where the method does not fit the language model lm (a
        layer past its layers, say)."""
        self.passes(lm.dims.num_layers)

    def later(self, results: dict[str, list]) -> dict[str, Pass]:
        """Passes built from the results of `passes` (per role, per image, per question:
        PromptResults), run after them; their logits join `combine`'s under their roles. None by
        default; VISTA's steering vector is one question's residual streams with and without its
        image."""
        return {}

    def combine(self, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        """The answer-position logits [B, V] fp32 of each role's pass (and "ROLE:lens" for a pass
        whose edit names lens_layers) → the method's."""
        return logits["main"]

    @property
    def contrastive(self) -> bool:
        return type(self).combine is not Method.combine

    def to_json(self, num_layers: int | None = None) -> dict:
        """Name, settings as they apply to a model of num_layers layers
        (defaults resolved), reference."""
        return {"name": self.name, "settings": self.resolved(num_layers),
                "reference": self.reference}

    def resolved(self, num_layers: int | None) -> dict:
        return dict(self.settings)


class Baseline(Method):
    name = "none"
    reference = "the model as it is: the baseline every method is compared with"


def layer_range(spec, num_layers: int) -> tuple[int, int]:
    """'FIRST-LAST' (inclusive), or None: 2 .. the last layer (PAI's range(2, 32) on 32 layers; the
    last layer alone on a model of fewer than 3)."""
    if spec is None:
        first, last = min(2, num_layers - 1), num_layers - 1
    else:
        first, sep, last = str(spec).partition("-")
        if not (sep and first.isdigit() and last.isdigit()):
            raise ValueError(f"layers takes FIRST-LAST (e.g. 2-31), not {spec!r}")
        first, last = int(first), int(last)
    if not 0 <= first <= last < num_layers:
        raise ValueError(f"layers {first}-{last} are not within the model's {num_layers} layers")
    return first, last


class Intervened(Method):
    """The model under an experiment's own Intervention (the Python API's run_plain(...,
    intervention=)): one pass with it; meta.json names its class and its plain settings (numbers,
    strings, flags), so a resume under another intervention is refused."""

    name = "intervention"

    def __init__(self, intervention: Intervention):
        super().__init__()
        self.intervention = intervention
        kind = type(intervention)
        self.reference = f"{kind.__module__}.{kind.__qualname__}"
        plain = (int, float, str, bool, type(None), tuple, list)
        self.settings = {k: v for k, v in sorted(vars(intervention).items())
                         if isinstance(v, plain) and not k.startswith("_")}

    def passes(self, num_layers):
        edit_name = f"{self.reference}:{self.settings}"
        return {"main": Pass(edit=self.intervention, edit_name=edit_name)}
