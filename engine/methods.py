"""Inference-time mitigation methods, each a set of forward passes whose answer-position logits it
combines, with its paper's settings (`--method NAME[:key=value,...]`).

POPE is read at one position, so a method here is what its paper does to the logits of the first
generated token; methods whose point is a long decode are out of scope. A method names its passes
(`Pass`): the image's features or a noised copy's, or no image at all; the template's prompt or one
with a system instruction; an attention edit. The engine runs each distinct pass once for every method
of a paired run that reads it (`Engine.run_methods`), so `none`, `vcd` and `pai` together cost the
baseline pass, VCD's noised pass, PAI's edited pass (sharing the baseline's prefixes: its edit touches
the answer position only) and one text-only pass per distinct question.

Contrastive methods change the logits over the whole vocabulary: their records' candidate logits and
first token are the method's (-inf where the plausibility constraint cuts a token), and they take the
readouts of the answer position only (logit and first-token readouts, not text readouts, which would
need the method inside a decode loop).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .layers.interventions import Intervention, PAIAttention

# VCD (Leng et al., CVPR 2024) noises the processor's pixels with a diffusion forward process of 1000
# steps, betas sigmoid(linspace(-6, 6)) scaled into [1e-5, 5e-3] (vcd_utils/vcd_add_noise.py).
DIFFUSION_STEPS = 1000
# The step VCD noises at in its own POPE runs (experiments/cd_scripts/llava1.5_pope.bash: noise_step=500);
# a "noised" pass that names no step is noised there, not at step 0, which leaves the image nearly clean.
VCD_NOISE_STEP = 500
PASS_IMAGES = ("image", "noised", "none")


def diffusion_alpha_bar(step: int) -> float:
    """The cumulative product of (1 - beta) up to `step` (0-based) of VCD's noise schedule."""
    betas = torch.sigmoid(torch.linspace(-6, 6, DIFFUSION_STEPS)) * (0.5e-2 - 1e-5) + 1e-5
    return float(torch.cumprod(1 - betas, dim=0)[step])


def diffusion_noise(pixels, step: int, generator: torch.Generator):
    """The processor's output with every floating-point array noised as q(x_t | x_0) at `step`:
    sqrt(alpha_bar) * x + sqrt(1 - alpha_bar) * N(0, 1), the noise drawn from `generator` on the CPU
    (the same on every device). Integer parts (image sizes, patch grids) pass unchanged."""
    if isinstance(pixels, tuple):
        return tuple(diffusion_noise(p, step, generator) for p in pixels)
    if isinstance(pixels, np.ndarray) and np.issubdtype(pixels.dtype, np.floating):
        a = diffusion_alpha_bar(step)
        noise = torch.randn(pixels.shape, generator=generator, dtype=torch.float32).numpy()
        return (math.sqrt(a) * pixels.astype(np.float32) + math.sqrt(1 - a) * noise).astype(pixels.dtype)
    return pixels


def noise_generator(feature_key: str, seed: int) -> torch.Generator:
    """The CPU generator of one image's VCD noise: from the image's feature-cache key (its content,
    preprocessing and model) and the method's seed, so reruns, batches and devices draw the same."""
    return torch.Generator().manual_seed(int(feature_key[:15], 16) ^ seed)


@dataclass(frozen=True)
class Pass:
    """One forward pass a method reads. image: "image" (the image's features), "noised" (VCD's noised
    copy at `noise_step`, VCD's own step unless given, drawn per image from `seed`), or "none" (the
    prompt's tokens without the image tokens); system: an instruction rendered as the template's system
    text (ICD); edit: an attention intervention, named by `edit_name` (what tells two passes apart)."""

    image: str = "image"
    system: str | None = None
    noise_step: int | None = None  # a "noised" pass's only: None there is VCD_NOISE_STEP
    seed: int = 0
    edit_name: str = ""
    edit: Intervention | None = field(default=None, compare=False, hash=False)

    def __post_init__(self):
        if self.image not in PASS_IMAGES:
            raise ValueError(f"Pass: image must be one of {', '.join(PASS_IMAGES)}, not {self.image!r}")
        if self.image != "noised":
            if self.noise_step is not None:
                raise ValueError(f"Pass: noise_step applies to a 'noised' pass, not to image={self.image!r}")
            return
        step = VCD_NOISE_STEP if self.noise_step is None else self.noise_step
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < DIFFUSION_STEPS:
            raise ValueError(f"Pass: noise_step must be an integer in [0, {DIFFUSION_STEPS - 1}], not {step!r}")
        object.__setattr__(self, "noise_step", step)  # frozen: the step it runs at, as two equal passes compare


def plausible(logits: torch.Tensor, beta: float) -> torch.Tensor:
    """The adaptive plausibility constraint: tokens whose logit (or log-probability) is within log(beta)
    of the row's best. [B, V] bool."""
    return logits >= math.log(beta) + logits.max(dim=-1, keepdim=True).values


@dataclass(frozen=True)
class Param:
    """What a method's setting may be: a number (int, or float which an int also is) within [low, high]
    (low excluded with low_open), or a non-empty string."""

    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def check(self, method: str, name: str, value) -> None:
        kinds = (int, float) if self.kind is float else (self.kind,)
        what = {int: "an integer", float: "a number", str: "a text"}[self.kind]
        if isinstance(value, bool) or not isinstance(value, kinds) or (self.kind is str and not value.strip()) \
                or (self.kind is float and not math.isfinite(value)):
            raise ValueError(f"method {method}: {name} must be {what}, not {value!r}")
        if (self.low is not None and (value < self.low or (self.low_open and value == self.low))) or \
                (self.high is not None and value > self.high):
            bounds = f"{'(' if self.low_open else '['}{self.low}, {'∞)' if self.high is None else f'{self.high}]'}"
            raise ValueError(f"method {method}: {name} must lie in {bounds}, not {value!r}")


ALPHA, BETA = Param(float, 0.0), Param(float, 0.0, 1.0, low_open=True)  # a contrast's weight; a plausibility cut


class Method:
    """A named mitigation method: its settings (with the paper's defaults, each checked against its
    Param before any model loads), its passes, and how it combines their [B, V] fp32 answer-position
    logits."""

    name = ""
    reference = ""
    # Why the method cannot answer a question asked without an image (None: it runs on one as on any prompt).
    text_only_refusal: str | None = None
    defaults: dict = {}
    params: dict[str, Param] = {}

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

    def combine(self, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        return logits["main"]

    @property
    def contrastive(self) -> bool:
        return type(self).combine is not Method.combine

    def to_json(self, num_layers: int | None = None) -> dict:
        """Name, settings as they apply to a model of num_layers layers (defaults resolved), reference."""
        return {"name": self.name, "settings": self.resolved(num_layers), "reference": self.reference}

    def resolved(self, num_layers: int | None) -> dict:
        return dict(self.settings)


class Baseline(Method):
    name = "none"
    reference = "the model as it is: the baseline every method is compared with"


class VCD(Method):
    name = "vcd"
    reference = ("Leng et al., Mitigating Object Hallucinations in Large Vision-Language Models through Visual "
                 "Contrastive Decoding, CVPR 2024 (DAMO-NLP-SG/VCD): (1 + alpha) l - alpha l_noised where "
                 "l >= log(beta) + max l, else -inf; noise step 500, alpha 1, beta 0.1 as its POPE scripts")
    defaults = {"alpha": 1.0, "beta": 0.1, "noise_step": VCD_NOISE_STEP, "seed": 0}
    text_only_refusal = "it contrasts the image with a noised copy of it, and there is no image to noise"
    params = {"alpha": ALPHA, "beta": BETA, "noise_step": Param(int, 0, DIFFUSION_STEPS - 1), "seed": Param(int, 0)}

    def passes(self, num_layers):
        s = self.settings
        return {"main": Pass(), "noised": Pass("noised", noise_step=int(s["noise_step"]), seed=int(s["seed"]))}

    def combine(self, logits):
        a = float(self.settings["alpha"])
        main, other = logits["main"], logits["noised"]
        return _contrast(main, other, a, float(self.settings["beta"]))


class ICD(Method):
    """Chosen as the second contrastive family over M3ID: M3ID weights its text-only contrast by
    (1 - exp(-lambda t)) / exp(-lambda t), about 0.02 at the first token with its lambda 0.02, so on
    POPE's one position it is nearly the baseline; ICD contrasts at full strength there, and its pass
    (the same image under another system instruction) exercises what VCD's and PAI's do not."""

    name = "icd"
    reference = ("Wang et al., Mitigating Hallucinations in Large Vision-Language Models with Instruction "
                 "Contrastive Decoding, ACL Findings 2024 (p1k0pan/ICD): (1 + alpha) l - alpha l_disturbed, "
                 "the disturbance instruction as the system prompt, alpha 1, beta 0.1")
    defaults = {"alpha": 1.0, "beta": 0.1,
                "instruction": "You are a confused objects detector to provide a fuzzy overview or impression "
                               "of the image."}
    params = {"alpha": ALPHA, "beta": BETA, "instruction": Param(str)}

    def passes(self, num_layers):
        return {"main": Pass(), "disturbed": Pass(system=str(self.settings["instruction"]))}

    def combine(self, logits):
        return _contrast(logits["main"], logits["disturbed"], float(self.settings["alpha"]),
                         float(self.settings["beta"]))


class PAI(Method):
    name = "pai"
    reference = ("Liu et al., Paying More Attention to Image, ECCV 2024 (LALBJ/PAI): image logits s + alpha |s| "
                 "at the answer position in layers 2..31, then gamma (log p - log p_text) + log p_text where "
                 "log p >= log(beta) + max log p, else -inf; alpha 0.2, gamma 1.1, beta 0.1 as its POPE command")
    defaults = {"alpha": 0.2, "gamma": 1.1, "beta": 0.1, "layers": None}
    text_only_refusal = ("it scales attention to the image and contrasts the prompt with itself without the image; "
                         "with no image it would record the baseline under PAI's name")
    params = {"alpha": ALPHA, "gamma": Param(float, 0.0), "beta": BETA}

    def check(self, key, value):
        if key == "layers":  # FIRST-LAST; against the model's layers once it is loaded (passes)
            first, sep, last = str(value).partition("-")
            if not (sep and first.isdigit() and last.isdigit()):
                raise ValueError(f"method pai: layers takes FIRST-LAST (e.g. 2-31), not {value!r}")
            return
        super().check(key, value)

    def passes(self, num_layers):
        layers = _layer_range(self.settings["layers"], num_layers)
        edit = PAIAttention(float(self.settings["alpha"]), layers)
        return {"main": Pass(edit=edit, edit_name=f"pai:{self.settings['alpha']}:{layers[0]}-{layers[1]}"),
                "text": Pass("none")}

    def resolved(self, num_layers):
        if num_layers is None or self.settings["layers"] is not None:
            return dict(self.settings)
        first, last = _layer_range(None, num_layers)
        return {**self.settings, "layers": f"{first}-{last}"}

    def combine(self, logits):
        main, text = (torch.log_softmax(logits[k], dim=-1) for k in ("main", "text"))
        gamma = float(self.settings["gamma"])
        out = gamma * (main - text) + text
        return out.masked_fill(~plausible(main, float(self.settings["beta"])), float("-inf"))


def _contrast(main: torch.Tensor, other: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    out = (1 + alpha) * main - alpha * other
    return out.masked_fill(~plausible(main, beta), float("-inf"))


def _layer_range(spec, num_layers: int) -> tuple[int, int]:
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
    """The model under an experiment's own Intervention (the Python API's run_pope(..., intervention=)):
    one pass with it; meta.json names its class and its plain settings (numbers, strings, flags), so a
    resume under another intervention is refused."""

    name = "intervention"

    def __init__(self, intervention: Intervention):
        super().__init__()
        self.intervention = intervention
        kind = type(intervention)
        self.reference = f"{kind.__module__}.{kind.__qualname__}"
        self.settings = {k: v for k, v in sorted(vars(intervention).items())
                         if isinstance(v, (int, float, str, bool, type(None), tuple, list)) and not k.startswith("_")}

    def passes(self, num_layers):
        return {"main": Pass(edit=self.intervention, edit_name=f"{self.reference}:{self.settings}")}


METHODS: dict[str, type[Method]] = {m.name: m for m in (Baseline, VCD, PAI, ICD)}


def parse_method(spec: str) -> Method:
    """'NAME' or 'NAME:key=value,...' → the method with those settings (numbers parsed as numbers)."""
    name, _, rest = spec.strip().partition(":")
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    settings = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"method {spec!r}: settings take key=value, not {item!r}")
        if key.strip() in settings:  # else the last would win unsaid
            raise ValueError(f"method {spec!r}: {key.strip()} is given twice; give each setting once")
        settings[key.strip()] = _number(value.strip())
    return METHODS[name](**settings)


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
