"""Checkpoint layouts the loader must read: sharded with an index, the three spellings of llava-hf
tensor names, and the built-in word-level tokenizer a fresh clone falls back to."""
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pope_fast.engine.synthetic import llava as llava_checkpoints
from pope_fast.engine.synthetic import builtin_questions, synthetic_image
from pope_fast.engine import Engine, Settings

pytestmark = pytest.mark.slow  # tiny checkpoints written and loaded, the engine run on them

QUESTIONS = [q.text for q in builtin_questions(4)]
IMAGES = [synthetic_image(40 + i, size) for i, size in enumerate([(120, 90), (64, 96)])]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The bench's tiny size (576 image tokens), transformers' own tensor names, 4 shards."""
    folder = tmp_path_factory.mktemp("sharded") / "ckpt"
    llava_checkpoints.write_checkpoint(folder, "tiny", dtype=torch.float32, std=0.08,
                                       shard_bytes=2 << 20)
    return folder


def test_sharded_checkpoint_with_builtin_tokenizer_matches_transformers(sharded):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    assert any(k.startswith("model.language_model.") for k in index["weight_map"])
    model = LlavaForConditionalGeneration.from_pretrained(str(sharded), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(sharded))
    engine = Engine.load(sharded, Settings(batch_size=3, max_new_tokens=6), readouts="all")
    yes_ids = engine.readout.token_sets["template_aware"].yes_ids
    assert sorted(engine.model.tokenizer.convert_ids_to_tokens(yes_ids)) == ["Yes", "yes"]
    for image in IMAGES:
        for answer in engine.answer(image, QUESTIONS):
            inputs = processor(images=image, text=engine.prompt(answer.question),
                               return_tensors="pt")
            assert (inputs["input_ids"] == engine.model.image_token_id).sum() == 576
            with torch.no_grad():
                logits = model(**inputs).logits[0, -1]
            worst = max(abs(v - float(logits[i])) for i, v in answer.candidate_logits.items())
            assert worst <= 1e-4
            assert answer.first_token_id == int(logits.argmax())


ORIGINAL_SPELLING = [("model.language_model.", "language_model.model."),
                     ("lm_head.", "language_model.lm_head."),
                     ("model.vision_tower.", "vision_tower.vision_model."),
                     ("model.multi_modal_projector.", "multi_modal_projector.")]


def test_original_llava_hf_tensor_names_load_to_the_same_model(sharded, tmp_path):
    """llava-hf's hub checkpoints predate transformers' refactor: language_model.model.*,
    language_model.lm_head.*, vision_tower.vision_model.*; one unsharded file."""
    tensors = {}
    for shard in sorted(sharded.glob("*.safetensors")):
        for name, tensor in load_file(str(shard)).items():
            for new, old in ORIGINAL_SPELLING:
                if name.startswith(new):
                    name = old + name[len(new):]
                    break
            tensors[name] = tensor
    target = tmp_path / "original"
    target.mkdir()
    for f in sharded.iterdir():
        if (f.suffix == ".json" and f.name != "model.safetensors.index.json"
                or f.name.startswith("tokenizer")):
            (target / f.name).write_bytes(f.read_bytes())
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    assert "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight" in tensors
    a = Engine.load(sharded, Settings(), readouts="template_aware").answer(IMAGES[0], QUESTIONS)
    b = Engine.load(target, Settings(), readouts="template_aware").answer(IMAGES[0], QUESTIONS)
    assert [x.candidate_logits for x in a] == [y.candidate_logits for y in b]


def test_missing_shard_is_named(sharded, tmp_path):
    target = tmp_path / "broken"
    target.mkdir()
    for f in sharded.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    victim = sorted(target.glob("model-*.safetensors"))[1]
    victim.unlink()
    from pope_fast.engine import CheckpointError

    with pytest.raises(CheckpointError,
                       match=rf"lists shard\(s\) that are missing: .*{victim.name}"):
        Engine.load(target, Settings())


# PyTorch .bin checkpoints (older hub checkpoints ship only these) and unreadable weight files.

def resave_as_bin(source, target, shards: int):
    """The same tensors as torch.save'd pytorch_model*.bin files: `shards` files with an index, or
    one pytorch_model.bin without."""
    tensors = {}
    for f in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    target.mkdir()
    for f in source.iterdir():
        if not f.name.startswith("model") or ".safetensors" not in f.name:
            (target / f.name).write_bytes(f.read_bytes())
    if shards == 1:
        torch.save(tensors, target / "pytorch_model.bin")
        return target
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        fname = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = names[i::shards]
        torch.save({n: tensors[n] for n in part}, target / fname)
        weight_map.update({n: fname for n in part})
    (target / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {},
                                                                     "weight_map": weight_map}))
    return target


@pytest.fixture(scope="module")
def tiny_llava(tiny):
    # the registry's (make_tiny_llava's defaults); each test changes a copy
    return tiny.checkpoint("llava")


@pytest.fixture(scope="module")
def tiny_bin(tiny_llava, tmp_path_factory):
    return resave_as_bin(tiny_llava, tmp_path_factory.mktemp("bin") / "sharded", shards=3)


@pytest.mark.parametrize("shards", [1, 3])
def test_bin_checkpoint_loads_to_identical_answers(tiny_llava, tmp_path, shards):
    folder = resave_as_bin(tiny_llava, tmp_path / "bin", shards)
    assert not list(folder.glob("*.safetensors")) and len(list(folder.glob("*.bin"))) == shards
    a = Engine.load(tiny_llava, Settings(), readouts="all").answer(IMAGES[0], QUESTIONS)
    b = Engine.load(folder, Settings(), readouts="all").answer(IMAGES[0], QUESTIONS)
    assert [x.candidate_logits for x in a] == [y.candidate_logits for y in b]
    assert [x.first_token_id for x in a] == [y.first_token_id for y in b]
    # real, varied values
    assert len({round(v, 3) for x in a for v in x.candidate_logits.values()}) > 4


def broken_copy(source, target):
    target.mkdir()
    for f in source.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    return target


def load_error(folder) -> str:
    from pope_fast.engine import CheckpointError

    with pytest.raises(CheckpointError) as err:
        Engine.load(folder, Settings())
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_bin_shard_is_named(tiny_bin, tmp_path):
    folder = broken_copy(tiny_bin, tmp_path / "broken")
    (folder / "pytorch_model-00002-of-00003.bin").unlink()
    assert re.search(r"pytorch_model\.bin\.index\.json lists shard\(s\) that are missing: .*"
                     r"pytorch_model-00002-of-00003\.bin", load_error(folder))


def test_tensor_missing_from_its_shard_is_named(tiny_bin, tmp_path):
    folder = broken_copy(tiny_bin, tmp_path / "broken")
    shard = folder / "pytorch_model-00001-of-00003.bin"
    tensors = torch.load(shard, weights_only=True)
    victim = sorted(tensors)[1]
    del tensors[victim]
    torch.save(tensors, shard)
    message = load_error(folder)
    assert str(shard) in message and victim in message and "missing" in message


def test_tensor_missing_from_the_checkpoint_is_named(tiny_bin, tmp_path):
    folder = broken_copy(tiny_bin, tmp_path / "broken")
    index = json.loads((folder / "pytorch_model.bin.index.json").read_text())
    del index["weight_map"]["language_model.lm_head.weight"]
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    assert re.search(r"missing tensors: lm\.lm_head\.weight", load_error(folder))


@pytest.mark.parametrize("layout", ["bin", "safetensors"])
def test_truncated_shard_is_named(tiny_bin, tiny_llava, tmp_path, layout):
    folder = broken_copy(tiny_bin if layout == "bin" else tiny_llava, tmp_path / "broken")
    shard = sorted(folder.glob("*.bin" if layout == "bin" else "*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) * 2 // 3])
    message = load_error(folder)
    assert message.startswith(f"{shard}: unreadable") and ("cut short" in message
                                                           or layout == "safetensors")


def test_bin_holding_other_objects_is_refused(tiny_bin, tmp_path):
    folder = broken_copy(tiny_bin, tmp_path / "broken")
    shard = folder / "pytorch_model-00003-of-00003.bin"
    tensors = torch.load(shard, weights_only=True)
    # not a tensor: unpickling it would run a constructor
    torch.save({**tensors, "extra": Path("/")}, shard)
    assert load_error(folder).startswith(f"{shard}: holds objects other than tensors")


@pytest.mark.parametrize("index_text, expected", [
    ('{"metadata": {}}', r"pytorch_model\.bin\.index\.json: no weight_map object"),
    ('{"weight_map": {"lm_head.weight": "pytorch_model-00001-of-00003.bin",\n}',
     r"pytorch_model\.bin\.index\.json:2: malformed JSON"),
    ('[1, 2]', r"pytorch_model\.bin\.index\.json: expected a JSON object"),
])
def test_bad_index_is_named(tiny_bin, tmp_path, index_text, expected):
    folder = broken_copy(tiny_bin, tmp_path / "broken")
    (folder / "pytorch_model.bin.index.json").write_text(index_text)
    assert re.search(expected, load_error(folder))


@pytest.mark.parametrize("model_type, says", [
    ("glm4v_moe",
     r"'glm4v_moe' is not supported \(Glm4vMoeForConditionalGeneration\): the engine does not "
                  r"implement mixture-of-experts MLP layers"),
    ("kosmos-2",
     r"'kosmos-2' is not supported \(Kosmos2ForConditionalGeneration\): no family module "
     r"implements it"),
    ("bert", r"'bert' is not supported \(supported: llava, "),
])
def test_a_model_without_a_family_is_refused_naming_what_is_missing(tmp_path, model_type, says):
    """A transformers class whose pieces the engine lacks says which; one it could host says no
    family module implements it; a model_type transformers has no vision-language class for says
    only that. One line."""
    from pope_fast.engine.utils.loader import CheckpointError
    from pope_fast.engine.models import load_model

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(CheckpointError, match=says) as err:
        load_model(tmp_path, Settings())
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{tmp_path}/config.json: "
                                                                    f"model_type")
