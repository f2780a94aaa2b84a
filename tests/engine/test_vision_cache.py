"""The feature cache without a model: its key changes with every input that decides an
image's features (and with none that does not), and a disk entry is served only when its
proof holds (renamed, swapped, altered or old entries are dropped, listed in `rejected` and
recomputed by the caller)."""
import io
from dataclasses import fields, replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save

from pope_fast.engine import Engine, Settings
from pope_fast.engine.utils.loader import ALIGNMENT
from pope_fast.engine.inputs.vision_cache import (ENTRY_FORMAT, VisionCache, entry_digest,
                                                  feature_key, noised_key,
                                           tensor_fingerprint, vision_fingerprint)
from pope_fast.readout.tool_steps import ANSWER_CUTS

IMAGE = bytes(range(256)) * 40
PROCESSOR = {"processor": {"size": {"shortest_edge": 336}, "image_mean": [0.481, 0.458, 0.408],
                           "resample": 3,
                           "do_center_crop": True}, "backend": "CLIPImageProcessorPil"}
TENSORS = {"vision.a.weight": torch.randn(30, 41), "vision.b.bias": torch.randn(7)}


def _on_cuda(settings: Settings) -> Settings:
    """settings as a CUDA machine's: built past the check that this machine has one (the key reads
    only the type)."""
    object.__setattr__(settings, "device", "cuda")
    return settings


# Every Settings field, and settings that differ from a base in it alone: (base, changed).
FP16 = Settings(dtype="fp16")
NF4 = Settings(dtype="fp16", quant="nf4")
DECIDE_FEATURES = {
    # the dtype fixed: CUDA's default is fp16
    "device": (Settings(dtype="fp32"), _on_cuda(Settings(dtype="fp32"))),
    "dtype": (Settings(), Settings(dtype="bf16")),
    "quant": (FP16, NF4),
    "nf4_weights": (NF4, replace(NF4, nf4_weights="packed")),
    "kernels": (Settings(), Settings(kernels="torch")),
    "image_aspect": (Settings(), Settings(image_aspect="pad")),
    "image_reencode": (Settings(), Settings(image_reencode="jpeg85")),
    "image_resize": (Settings(), Settings(image_resize="qwen_vl_utils:28")),
    "processor_pixels": (Settings(), Settings(processor_pixels="3136:12845056")),
    "processor_patches": (Settings(), Settings(processor_patches="1:12")),
}
LEAVE_FEATURES = {  # the language model's and the sweep's: a run changing them reuses the cache
    "quantize_lm_head": True, "batch_size": 3, "image_batch": 2, "max_new_tokens": 5,
    "min_new_tokens": 1, "generation_config": "greedy", "repetition_penalty": 1.5, "num_beams": 5,
    "length_penalty": 0.5, "max_length": 256, "answer_cut": next(iter(ANSWER_CUTS)),
    "image_mask": "causal", "prefix_reuse": False, "probe": "image-attention", "record_mass": True,
    "do_sample": True, "temperature": 0.7, "top_k": 50, "top_p": 0.9, "seed": 5,
    "thinking": "decode:max_tokens=8",
}


def key_of(settings: Settings, image: bytes = IMAGE, processor: dict = PROCESSOR,
           tensors=TENSORS) -> str:
    """An image's key as the engine makes it: the family's fingerprint is vision_fingerprint
    of its settings."""
    return feature_key(image, processor, settings, vision_fingerprint(tensors, settings))


def test_every_setting_is_either_in_the_key_or_named_as_leaving_features_alone():
    names = {f.name for f in fields(Settings)}
    assert not set(DECIDE_FEATURES) & set(LEAVE_FEATURES)
    assert set(DECIDE_FEATURES) | set(LEAVE_FEATURES) == names, \
        "a new setting: does it change the features?"


@pytest.mark.parametrize("name", sorted(DECIDE_FEATURES))
def test_a_setting_that_decides_the_features_changes_the_key(name):
    base, changed = DECIDE_FEATURES[name]
    assert [f.name for f in fields(Settings)
            if getattr(base, f.name) != getattr(changed, f.name)] == [name]
    assert key_of(changed) != key_of(base)


@pytest.mark.parametrize("name", sorted(LEAVE_FEATURES))
def test_a_setting_of_the_language_model_keeps_the_key(name):
    assert key_of(Settings(**{name: LEAVE_FEATURES[name]})) == key_of(Settings())


def test_the_engine_keys_each_image_by_its_own_settings():
    """Engine.prepare's key is key_of its settings (a stand-in family: the key path
    alone, no weights)."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(buf, format="PNG")
    for settings in [Settings()] + [s for pair in DECIDE_FEATURES.values() for s in pair] + [
            Settings(**{name: value}) for name, value in LEAVE_FEATURES.items()]:
        engine = Engine.__new__(Engine)
        engine.settings, engine.cache, engine._processor = settings, VisionCache(), PROCESSOR
        engine.model = SimpleNamespace(feature_fingerprint=vision_fingerprint(TENSORS, settings),
                                       preprocess=np.asarray)
        [prepared] = engine.prepare([buf.getvalue()])
        assert prepared.key == key_of(settings, image=buf.getvalue()), settings


def test_the_key_covers_every_byte_of_the_image():
    base = key_of(Settings())
    assert key_of(Settings(), image=IMAGE) == base
    for index in (0, len(IMAGE) // 2 + 1, len(IMAGE) - 1):
        edited = bytearray(IMAGE)
        edited[index] ^= 1
        assert key_of(Settings(), image=bytes(edited)) != base
    assert key_of(Settings(), image=IMAGE + b"\0") != base


@pytest.mark.parametrize("edit", [
    lambda p: p["processor"]["size"].update(shortest_edge=337),
    lambda p: p["processor"]["image_mean"].__setitem__(2, 0.409),
    lambda p: p["processor"].update(resample=2),
    lambda p: p["processor"].update(do_center_crop=False),
    lambda p: p["processor"].update(do_pad=True),
    lambda p: p.update(backend="CLIPImageProcessor"),
], ids=["size", "mean", "resample", "crop", "new-field", "backend"])
def test_the_key_covers_every_field_of_the_processor(edit):
    processor = {"processor": {k: (dict(v) if isinstance(v, dict) else list(v)
                                   if isinstance(v, list) else v)
                               for k, v in PROCESSOR["processor"].items()},
                               "backend": PROCESSOR["backend"]}
    assert key_of(Settings(), processor=processor) == key_of(Settings())
    edit(processor)
    assert key_of(Settings(), processor=processor) != key_of(Settings())


def test_the_key_covers_the_model_fingerprint():
    settings = Settings()
    base = feature_key(IMAGE, PROCESSOR, settings, vision_fingerprint(TENSORS, settings))
    assert feature_key(IMAGE, PROCESSOR, settings,
                       vision_fingerprint(TENSORS, settings, feature_layer=-2)) != base
    edited = {k: v.clone() for k, v in TENSORS.items()}
    edited["vision.b.bias"][3] += 1e-3
    assert feature_key(IMAGE, PROCESSOR, settings, vision_fingerprint(edited, settings)) != base


def test_a_noised_copy_has_a_key_of_its_own_per_image_step_and_seed():
    key, other = key_of(Settings()), key_of(Settings(), image=IMAGE + b"\0")
    keys = [noised_key(k, step, seed) for k in (key, other) for step in (1, 500, 999)
            for seed in (0, 1, 7)]
    assert len(set(keys) | {key, other}) == len(keys) + 2
    assert noised_key(key, 500, 1) == noised_key(key, 500, 1)


def test_vision_fingerprint_sees_an_edit_anywhere():
    tensors = {"a.weight": torch.randn(300, 41), "b.bias": torch.randn(7)}
    base = tensor_fingerprint(tensors)
    # the old sample (both 2048-element ends, every 4099th) missed 5000
    for index in (0, 5000, 12299):
        edited = {k: v.clone() for k, v in tensors.items()}
        edited["a.weight"].view(-1)[index] += 1e-3
        assert tensor_fingerprint(edited) != base
    assert tensor_fingerprint({k: v.clone() for k, v in tensors.items()}) == base
    assert tensor_fingerprint(tensors, extra={"dtype": "bf16"}) != base
    assert tensor_fingerprint({"a.weight": tensors["a.weight"],
                               "c.bias": tensors["b.bias"]}) != base  # a name
    # a shape
    assert tensor_fingerprint({**tensors, "a.weight": tensors["a.weight"].reshape(41, 300)}) != base
    # a dtype
    assert tensor_fingerprint({**tensors, "b.bias": tensors["b.bias"].view(torch.int32)}) != base


# --- each disk entry's proof
# -----------------------------------------------------------------------------------

def _filled(tmp_path, n=2) -> tuple[dict[str, torch.Tensor], VisionCache]:
    """n entries written to a disk cache, and the features each was written with, by key."""
    cache = VisionCache(tmp_path / "cache")
    written = {key_of(Settings(), image=bytes([i]) + IMAGE): torch.randn(9, 5) for i in range(n)}
    for key, features in written.items():
        cache.put(key, features)
    return written, cache


def _served(cache_dir, key):
    """What a fresh cache (a later run) makes of the entry: its features or None, and
    why where rejected."""
    cache = VisionCache(cache_dir)
    features = cache.get(key, torch.device("cpu"))
    return features, [why for _, why in cache.rejected]


def test_an_entry_is_served_bit_for_bit_by_a_later_run(tmp_path):
    written, cache = _filled(tmp_path)
    for key, features in written.items():
        got, rejected = _served(cache.dir, key)
        assert torch.equal(got, features) and rejected == []


def test_swapped_entries_are_recomputed_not_served(tmp_path):
    written, cache = _filled(tmp_path)
    a, b = (cache.dir / f"{key}.safetensors" for key in written)
    data_a = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data_a)
    for key, path in zip(written, (a, b)):
        assert _served(cache.dir, key) == (None, ["written for another key (renamed or swapped)"])
        assert not path.exists()  # dropped: the run's put writes it afresh


@pytest.mark.parametrize("offset", [-1, -90, -180], ids=["last", "middle", "first"])
def test_an_entry_whose_tensor_bytes_changed_is_recomputed(tmp_path, offset):
    """A byte flipped in the tensor data (9x5 fp32: its last 180 bytes), the header intact."""
    written, cache = _filled(tmp_path, n=1)
    [key] = written
    path = cache.dir / f"{key}.safetensors"
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    assert load_file(str(path))["features"].shape == (9, 5)  # still a well-formed file
    assert _served(cache.dir, key) == (None, ["altered since written"])


def test_the_digest_covers_the_key_and_the_shape(tmp_path):
    """An entry renamed with its recorded key edited to match, or its tensor stored in another shape
    under the same proof, fails its digest."""
    written, cache = _filled(tmp_path)
    (a, features), (b, _) = written.items()
    proof = {"format": ENTRY_FORMAT, "key": b, "digest": entry_digest(a, features)}
    (cache.dir / f"{b}.safetensors").write_bytes(save({"features": features}, metadata=proof))
    assert _served(cache.dir, b) == (None, ["altered since written"])
    proof = {"format": ENTRY_FORMAT, "key": a, "digest": entry_digest(a, features)}
    (cache.dir / f"{a}.safetensors").write_bytes(save({"features": features.reshape(5, 9)},
                                                      metadata=proof))
    assert _served(cache.dir, a) == (None, ["altered since written"])


def test_an_entry_without_a_proof_or_unreadable_is_recomputed(tmp_path):
    written, cache = _filled(tmp_path)
    (a, features), (b, _) = written.items()
    # as entries were written before
    (cache.dir / f"{a}.safetensors").write_bytes(save({"features": features}))
    assert _served(cache.dir, a) == (None, ["written before entries carried a proof"])
    path = cache.dir / f"{b}.safetensors"
    path.write_bytes(path.read_bytes()[:50])
    assert _served(cache.dir, b) == (None, ["unreadable (truncated or garbled)"])


def test_a_rejected_entry_is_rewritten_with_its_proof(tmp_path):
    written, cache = _filled(tmp_path, n=1)
    [(key, features)] = written.items()
    path = cache.dir / f"{key}.safetensors"
    path.write_bytes(save({"features": features + 1}))
    again = VisionCache(cache.dir)
    assert again.get(key, torch.device("cpu")) is None and not again.contains(key)
    again.put(key, features)
    assert _served(cache.dir, key)[1] == [] and torch.equal(_served(cache.dir, key)[0], features)
    assert (again.misses, again.disk_hits, len(again.rejected)) == (1, 0, 1)


def test_a_served_entry_starts_where_torchs_allocator_puts_tensors(tmp_path):
    """Read back at its file's offset, an entry would reach the projector's matmul misaligned, and
    a CPU can sum a misaligned operand in another order than the fresh features of a run without
    the cache (engine/utils/loader.py)."""
    features = torch.arange(3 * 5, dtype=torch.float32).reshape(3, 5)
    VisionCache(tmp_path).put("k" * 7, features)
    served = VisionCache(tmp_path).get("k" * 7, torch.device("cpu"))
    assert served.data_ptr() % ALIGNMENT == 0 and torch.equal(served, features)
