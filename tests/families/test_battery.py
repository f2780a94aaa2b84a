"""The checks every family makes against its transformers class (familychecks), parametrized over
the registry: one test function per check, one case per family it applies to (registry.Family says
which and how). A family's quirks are its own file's."""
from types import SimpleNamespace

import pytest
import torch
from familychecks import (assert_continuations_match, assert_nf4_matches,
                          assert_probe_matches_eager,
                          assert_run_matches, assert_scores_match, image_items, transformers_oracle)
from methodchecks import check_methods, formula_oracle
from registry import EXEMPT, REGISTRY
from tinymodels import QUESTIONS, bnb_nf4_oracle, worst_difference

from pope_fast.engine import Engine, Settings
from pope_fast.engine.models import FAMILIES, family_class, family_of, misfit


# What the checks of logits and first tokens decode: one step on each case's batches (they assert
# nothing of it; a continuation is test_continuations'), each further step a full-vocabulary argmax
# per row.
LOGITS_ONLY = 2


def _path(reuse: bool) -> str:
    return "prefix" if reuse else "whole"


def _cases(field: str):
    """pytest params (family, prefix_reuse, batch_size) of every family's (prefix_reuse, batch_size)
    cases of one check, named like logits[qwen2_vl-prefix-b2]."""
    return [pytest.param(name, reuse, batch, id=f"{name}-{_path(reuse)}-b{batch}")
            for name, f in REGISTRY.items() for reuse, batch in getattr(f, field)]


def _families(applies):
    return [pytest.param(name, id=name) for name, f in REGISTRY.items() if applies(f)]


def _images(family, indices):
    return [family.images[i] for i in indices]


@pytest.mark.slow
@pytest.mark.parametrize("family, prefix_reuse, batch_size", _cases("logits"), indirect=["family"])
def test_logits(family, family_checkpoint, family_oracle, prefix_reuse, batch_size):
    """engine.answer, one image at a time: candidate logits within 1e-4 of the oracle's, the first
    token its argmax and generate's first."""
    settings = Settings(batch_size=batch_size, prefix_reuse=prefix_reuse,
                        max_new_tokens=LOGITS_ONLY)
    engine = Engine.load(family_checkpoint, settings, readouts="all")
    if family.template is not None:
        assert engine.template.name == family.template
    assert_scores_match(engine, family_oracle, family.images, family.oracle_questions)


@pytest.mark.slow
@pytest.mark.parametrize("family", _families(lambda f: f.counts_image_tokens), indirect=True)
def test_image_tokens(family, family_checkpoint, family_oracle):
    """The engine's features are as many as the image tokens transformers' processor wrote into the
    prompt."""
    engine = Engine.load(family_checkpoint, Settings(), readouts="template_aware")
    for i, image in enumerate(family.images):
        tokens = family_oracle[i, family.oracle_questions[0]][2].count(engine.model.image_token_id)
        assert engine.features(image).shape[0] == tokens, \
            f"image {i}: transformers has {tokens} image tokens"


@pytest.mark.slow
@pytest.mark.parametrize("family, prefix_reuse, batch_size", _cases("run"), indirect=["family"])
def test_batched_run(family, family_checkpoint, family_oracle, prefix_reuse, batch_size):
    """One engine.run_images over every image: a batch whose question rows span images (prefixes of
    different lengths or layouts, as the family's run_items says), or whole prompts of different
    images in one batch."""
    settings = Settings(batch_size=batch_size, prefix_reuse=prefix_reuse,
                        max_new_tokens=LOGITS_ONLY)
    engine = Engine.load(family_checkpoint, settings, readouts="all")
    items = image_items(engine, family.images, family.oracle_questions)
    if family.run_items is not None:
        family.run_items(items)
    assert_run_matches(engine, family_oracle, items, family.oracle_questions)


def _continuation_cases():
    return [pytest.param(name, settings, id=f"{name}-{_path(settings.get('prefix_reuse', True))}")
            for name, f in REGISTRY.items() for settings in f.continuations]


@pytest.mark.slow
@pytest.mark.parametrize("family, settings", _continuation_cases(), indirect=["family"])
def test_continuations(family, family_checkpoint, family_oracle, settings):
    """The text readouts' continuation (4 new tokens) is generate's, up to the first stop id."""
    engine = Engine.load(family_checkpoint, Settings(max_new_tokens=4, **settings),
                         readouts=family.text_readouts)
    images = family.images[:family.continuation_images]
    assert_continuations_match(engine, family_oracle, images, family.oracle_questions)


def _probe_cases():
    return [pytest.param(name, reuse, batch, id=f"{name}-{_path(reuse)}-b{batch}")
            for name, f in REGISTRY.items() if f.probe for reuse, batch in ((True, 1), (False, 2))]


@pytest.mark.slow
@pytest.mark.parametrize("family, prefix_reuse, batch_size", _probe_cases(), indirect=["family"])
def test_probe(family, family_checkpoint, prefix_reuse, batch_size):
    """The image-attention probe at the answer position, per layer and head, against transformers'
    eager attention summed over the image tokens."""
    model = family.transformers_class().from_pretrained(str(family_checkpoint), dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    settings = Settings(probe="image-attention", prefix_reuse=prefix_reuse, batch_size=batch_size)
    engine = Engine.load(family_checkpoint, settings, readouts="template_aware")
    assert_probe_matches_eager(engine, model, family.inputs_of(family_checkpoint),
                               _images(family, family.probe), QUESTIONS[:2])


@pytest.mark.slow
@pytest.mark.parametrize("family", _families(lambda f: f.nf4 is not None), indirect=True)
def test_nf4(family, tmp_path):
    """NF4 as transformers quantizes the family, against transformers + bitsandbytes on CPU (see
    engine/test_engine_nf4 for the two CPU caveats): the family's own check of what stays dense,
    then tinymodels.assert_matches_nf4_oracle per answer."""
    checkpoint = family.make(tmp_path / "ckpt", **family.nf4.make)
    model = bnb_nf4_oracle(family.transformers_class(), checkpoint)
    engine = Engine.load(checkpoint,
                         Settings(quant="nf4", dtype="fp16", max_new_tokens=LOGITS_ONLY),
                         readouts="all")
    if family.nf4.check is not None:
        family.nf4.check(engine, model)
    assert_nf4_matches(engine, model, family.inputs_of(checkpoint),
                       _images(family, family.nf4.images), QUESTIONS[:3])


@pytest.fixture(scope="session")
def methods_oracle(family, family_checkpoint):
    """test_methods' oracle (its PAI attention under the model's own mask) on the family's reference
    inputs."""
    return formula_oracle(family_checkpoint, family.transformers_class(), family.inputs_of)


@pytest.mark.slow
@pytest.mark.parametrize("family, prefix_reuse, batch_size", _cases("methods"), indirect=["family"])
def test_methods(family, family_checkpoint, methods_oracle, prefix_reuse, batch_size):
    """VCD, PAI and ICD as test_methods checks them on LLaVA, through the family's processor (its
    images' crops or tiles noised, ICD's instruction as a system turn, the text-only prompt without
    the image), on both paths."""
    engine = Engine.load(family_checkpoint,
                         Settings(prefix_reuse=prefix_reuse, batch_size=batch_size),
                         readouts="template_aware")
    check_methods(engine, methods_oracle)


@pytest.mark.parametrize("name", ["gemma3", "gemma4", "idefics3"])
@pytest.mark.parametrize("stored", [True, False], ids=["lm_head-stored", "no-lm_head"])
def test_a_stored_lm_head_unties_a_config_that_ties(name, stored, tmp_path):
    """These families tie lm_head to the embeddings where config.json says so, or (Gemma's) does not
    say, unless the checkpoint stores an lm_head all the same: transformers 5 then reads that
    one."""
    from safetensors.torch import save_file

    tensors = {"model.language_model.embed_tokens.weight": torch.zeros(4, 2)}
    tensors.update({"lm_head.weight": torch.ones(4, 2)} if stored else {})
    save_file(tensors, str(tmp_path / "model.safetensors"))
    family = object.__new__(family_class(name))  # tied() reads the folder and the config only
    family.folder = tmp_path
    family.config = SimpleNamespace(tie_word_embeddings=True, text_config=SimpleNamespace())
    assert family.tied() is not stored


@pytest.mark.slow
@pytest.mark.parametrize("family", _families(lambda f: f.tied is not None), indirect=True)
def test_tied_head(family, tmp_path):
    """A checkpoint without lm_head (the small published ones tie it) loads and matches the oracle.
    """
    from safetensors import safe_open

    checkpoint = family.make(tmp_path / "ckpt", seed=3, tied=True)
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(k.endswith("embed_tokens.weight") for k in names) \
        and not any("lm_head" in k for k in names)
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1), readouts="all")
    image = family.images[family.tied]
    model = family.transformers_class().from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    oracle = transformers_oracle(model, family.inputs_of(checkpoint), engine.prompt, [image],
                                 QUESTIONS[:2], new_tokens=1)
    for answer in engine.answer(image, QUESTIONS[:2]):
        logits, _, _ = oracle[0, answer.question]
        worst, at = worst_difference(answer.candidate_logits, logits)
        assert worst <= 1e-4 and answer.first_token_id == int(logits.argmax()), \
            (answer.question, at, worst)


@pytest.mark.slow
@pytest.mark.parametrize("family", _families(lambda f: f.pad_refusal is not None), indirect=True)
def test_pad_aspect_is_refused(family, family_checkpoint):
    with pytest.raises(ValueError, match=family.pad_refusal):
        Engine.load(family_checkpoint, Settings(image_aspect="pad"))


def _first_path(config: dict, key: str, path: tuple = ()) -> tuple | None:
    """Where `key` first occurs in a nested config: its path of keys."""
    for k, v in config.items():
        if k == key:
            return (*path, k)
        if isinstance(v, dict) and (found := _first_path(v, key, (*path, k))):
            return found
    return None


@pytest.mark.slow
@pytest.mark.parametrize("family", _families(lambda f: True), indirect=True)
@pytest.mark.parametrize("field, value",
                         [("num_attention_heads", 0), ("hidden_size", -64), ("patch_size", 0),
                          ("num_hidden_layers", True), ("vocab_size", "many")])
def test_a_config_field_no_real_checkpoint_has_is_refused_at_load(family, family_checkpoint,
                                                                  tmp_path, field, value):
    """Each family's config.json with one size a real checkpoint never has (zero, negative, not a
    number), wherever the family's config nests it: refused at load in one line naming the file and
    the field's path, before any weight is read (loader.check_config, for every family at once)."""
    import json
    import re
    import shutil

    from pope_fast.engine.utils.loader import CheckpointError

    folder = shutil.copytree(family_checkpoint, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    path = _first_path(config, field)
    if path is None:
        pytest.skip(f"{family.name}'s config has no {field}")
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (folder / "config.json").write_text(json.dumps(config))
    named = re.escape(f"config.json: {'.'.join(path)} is {value!r}; "
                      "every real checkpoint's is a positive number")
    with pytest.raises(CheckpointError, match=named):
        Engine.load(folder, Settings())


@pytest.mark.parametrize("model_type", [t for t in FAMILIES if family_class(t).inner_types])
def test_each_family_declares_the_inner_types_transformers_builds(model_type):
    """What a family implements inside (its language model's and tower's model_types) is what
    transformers' config class of its model_type builds there: the one type of a fixed sub-config
    class, each declared one of a sub-config chosen by its own model_type; a checkpoint that names
    each is the family's."""
    from transformers import CONFIG_MAPPING

    cls, config_class = family_class(model_type), CONFIG_MAPPING[model_type]
    assert set(cls.inner_types) == {"text_config", "vision_config"}, model_type
    for name, types in cls.inner_types.items():
        # None: chosen by the sub-config's own
        fixed = getattr(config_class.sub_configs[name], "model_type", None)
        assert types == (fixed,) if fixed else all(t in CONFIG_MAPPING for t in types), \
            (name, types)
        for inner in types:
            named = {other: {"model_type": kinds[0]} for other, kinds in cls.inner_types.items()}
            config = {"model_type": model_type, **named, name: {"model_type": inner}}
            assert family_of(config) is cls, (name, inner)


def test_a_family_is_recognised_by_its_config_class_defaults_too():
    """A sub-config without a model_type is the class's default: InstructBLIP's is OPT (the FLAN-T5
    and OPT checkpoints), which the engine's InstructBLIP-Vicuna does not implement; LLaVA's, Vicuna
    and CLIP, it does."""
    assert misfit({"model_type": "instructblip"}) == (
        "model_type 'instructblip' with text_config 'opt' and vision_config "
        "'instructblip_vision_model': the engine's InstructBLIP implements "
        "text_config 'llama' and vision_config 'instructblip_vision_model'")
    assert family_of({"model_type": "instructblip"}) is None
    assert family_of({"model_type": "llava"}) is family_class("llava")
    siglip = {"model_type": "llava_next", "vision_config": {"model_type": "siglip_vision_model"}}
    assert "vision_config 'siglip_vision_model'" in misfit(siglip)


def test_every_registered_family_is_in_the_battery():
    """A family registered in engine/models is checked against its transformers class by every check
    here, or exempt with its reason: a new family cannot land untested by forgetting its registry
    line (vLLM's test_hf_registry_coverage)."""
    assert set(REGISTRY) | set(EXEMPT) == set(FAMILIES), \
        set(FAMILIES) ^ (set(REGISTRY) | set(EXEMPT))
    assert not set(REGISTRY) & set(EXEMPT) and all(EXEMPT.values())
    for name, family in REGISTRY.items():
        assert family.transformers_class().__name__ == family.model_class, name
