"""VCD's noised image: the diffusion forward process its noised pass runs the image's pixels
through, and the per-image generator that makes the noise the same on every rerun, batch and
device."""
from __future__ import annotations

import math

import numpy as np
import torch

from ..inputs.coded_pixels import CodedPixels

# VCD (Leng et al., CVPR 2024) noises the processor's pixels with a diffusion forward process of
# 1000 steps, betas sigmoid(linspace(-6, 6)) scaled into [1e-5, 5e-3] (vcd_utils/vcd_add_noise.py).
DIFFUSION_STEPS = 1000
# The step VCD noises at in its own POPE runs (experiments/cd_scripts/llava1.5_pope.bash:
# noise_step=500); a "noised" pass that names no step is noised there, not at step 0, which leaves
# the image nearly clean.
VCD_NOISE_STEP = 500


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
    # uint8 codes: the noise goes on the normalized floats they stand for
    if isinstance(pixels, CodedPixels):
        pixels = np.asarray(pixels)
    if isinstance(pixels, np.ndarray) and np.issubdtype(pixels.dtype, np.floating):
        a = diffusion_alpha_bar(step)
        noise = torch.randn(pixels.shape, generator=generator, dtype=torch.float32).numpy()
        noised = math.sqrt(a) * pixels.astype(np.float32) + math.sqrt(1 - a) * noise
        return noised.astype(pixels.dtype)
    return pixels


def noise_generator(feature_key: str, seed: int) -> torch.Generator:
    """The CPU generator of one image's VCD noise: from the image's feature-cache key (its content,
    preprocessing and model) and the method's seed, so reruns, batches and devices draw the same."""
    return torch.Generator().manual_seed(int(feature_key[:15], 16) ^ seed)
