"""Checkpoint layouts the loader must read: sharded with an index, the three spellings of llava-hf
tensor names, and the built-in word-level tokenizer a fresh clone falls back to."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pope_fast.bench.synthetic import builtin_questions, synthetic_image, write_llava_checkpoint
from pope_fast.engine import Engine, Settings

QUESTIONS = [q.text for q in builtin_questions(4)]
IMAGES = [synthetic_image(40 + i, size) for i, size in enumerate([(120, 90), (64, 96)])]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The bench's tiny size (576 image tokens), transformers' own tensor names, 4 shards."""
    folder = tmp_path_factory.mktemp("sharded") / "ckpt"
    write_llava_checkpoint(folder, "tiny", dtype=torch.float32, std=0.08, shard_bytes=2 << 20)
    return folder


def test_sharded_checkpoint_with_builtin_tokenizer_matches_transformers(sharded):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    assert any(k.startswith("model.language_model.") for k in index["weight_map"])
    model = LlavaForConditionalGeneration.from_pretrained(str(sharded), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(sharded))
    engine = Engine.load(sharded, Settings(batch_size=3, max_new_tokens=6), readouts="all")
    assert sorted(engine.model.tokenizer.convert_ids_to_tokens(engine.token_sets["template_aware"].yes_ids)) == ["Yes", "yes"]
    for image in IMAGES:
        for answer in engine.score(image, QUESTIONS):
            inputs = processor(images=image, text=engine.prompt(answer.question), return_tensors="pt")
            assert (inputs["input_ids"] == engine.model.image_token_id).sum() == 576
            with torch.no_grad():
                logits = model(**inputs).logits[0, -1]
            worst = max(abs(v - float(logits[i])) for i, v in answer.candidate_logits.items())
            assert worst <= 1e-4
            assert answer.first_token_id == int(logits.argmax())


ORIGINAL_SPELLING = [("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
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
        if f.suffix == ".json" and f.name != "model.safetensors.index.json" or f.name.startswith("tokenizer"):
            (target / f.name).write_bytes(f.read_bytes())
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    assert "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight" in tensors
    a = Engine.load(sharded, Settings(), readouts="template_aware").score(IMAGES[0], QUESTIONS)
    b = Engine.load(target, Settings(), readouts="template_aware").score(IMAGES[0], QUESTIONS)
    assert [x.candidate_logits for x in a] == [y.candidate_logits for y in b]


def test_missing_shard_is_named(sharded, tmp_path):
    target = tmp_path / "broken"
    target.mkdir()
    for f in sharded.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    victim = sorted(target.glob("model-*.safetensors"))[1]
    victim.unlink()
    from pope_fast.engine import CheckpointError

    with pytest.raises(CheckpointError, match=rf"lists shard\(s\) that are missing: .*{victim.name}"):
        Engine.load(target, Settings())
