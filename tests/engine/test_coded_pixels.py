"""Pixels sent to the device as uint8 codes and normalized there (engine/inputs/coded_pixels.py):
the same float32s as the host's lookup, in every dtype, for a quarter of the bytes."""
import numpy as np
import pytest
import torch
from PIL import Image

from pope_fast.engine.inputs.coded_pixels import CodedPixels, pixels_on_device
from pope_fast.engine.inputs.images import ClipPixels
from pope_fast.engine.methods import diffusion_noise

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def _clip(rescale=1 / 255, mean=CLIP_MEAN, std=CLIP_STD):
    return ClipPixels(24, (24, 20), Image.Resampling.BICUBIC, rescale, mean, std)


def _image(seed, size=(37, 29)):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3),
                                                                dtype=np.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_codes_normalized_on_the_device_are_the_hosts_pixels_bit_for_bit(dtype):
    fast = _clip()
    images = [_image(0), _image(1, (29, 37))]
    floats = [fast(image) for image in images]
    coded = [CodedPixels(fast.codes(image), fast.table) for image in images]
    assert all(c.codes.dtype == np.uint8 and c.codes.nbytes * 4 == f.nbytes
               for c, f in zip(coded, floats))
    assert all(np.array_equal(np.asarray(c), f) for c, f in zip(coded, floats))
    out = pixels_on_device(coded, torch.device("cpu"), dtype)
    expected = torch.from_numpy(np.stack(floats)).to(dtype)
    assert out.dtype == dtype and out.shape == expected.shape and torch.equal(out, expected)
    # arrays go as they are
    assert torch.equal(pixels_on_device(floats, torch.device("cpu"), dtype), expected)


def test_codes_of_two_tables_in_one_call_are_refused():
    image = _image(2)
    a, b = _clip(), _clip(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="normalize tables differ"):
        pixels_on_device([CodedPixels(a.codes(image), a.table),
                          CodedPixels(b.codes(image), b.table)],
                         torch.device("cpu"), torch.float32)


def test_vcd_noises_the_floats_the_codes_stand_for():
    fast, image = _clip(), _image(3)
    noised = diffusion_noise(CodedPixels(fast.codes(image), fast.table), 500,
                             torch.Generator().manual_seed(0))
    expected = diffusion_noise(fast(image), 500, torch.Generator().manual_seed(0))
    assert (isinstance(noised, np.ndarray) and noised.dtype == np.float32
            and np.array_equal(noised, expected))
    assert not np.array_equal(noised, fast(image))
