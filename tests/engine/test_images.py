"""Image preprocessing against transformers' own processor, and the sweep's image pipeline."""
import numpy as np
import pytest
import torch
from PIL import Image
from pope_fast.engine import Engine, Settings
from pope_fast.engine.inputs.images import ClipPixels, to_rgb
from tinymodels import QUESTIONS, make_tiny_llava, synthetic_image

pytestmark = pytest.mark.slow  # transformers' processors and tiny checkpoints: seconds a test


def _processor(**overrides):
    from transformers import CLIPImageProcessorPil

    config = dict(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    config.update(overrides)
    return CLIPImageProcessorPil(**config)


def assert_same_pixels(got, expected, image):
    assert got.dtype == expected.dtype and got.shape == expected.shape, (image.mode, image.size)
    mismatched = np.argwhere(got != expected)
    assert not len(mismatched), f"{image.mode} {image.size}: first mismatch at {mismatched[0]}"


def _images():
    rgb = [synthetic_image(i, size) for i, size in
           enumerate([(640, 480), (480, 640), (640, 427), (500, 375), (337, 1001), (336, 336),
                      (90, 70), (41, 300)])]
    base = synthetic_image(99, (301, 203))
    rgba = base.convert("RGBA")
    alpha = np.asarray(rgba).copy()
    alpha[..., 3] = np.arange(301)[None, :] % 256  # every alpha level, so compositing matters
    palette = base.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette.info["transparency"] = 3
    # an RGB PNG with a transparency key: transformers composites that colour too
    keyed = base.copy()
    keyed.info["transparency"] = tuple(int(v) for v in np.asarray(base)[5, 7])
    return rgb + [Image.fromarray(alpha, "RGBA"), base.convert("L"), base.convert("CMYK"), palette,
                  base.convert("LA"), keyed]


@pytest.mark.parametrize("config", [
    {},
    dict(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}),
    dict(size={"shortest_edge": 300}, crop_size={"height": 211, "width": 289}, resample=2),
    dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], rescale_factor=1 / 127.5),
], ids=["llava-336", "clip-224", "odd-crop-bilinear", "other-normalization"])
def test_fast_clip_pixels_equal_the_processor_bit_for_bit(config):
    processor = _processor(**config)
    fast = ClipPixels.for_processor(processor)
    assert fast is not None
    for image in _images():
        expected = processor(images=image, return_tensors="np")["pixel_values"][0]
        assert_same_pixels(fast(image), expected, image)


@pytest.mark.parametrize("config", [
    dict(do_center_crop=False),
    dict(do_normalize=False),
    dict(size={"height": 336, "width": 336}),
    dict(crop_size={"height": 400, "width": 400}),
], ids=["no-crop", "no-normalize", "fixed-size", "crop-beyond-image"])
def test_fast_clip_pixels_decline_other_processors(config):
    assert ClipPixels.for_processor(_processor(**config)) is None


def test_alpha_is_composited_over_white_as_transformers_does():
    red = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red
    assert to_rgb(red).getpixel((0, 0)) == (255, 255, 255)
    # what a plain convert would have kept
    assert red.convert("RGB").getpixel((0, 0)) == (255, 0, 0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("tiny_llava_images") / "ckpt")


def test_engine_matches_transformers_on_an_image_with_alpha(checkpoint):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    image = _images()[8]
    assert image.mode == "RGBA"
    model = LlavaForConditionalGeneration.from_pretrained(str(checkpoint),
                                                          dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    engine = Engine.load(checkpoint, Settings(), readouts="legacy_8tok")
    # the tiny checkpoint's processor takes the fast path
    assert engine.model._fast_pixels is not None
    answer = engine.answer(image, QUESTIONS[:1])[0]
    inputs = processor(images=image, text=f"USER: <image>\n{QUESTIONS[0]}\nASSISTANT:",
                       return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
    worst = max(abs(v - float(logits[i])) for i, v in answer.candidate_logits.items())
    assert worst < 1e-4


def test_a_fast_path_that_disagrees_is_turned_off(checkpoint):
    """Checked at load on a textured probe: a fast path that a flat image would not expose (another
    resampling filter) is refused, and one that agrees is kept."""
    engine = Engine.load(checkpoint, Settings(), readouts="legacy_8tok")
    model = engine.model
    good = ClipPixels.for_processor(model.image_processor)
    assert model._checked_fast_pixels(good) is good
    wrong = ClipPixels(good.shortest_edge, good.crop, Image.Resampling.NEAREST, 1 / 255,
                       model.image_processor.image_mean, model.image_processor.image_std)
    flat = Image.new("RGB", (640, 480), (124, 116, 104))
    # a uniform image cannot tell them apart
    assert np.array_equal(wrong(flat), model._processor_pixels(flat))
    assert model._checked_fast_pixels(wrong) is None


def _encoded(image, fmt):
    import io

    buf = io.BytesIO()
    image.save(buf, format=fmt, quality=90) if fmt == "JPEG" else image.save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt, damage, bad", [
    ("JPEG", lambda b: b, False),
    ("JPEG", lambda b: b + b"trailing bytes after the end marker", False),
    ("JPEG", lambda b: b[: len(b) // 2], True),
    ("JPEG", lambda b: b[:-2], True),  # only the end marker missing: the draft decode decides
    ("PNG", lambda b: b, False),
    ("PNG", lambda b: b[: len(b) // 2], True),
    # a flipped byte fails its CRC
    ("PNG", lambda b: b[:60] + bytes([b[60] ^ 0xFF]) + b[61:], True),
    ("BMP", lambda b: b, False),
    ("BMP", lambda b: b[: len(b) // 2], True),
], ids=["jpeg", "jpeg-trailing-data", "jpeg-half", "jpeg-no-end-marker", "png", "png-half",
        "png-flipped-byte", "bmp", "bmp-half"])
def test_image_checks_catch_damaged_files_without_refusing_good_ones(tmp_path, fmt, damage, bad):
    from pope_fast.engine.inputs.images import ImageError, read_image

    path = tmp_path / f"image.{fmt.lower()}"
    path.write_bytes(damage(_encoded(synthetic_image(5, (120, 90)), fmt)))
    if bad:
        with pytest.raises(ImageError, match=rf"{path.name}: not a decodable image"):
            read_image(path)
    else:
        read_image(path).open()


@pytest.mark.parametrize("pinpoints, side", [
    ([[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]], 336),
    ([[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]], 28),
], ids=["llava-1.6", "tiny"])
def test_fast_anyres_pixels_equal_the_processor_bit_for_bit(pinpoints, side):
    from transformers import LlavaNextImageProcessorPil

    from pope_fast.engine.models.llava_next import AnyresPixels

    processor = LlavaNextImageProcessorPil(size={"shortest_edge": side},
                                           crop_size={"height": side, "width": side},
                                           image_grid_pinpoints=pinpoints)
    fast = AnyresPixels.for_processor(processor)
    assert fast is not None
    for image in _images():
        out = processor(images=image, return_tensors="np")
        crops, size = fast(image)
        assert size == tuple(int(v) for v in out["image_sizes"][0]), image.size
        assert_same_pixels(crops, out["pixel_values"][0], image)


def test_llava_next_takes_the_fast_path_and_matches_its_processor(tmp_path):
    from tinymodels import make_tiny_llava_next

    engine = Engine.load(make_tiny_llava_next(tmp_path / "ckpt", builtin_tokenizer=True),
                         Settings())
    model = engine.model
    assert model._fast_pixels is not None
    for image in _images()[:4]:
        (crops, size), (expected, expected_size) = (model.preprocess(image),
                                                    model._processor_pixels(image))
        assert size == expected_size and np.array_equal(crops, expected)


def test_a_llava_next_fast_path_that_disagrees_is_turned_off(tmp_path):
    from tinymodels import make_tiny_llava_next

    from pope_fast.engine.models.llava_next import AnyresPixels

    model = Engine.load(make_tiny_llava_next(tmp_path / "ckpt", builtin_tokenizer=True),
                        Settings()).model
    good = model._fast_pixels
    assert isinstance(good, AnyresPixels) and model._checked_fast_pixels(good) is good
    wrong = AnyresPixels(good.pinpoints, good.crop, Image.Resampling.NEAREST, 1 / 255,
                         model.image_processor.image_mean, model.image_processor.image_std)
    assert model._checked_fast_pixels(wrong) is None


def test_pinpoints_off_the_crop_grid_keep_the_processor():
    from transformers import LlavaNextImageProcessorPil

    from pope_fast.engine.models.llava_next import AnyresPixels

    processor = LlavaNextImageProcessorPil(size={"shortest_edge": 28},
                                           crop_size={"height": 28, "width": 28},
                                           image_grid_pinpoints=[[28, 56], [40, 70]])
    assert AnyresPixels.for_processor(processor) is None


@pytest.mark.parametrize("config",
                         [{}, dict(min_pixels=4 * 28 * 28, max_pixels=30 * 28 * 28),
                          dict(resample=2)],
                         ids=["default-budget", "tiny-budget", "bilinear"])
def test_fast_native_pixels_equal_the_processor_bit_for_bit(config):
    from transformers import Qwen2VLImageProcessorPil

    from pope_fast.engine.models.qwen2_vl import NativePixels

    processor = Qwen2VLImageProcessorPil(**config)
    fast = NativePixels.for_processor(processor)
    assert fast is not None
    for image in _images():
        out = processor(images=image, return_tensors="np")
        patches, grid = fast(image)
        assert grid == tuple(int(v) for v in out["image_grid_thw"][0]), image.size
        assert_same_pixels(patches, out["pixel_values"], image)


def test_qwen2_vl_takes_the_fast_path(tmp_path):
    from tinymodels import make_tiny_qwen2_vl

    from pope_fast.engine.models.qwen2_vl import NativePixels

    model = Engine.load(make_tiny_qwen2_vl(tmp_path / "ckpt", builtin_tokenizer=True),
                        Settings()).model
    assert isinstance(model._fast_pixels, NativePixels)
    for image in _images()[:4]:
        (patches, grid), (expected, expected_grid) = (model.preprocess(image),
                                                      model._processor_pixels(image))
        assert grid == expected_grid and np.array_equal(patches, expected)


def test_demo_stand_ins_follow_the_names_sub_folders_and_skip_what_is_no_image(tmp_path):
    """The demo's stand-in images (engine.synthetic.write_images): HallusionBench's names keep their
    sub-folders (VS/chart/0_1.png); a question asked without an image gets none, nor does a name
    that is no path inside the folder (written nowhere: the run refuses it naming its question)."""
    from pope_fast.engine.synthetic import write_images

    folder = write_images(tmp_path / "images",
                          ["VS/chart/0_1.png", "", "a.jpg", "../out.png", str(tmp_path / "x.png")])
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert written == ["VS/chart/0_1.png", "a.jpg"]
    assert not (tmp_path / "out.png").exists() and not (tmp_path / "x.png").exists()
    assert (Image.open(folder / "VS/chart/0_1.png").format == "PNG"
            and Image.open(folder / "a.jpg").format == "JPEG")
