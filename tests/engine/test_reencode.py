"""The image as a tool hands it to its processor: Settings.image_reencode, image_resize and
processor_pixels. lmms-eval's Qwen2-VL and Gemma 3 classes send every image as a JPEG data URL of
quality 85 (models/model_utils/media_encoder.py at v0.7.2: convert('RGB') where the image is not
RGB, PIL's JPEG encoder, then the processor decodes it), so the engine re-encodes before its own
preprocessing: the same features as the engine fed those JPEG bytes, other features than the image
as read, and another feature-cache entry. Its Qwen-VL classes resize with qwen_vl_utils first, for a
processor made with their own pixel bounds.
"""
import io

import numpy as np

import pytest
import torch
from PIL import Image
from tinymodels import synthetic_image

from pope_fast.engine import Engine, Settings
from pope_fast.engine.inputs.images import reencoded

pytestmark = pytest.mark.slow  # the registry's tiny Gemma 3 and LLaVA


def _lmms_eval_jpeg(image: Image.Image) -> bytes:
    """What encode_image_to_data_url(image_format="JPEG", convert_rgb=True, quality=85)
    base64-encodes."""
    buffer = io.BytesIO()
    (image if image.mode == "RGB" else image.convert("RGB")).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_the_reencoding_is_the_jpeg_lmms_eval_sends(mode):
    image = synthetic_image(3, (70, 50)).convert(mode)
    ours = reencoded(image, "jpeg85")
    theirs = Image.open(io.BytesIO(_lmms_eval_jpeg(image)))
    assert ours.mode == "RGB" and ours.tobytes() == theirs.convert("RGB").tobytes()
    assert reencoded(image, "none") is image


@pytest.mark.parametrize("name", ["gemma3", "llava"])
def test_features_are_those_of_the_jpeg(name, tiny):
    checkpoint = tiny.checkpoint(name)
    image = synthetic_image(5, (90, 70))
    jpeg = Engine.load(checkpoint, Settings(image_reencode="jpeg85"))
    plain = Engine.load(checkpoint, Settings())
    ours = jpeg.features(image)
    assert torch.equal(ours, plain.features(_lmms_eval_jpeg(image)))  # the JPEG's bytes, as read
    assert not torch.equal(ours, plain.features(image))               # and not the image as read
    key = jpeg.prepare([image])[0].key
    assert key != plain.prepare([image])[0].key  # its own cache entry


def test_settings_record_it_only_where_set():
    assert "image_reencode" not in Settings().to_json()  # a run's meta from before reads as none
    assert Settings(image_reencode="jpeg85").to_json()["image_reencode"] == "jpeg85"
    with pytest.raises(ValueError,
                       match="image_reencode must be one of none, rgb, load_image, jpeg85"):
        Settings(image_reencode="png")


EXPECTED = {"qwen2_vl": {"image_reencode": "jpeg85", "image_resize": "qwen_vl_utils:28:3136:602112",
                         "processor_pixels": "3136:602112"},
            "qwen2_5_vl": {"image_reencode": "rgb", "image_resize": "qwen_vl_utils:28",
                           "processor_pixels": "200704:1605632"},
            "qwen3_vl": {"image_reencode": "rgb", "image_resize": "qwen_vl_utils:32",
                         "processor_pixels": "4096:16777216"}}


@pytest.mark.parametrize("family", list(EXPECTED))
def test_eval_under_lmms_eval_prepares_images_as_it_and_score_checks_it(tiny, tmp_path, family):
    """`eval --protocol lmms-eval` records the image steps of the tool's class (Qwen2-VL's simple
    class: the JPEG round trip, qwen_vl_utils' resize in its bounds, its processor's bounds;
    Qwen2.5-VL's chat class: no JPEG) in meta's settings and coverage; `score --protocol lmms-eval`
    of a run made without them names each."""
    import json

    from click.testing import CliRunner
    from tinymodels import write_pope_set

    from pope_fast.cli import main

    # one question: the protocol decodes 128 tokens, which the random model never ends
    images, files = write_pope_set(tmp_path / "pope", n_images=1, splits=("random",),
                                   questions_per_image=1)
    base = ["eval", "--model", str(tiny.checkpoint(family)), "--images", str(images), "--questions",
            str(files[0]), "--device", "cpu"]
    runs = {}
    plain = ["--readouts", "exact_match", "--max-new-tokens", "2"]
    for name, extra in (("protocol", ["--protocol", "lmms-eval"]), ("plain", plain)):
        out = tmp_path / name
        result = CliRunner().invoke(main, [*base, "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        runs[name] = out
    meta = json.loads((runs["protocol"] / "meta.json").read_text())
    steps = ("image_reencode", "image_resize", "processor_pixels")
    assert {k: meta["settings"][k] for k in steps if k in meta["settings"]} == EXPECTED[family]
    assert {k: v for k, v in meta["protocol_coverage"]["lmms-eval"].items()
            if k in steps} == EXPECTED[family]
    assert not set(steps) & set(json.loads((runs["plain"] / "meta.json").read_text())["settings"])
    scored = {name: CliRunner().invoke(main, ["score", str(out), "--protocol", "lmms-eval"]).output
              for name, out in runs.items()}
    assert not any(k in scored["protocol"] for k in steps), scored["protocol"]
    # the class's generate applies the checkpoint's generation config; a tiny one sets no rule, so a
    # run that applies none differs in nothing there
    assert meta["settings"]["generation_config"] \
        == meta["protocol_coverage"]["lmms-eval"]["generation_config"] == "greedy"
    assert meta["generation_config"] == {} and "generation_config" not in scored["plain"], \
        scored["plain"]
    unset = {"image_reencode": "none", "image_resize": "none",
             "processor_pixels": "the checkpoint's"}
    for key, value in EXPECTED[family].items():
        said = f"(image_reencode none, lmms-eval's {value})" if key == "image_reencode" else \
            f"this run's {key} is {unset[key]}, lmms-eval's {value}"
        assert said in scored["plain"], scored["plain"]


@pytest.mark.parametrize("factor", [28, 32])
def test_qwen_vl_utils_size_is_smart_resize(factor):
    """engine.images.qwen_vl_utils_size against transformers' smart_resize (the algorithm
    qwen_vl_utils 0.0.14 vision_process.py smart_resize states: round to the factor, then one scale
    floored or ceiled into the bounds), over sizes on every branch; and where a side rounds to 0,
    qwen_vl_utils' own guard (max(factor, ...)), which transformers' copy lacks."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    from pope_fast.engine.inputs.images import qwen_vl_utils_size

    for height, width in [(375, 500), (480, 640), (20, 30), (427, 640), (3000, 4000), (57, 9000)]:
        for bounds in ((4 * factor**2, 16384 * factor**2), (256 * 28 * 28, 1605632)):
            assert qwen_vl_utils_size(height, width, factor, *bounds) == \
                smart_resize(height, width, factor=factor, min_pixels=bounds[0],
                             max_pixels=bounds[1])
    assert qwen_vl_utils_size(1, 150, factor, 4 * factor**2, 16384 * factor**2) == \
        (factor, 5 * factor)
    # the COCO image: 504x364 by qwen_vl_utils, 532x392 (266 tokens) by lmms-eval's
    # processor
    if factor == 28:
        assert qwen_vl_utils_size(375, 500, 28, 4 * 28**2, 16384 * 28**2) == (364, 504)
        assert qwen_vl_utils_size(364, 504, 28, 256 * 28 * 28, 1605632) == (392, 532)


def test_lmms_eval_qwen2_5_vl_chat_pixels(tiny):
    """image_resize qwen_vl_utils:28 and processor_pixels 200704:1605632 (lmms-eval's Qwen2.5-VL
    chat class): the engine's pixels are those of the checkpoint's image processor made with those
    bounds (as lmms-eval makes its processor) over the image PIL-resized (bicubic) to qwen_vl_utils'
    size; without them, the processor's alone."""
    from transformers import AutoImageProcessor

    checkpoint = tiny.checkpoint("qwen2_5_vl")
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (375, 500, 3),
                                                              dtype=np.uint8))
    settings = Settings(image_resize="qwen_vl_utils:28", processor_pixels="200704:1605632")
    theirs = AutoImageProcessor.from_pretrained(str(checkpoint), min_pixels=200704,
                                                max_pixels=1605632)(
        images=image.resize((504, 364), resample=Image.Resampling.BICUBIC), return_tensors="np")
    ours = Engine.load(checkpoint, settings)._preprocessed(image)
    assert (np.array_equal(ours[0], theirs["pixel_values"])
            and tuple(ours[1]) == tuple(theirs["image_grid_thw"][0]))
    plain = Engine.load(checkpoint, Settings())._preprocessed(image)
    assert plain[0].shape != ours[0].shape
    assert Settings(image_resize="qwen_vl_utils:28").to_json()["image_resize"] == "qwen_vl_utils:28"
    assert ("image_resize" not in Settings().to_json()
            and "processor_pixels" not in Settings().to_json())
    with pytest.raises(ValueError, match="processor_pixels must be MIN:MAX"):
        Settings(processor_pixels="200704")
    with pytest.raises(ValueError, match="LLaVA-1.5's processor has no pixel bounds"):
        Engine.load(tiny.checkpoint("llava"), Settings(processor_pixels="200704:1605632"))


def test_lmms_eval_qwen3_vl_chat_pixels_are_do_resize_false(tiny):
    """lmms-eval's Qwen3-VL chat class: qwen_vl_utils' resize at factor 32, then the processor with
    do_resize=False (models/chat/qwen3_vl.py l.66-70, l.86). The engine's image_resize
    qwen_vl_utils:32 with a processor bounded as qwen_vl_utils bounds gives those very pixels, the
    processor's own smart_resize leaving the size as it is."""
    from transformers import AutoImageProcessor

    checkpoint = tiny.checkpoint("qwen3_vl")
    image = Image.fromarray(np.random.default_rng(4).integers(0, 256, (375, 500, 3),
                                                              dtype=np.uint8))
    settings = Settings(image_resize="qwen_vl_utils:32", processor_pixels="4096:16777216")
    processor = AutoImageProcessor.from_pretrained(str(checkpoint))
    theirs = processor(images=image.resize((512, 384), resample=Image.Resampling.BICUBIC),
                       do_resize=False, return_tensors="np")
    ours = Engine.load(checkpoint, settings)._preprocessed(image)
    assert (np.array_equal(ours[0], theirs["pixel_values"])
            and tuple(ours[1]) == tuple(theirs["image_grid_thw"][0]))


def test_vlmevalkit_qwen2_5_vl_upscales_within_its_config_bounds(tiny):
    """VLMEvalKit's Qwen2VLChat (config.py l.2004-2010: min_pixels 1280*28*28): qwen_vl_utils
    upscales a 500x375 image to 1176x868, which the checkpoint's own processor keeps; --protocol
    vlmevalkit's settings give the processor's pixels of that image."""
    from transformers import AutoImageProcessor

    from pope_fast.coverage import protocol_for

    checkpoint = tiny.checkpoint("qwen2_5_vl")
    covered = protocol_for(checkpoint, "vlmevalkit")
    assert (covered.image_resize == "qwen_vl_utils:28:1003520:12845056"
            and covered.processor_pixels is None)
    image = Image.fromarray(np.random.default_rng(5).integers(0, 256, (375, 500, 3),
                                                              dtype=np.uint8))
    theirs = AutoImageProcessor.from_pretrained(str(checkpoint))(
        images=image.resize((1176, 868), resample=Image.Resampling.BICUBIC), return_tensors="np")
    ours = Engine.load(checkpoint, Settings(image_resize=covered.image_resize))._preprocessed(image)
    assert (np.array_equal(ours[0], theirs["pixel_values"])
            and tuple(ours[1]) == tuple(theirs["image_grid_thw"][0]))


def _alpha_image() -> Image.Image:
    """An RGBA image whose left half is transparent over colours a white composite would hide."""
    pixels = np.random.default_rng(7).integers(0, 256, (40, 60, 4), dtype=np.uint8)
    pixels[:, :30, 3] = 0
    return Image.fromarray(pixels, "RGBA")


@pytest.mark.parametrize("mode", ["RGBA", "LA", "L", "P", "RGB"])
def test_rgb_is_pils_convert_and_load_image_is_transformers(tmp_path, mode):
    """rgb: the pixels of PIL's convert('RGB') (lmms-eval's tasks/pope/utils.py l.4-6, VLMEvalKit's
    LLaVA classes), which keep the colours under a transparent pixel where a processor composites
    them over white; load_image: transformers' load_image of the file (its EXIF orientation applied,
    as a processor opens a path: VLMEvalKit's Gemma3)."""
    from transformers.image_utils import load_image

    from pope_fast.engine.inputs.images import to_rgb

    image = _alpha_image().convert(mode)
    ours = reencoded(image, "rgb")
    assert ours.mode == "RGB" and ours.tobytes() == image.convert("RGB").tobytes()
    if mode in ("RGBA", "LA"):
        assert ours.tobytes() != to_rgb(image).tobytes()  # not the processors' composite
    rotated = synthetic_image(2, (60, 40))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the stored image is turned 90 degrees
    path = tmp_path / "turned.jpg"
    rotated.save(path, exif=exif)
    opened = Image.open(path)
    theirs = load_image(str(path))
    ours = reencoded(opened, "load_image")
    assert ours.size == theirs.size == (40, 60) and ours.tobytes() == theirs.tobytes()
    assert reencoded(opened, "rgb").size == (60, 40)  # convert('RGB') leaves the orientation alone


def test_rgb_features_are_those_of_the_converted_image(tiny):
    """Under rgb the engine's features are those of the image convert('RGB') makes, not the
    processor's own composite of the image as read, and their cache entry is their own."""
    checkpoint = tiny.checkpoint("llava")
    image = _alpha_image()
    rgb, plain = (Engine.load(checkpoint, Settings(image_reencode="rgb")),
                  Engine.load(checkpoint, Settings()))
    ours = rgb.features(image)
    assert torch.equal(ours, plain.features(image.convert("RGB")))
    assert not torch.equal(ours, plain.features(image))
    assert rgb.prepare([image])[0].key != plain.prepare([image])[0].key


def test_internvl_tile_bounds_are_lmms_eval_images_kwargs(tiny):
    """processor_patches MIN:MAX (lmms-eval's internvl_hf: min_patches and max_patches in every
    call's images_kwargs, models/chat/internvl_hf.py l.248-251): the engine's tiles are the
    processor's under those bounds per call, not its own (up to 6 tiles in the tiny checkpoint), in
    their own cache entry; refused for a family whose processor has no tile bounds; --protocol
    lmms-eval sets 1:12."""
    from transformers import AutoImageProcessor

    from pope_fast.coverage import protocol_for

    checkpoint = tiny.checkpoint("internvl")
    image = synthetic_image(1, (300, 100))
    theirs = AutoImageProcessor.from_pretrained(str(checkpoint))(
        images=image, crop_to_patches=True, min_patches=1, max_patches=2,
        return_tensors="np")["pixel_values"]
    bounded = Engine.load(checkpoint, Settings(processor_patches="1:2"))
    plain = Engine.load(checkpoint, Settings())
    ours = bounded._preprocessed(image)
    assert np.array_equal(ours, theirs) and ours.shape[0] < plain._preprocessed(image).shape[0]
    assert bounded.prepare([image])[0].key != plain.prepare([image])[0].key
    assert Settings(processor_patches="1:2").to_json()["processor_patches"] == "1:2"
    assert "processor_patches" not in Settings().to_json()
    with pytest.raises(ValueError, match="processor_patches must be MIN:MAX, two tile counts"):
        Settings(processor_patches="0:2")
    with pytest.raises(ValueError, match="LLaVA-1.5's processor has no tile bounds"):
        Engine.load(tiny.checkpoint("llava"), Settings(processor_patches="1:12"))
    covered = protocol_for(checkpoint, "lmms-eval")
    assert (covered.processor_patches, covered.image_reencode, covered.deviations) == \
        ("1:12", "rgb", ())
