"""Settings.image_reencode: the image as a tool hands it to its processor. lmms-eval's Qwen-VL and Gemma 3
classes send every image as a JPEG data URL of quality 85 (models/model_utils/media_encoder.py at v0.7.2:
convert('RGB') where the image is not RGB, PIL's JPEG encoder, then the processor decodes it), so the engine
re-encodes before its own preprocessing: the same features as the engine fed those JPEG bytes, other
features than the image as read, and another feature-cache entry."""
import io

import pytest
import torch
from PIL import Image
from tinymodels import synthetic_image

from pope_fast.engine import Engine, Settings
from pope_fast.engine.images import reencoded

pytestmark = pytest.mark.slow  # the registry's tiny Gemma 3 and LLaVA


def _lmms_eval_jpeg(image: Image.Image) -> bytes:
    """What encode_image_to_data_url(image_format="JPEG", convert_rgb=True, quality=85) base64-encodes."""
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
    with pytest.raises(ValueError, match="image_reencode must be one of none, jpeg85"):
        Settings(image_reencode="png")


def test_eval_under_lmms_eval_reencodes_and_score_checks_it(tiny, tmp_path):
    """`eval --protocol lmms-eval` on Qwen2-VL records image_reencode jpeg85 (and its coverage says so); `score
    --protocol lmms-eval` of a run made without it names the difference."""
    import json

    from click.testing import CliRunner
    from tinymodels import write_pope_set

    from pope_fast.cli import main

    # one question: the protocol decodes 128 tokens, which the random model never ends
    images, files = write_pope_set(tmp_path / "pope", n_images=1, splits=("random",), questions_per_image=1)
    base = ["eval", "--model", str(tiny.checkpoint("qwen2_vl")), "--images", str(images), "--questions",
            str(files[0]), "--device", "cpu"]
    runs = {}
    plain = ["--readouts", "exact_match", "--max-new-tokens", "2"]
    for name, extra in (("protocol", ["--protocol", "lmms-eval"]), ("plain", plain)):
        out = tmp_path / name
        result = CliRunner().invoke(main, [*base, "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        runs[name] = out
    meta = json.loads((runs["protocol"] / "meta.json").read_text())
    assert meta["settings"]["image_reencode"] == "jpeg85"
    assert meta["protocol_coverage"]["lmms-eval"]["image_reencode"] == "jpeg85"
    assert "image_reencode" not in json.loads((runs["plain"] / "meta.json").read_text())["settings"]
    scored = {name: CliRunner().invoke(main, ["score", str(out), "--protocol", "lmms-eval"]).output
              for name, out in runs.items()}
    assert "image_reencode" not in scored["protocol"], scored["protocol"]
    assert "this run's image_reencode is none, lmms-eval's jpeg85" in scored["plain"], scored["plain"]
