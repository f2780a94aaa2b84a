"""Mitigation methods (engine.methods) against transformers' LLaVA computing each paper's formula
directly: the noised image built with the same noise, the text-only prompt, PAI's edit in eager
attention, ICD's system instruction."""
import json
import math
from functools import lru_cache

import numpy as np
import pytest
import torch
from methodchecks import (IMAGES, avisc_oracle, check_methods, clearsight_oracle, formula_oracle,
                          sid_oracle, vista_oracle)
from tinymodels import QUESTIONS, make_tiny_llava, make_tiny_qwen2_5_vl

from pope_fast.engine import Engine, ImageTokenDrop, Settings, TextOnlyRefused, VisualAmplification
from pope_fast.engine.methods import (DIFFUSION_STEPS, ICD, PAI, VCD, Baseline, diffusion_alpha_bar,
                                      diffusion_noise, parse_method)

pytestmark = pytest.mark.slow  # the engine on tiny checkpoints, against transformers



@pytest.fixture(scope="module")
def checkpoint(tiny):
    return tiny.checkpoint("llava")


@pytest.fixture(scope="module")
def qwen_checkpoint(tiny):
    return tiny.checkpoint("qwen2_vl")


@pytest.fixture(scope="module")
def qwen25_checkpoint(tiny):
    return tiny.checkpoint("qwen2_5_vl")


# per checkpoint: a Qwen tokenizer takes about a second to load, and three checks ask
@lru_cache(maxsize=None)
def _llava_inputs(checkpoint):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(checkpoint))
    return lambda image, prompt: dict(processor(images=image, text=prompt, return_tensors="pt"))


@lru_cache(maxsize=None)
def _qwen_inputs(checkpoint):
    """What Qwen2VLProcessor makes (its image pad expanded, mm_token_type_ids), without its video
    half."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer, image_processor = AutoTokenizer.from_pretrained(str(checkpoint)), \
        AutoImageProcessor.from_pretrained(str(checkpoint))
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def inputs(image, prompt):
        pixels = image_processor(images=image, return_tensors="pt")
        tokens = int(pixels["image_grid_thw"].prod()) // 4
        text = tokenizer(prompt.replace("<|image_pad|>", "<|image_pad|>" * tokens),
                         return_tensors="pt")
        return dict(text, **pixels, mm_token_type_ids=(text["input_ids"] == image_id).int())

    return inputs


@pytest.fixture(scope="module")
def oracle(checkpoint):
    from transformers import LlavaForConditionalGeneration

    return formula_oracle(checkpoint, LlavaForConditionalGeneration, _llava_inputs)


@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 2), (False, 3)],
                         ids=["reuse-b2", "whole-b3"])
def test_every_method_matches_its_formula_on_transformers(checkpoint, oracle, prefix_reuse,
                                                          batch_size):
    engine = Engine.load(checkpoint, Settings(prefix_reuse=prefix_reuse, batch_size=batch_size),
                         readouts="template_aware,legacy_2tok,first_token")
    check_methods(engine, oracle)


def test_every_method_matches_its_formula_on_qwen2_vl(qwen_checkpoint):
    """M-RoPE positions for the text-only prompt, a system message in a chat template, noise on
    flattened patches."""
    from transformers import Qwen2VLForConditionalGeneration

    oracle = formula_oracle(qwen_checkpoint, Qwen2VLForConditionalGeneration, _qwen_inputs)
    check_methods(Engine.load(qwen_checkpoint, Settings(batch_size=2), readouts="template_aware"),
                  oracle)


def test_every_method_matches_its_formula_on_qwen2_5_vl(qwen25_checkpoint):
    """Qwen2-VL's pipeline under Qwen2.5-VL's windowed tower: the noised patches run through the
    windows too."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    oracle = formula_oracle(qwen25_checkpoint, Qwen2_5_VLForConditionalGeneration, _qwen_inputs)
    check_methods(Engine.load(qwen25_checkpoint, Settings(batch_size=2), readouts="template_aware"),
                  oracle)


def _vti_on_transformers(model, directions: torch.Tensor, alpha: float) -> None:
    """VTI's add_vti_layers (shengliu66/VTI vti_utils/llm_layers.py:105-110) on transformers' class:
    each language-model layer's mlp output through VTILayer's arithmetic (:16-31, one direction),
    written here in float64."""
    def steer(d):
        def hook(module, args, out):
            x = out.double()
            norm = x.norm(dim=-1, keepdim=True)
            turned = x / norm + 0.1 * alpha * d / d.norm()
            return (turned / turned.norm(dim=-1, keepdim=True) * norm).to(out.dtype)
        return hook

    for layer, d in zip(model.model.language_model.layers, directions.double()):
        layer.mlp.register_forward_hook(steer(d))


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])  # issue 52's two families
def test_vti_steers_every_mlp_as_its_wrapped_layers_do_on_transformers(family, request, tmp_path):
    """VTI's one pass (prefix, question and continuation steered) against transformers' class with
    its mlps wrapped as VTI wraps them: the answer position's logits and generate's greedy
    continuation; the baseline beside it is the model's own."""
    from safetensors.torch import save_file
    from tinymodels import generated_text
    from transformers import (AutoConfig, LlavaForConditionalGeneration,
                              Qwen2_5_VLForConditionalGeneration)

    checkpoint = request.getfixturevalue("checkpoint" if family == "llava" else
                                         "qwen25_checkpoint")
    model_class, inputs_of = ((LlavaForConditionalGeneration, _llava_inputs) if family == "llava"
                              else (Qwen2_5_VLForConditionalGeneration, _qwen_inputs))
    text = AutoConfig.from_pretrained(str(checkpoint)).text_config
    directions = torch.randn(text.num_hidden_layers, text.hidden_size,
                             generator=torch.Generator().manual_seed(5))
    save_file({"text": directions}, str(tmp_path / "vti.safetensors"))
    engine = Engine.load(checkpoint, Settings(batch_size=2, max_new_tokens=4),
                         readouts="template_aware,string_parse")
    methods = [parse_method("none"),
               parse_method(f"vti:directions={tmp_path / 'vti.safetensors'},alpha=3")]
    out = engine.run_methods(engine.prepare(IMAGES), [QUESTIONS[:3]] * 2, methods)
    model = model_class.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    _vti_on_transformers(model, directions, 3.0)
    inputs_of = inputs_of(checkpoint)
    for i, image in enumerate(IMAGES):
        for q, ours, plain in zip(QUESTIONS[:3], out["vti"][i], out["none"][i]):
            inputs = inputs_of(image, engine.prompt(q))
            with torch.no_grad():
                theirs = model(**inputs).logits[0, -1]
                generated = model.generate(**inputs, max_new_tokens=4, do_sample=False)
            assert ours.first_token_id == int(theirs.argmax()), (i, q)
            for token, value in ours.candidate_logits.items():
                assert abs(value - float(theirs[token])) <= 1e-4, \
                    (i, q, token, value, float(theirs[token]))
            assert ours.decoded == generated_text(
                engine, generated[0, inputs["input_ids"].shape[1]:].tolist())
            # the steering reached the answer
            assert ours.candidate_logits != plain.candidate_logits


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])  # issue 52's two families
def test_sid_matches_its_token_drop_and_contrast_on_transformers(family, tmp_path):
    """SID (huofushuo/SID) against transformers' class in eager attention: the image tokens kept
    picked from its returned attention weights, the contrast pass with the others masked in every
    later layer for every query, the logits combined as vcd_sample.py does; beside the baseline in
    one paired run (the main pass shared). Three layers, the drop from layer 1: the image rows kept
    change in layer 1 and feed layer 2's keys, which a pass sharing the image's prefix (or editing
    only the queries after the image) would miss."""
    from transformers import LlavaForConditionalGeneration, Qwen2_5_VLForConditionalGeneration

    make, model_class, inputs_of = ((make_tiny_llava, LlavaForConditionalGeneration,
                                     _llava_inputs)
                                    if family == "llava" else
                                    (make_tiny_qwen2_5_vl, Qwen2_5_VLForConditionalGeneration,
                                     _qwen_inputs))
    checkpoint = make(tmp_path / "ckpt", layers=3)
    engine = Engine.load(checkpoint, Settings(batch_size=2), readouts="template_aware")
    methods = [parse_method("none"), parse_method("sid:layer=1,keep=3,alpha=0.7,beta=0.05")]
    out = engine.run_methods(engine.prepare(IMAGES), [QUESTIONS[:3]] * 2, methods)
    prompts = [engine.prompt(q) for q in QUESTIONS[:3]]
    oracle = sid_oracle(checkpoint, model_class, inputs_of(checkpoint), prompts, 1, 3, 0.7, 0.05)
    for i in range(len(IMAGES)):
        for prompt, ours, plain in zip(prompts, out["sid"][i], out["none"][i]):
            theirs, image_tokens, _ = oracle[i, prompt]
            assert image_tokens > 3  # tokens were dropped
            assert ours.first_token_id == int(theirs.argmax()), (i, prompt)
            for token, value in ours.candidate_logits.items():
                expected = float(theirs[token])
                assert value == expected if math.isinf(expected) else \
                    abs(value - expected) <= 1e-4, (i, prompt, token, value, expected)
            assert ours.candidate_logits != plain.candidate_logits
    # the drop as an experiment's own Intervention: prompts run whole, continuations refused
    if family == "llava":
        drop = ImageTokenDrop(1, 3)
        [alone] = engine.answer(IMAGES[0], QUESTIONS[:1], intervention=drop)
        l_cd = oracle[0, prompts[0]][2]
        assert all(abs(value - float(l_cd[token])) <= 1e-4
                   for token, value in alone.candidate_logits.items())
        texts = Engine.load(checkpoint, Settings(max_new_tokens=2), readouts="string_parse")
        with pytest.raises(ValueError, match=r"^ImageTokenDrop acts on the prompt pass only"):
            texts.answer(IMAGES[0], QUESTIONS[:1], intervention=drop)


NEWER = {"vista": "vista:vsv_lambda=0.5,logits_alpha=0.4,logits_layers=0-1",
         "clearsight": "clearsight:layers=0-0,enh_para=1.6,sup_para=0.5",
         "avisc": "avisc:layer_gamma=0.2,lamb=0.3,alpha=0.7,beta=0.05"}


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])  # issue 52's two families
def test_vista_clearsight_and_avisc_match_their_code_on_transformers(family, request):
    """Beside the baseline in one paired run, each against transformers' class computing its
    official code's arithmetic (methodchecks): VISTA (LzVv123456/VISTA) its vector from the class's
    residual streams with and without the image, every mlp steered, the logits mixed with the
    window's lm_head outputs (layer 0's without the final norm, layer 1's, the last, normed);
    ClearSight's VAF (ustc-hyin/ClearSight AttnAdapter.py) in eager attention in the first of two
    layers only (an edit of the image's or the system prompt's own queries would reach the next
    layer's keys), read at the answer position; AvisC (sangminwoo/AvisC) its layers and tokens from
    the returned attention weights, those tokens zeroed in the language model's input embeddings,
    the logits contrasted within the cut. ClearSight's continuation is refused: its edit would be
    missing from the decode steps."""
    from transformers import LlavaForConditionalGeneration, Qwen2_5_VLForConditionalGeneration

    checkpoint = request.getfixturevalue("checkpoint" if family == "llava" else
                                         "qwen25_checkpoint")
    model_class, inputs_of = ((LlavaForConditionalGeneration, _llava_inputs) if family == "llava"
                              else (Qwen2_5_VLForConditionalGeneration, _qwen_inputs))
    inputs_of = inputs_of(checkpoint)
    engine = Engine.load(checkpoint, Settings(batch_size=2, max_new_tokens=2),
                         readouts="template_aware,string_parse")
    out = engine.run_methods(engine.prepare(IMAGES[:1]), [QUESTIONS[:1]],
                             [parse_method("none"), *map(parse_method, NEWER.values())])
    prompts = [engine.prompt(q) for q in QUESTIONS[:1]]
    vista = vista_oracle(checkpoint, model_class, inputs_of, IMAGES[:1], prompts, 0.5, 0.4, (0, 1))
    clearsight = clearsight_oracle(checkpoint, model_class, inputs_of, IMAGES[:1], prompts, (0, 0),
                                   1.6, 0.5)
    avisc = avisc_oracle(checkpoint, model_class, inputs_of, IMAGES[:1], prompts, 0.2, 0.3, 0.7,
                         0.05)
    for j, prompt in enumerate(prompts):
        theirs = {"vista": vista[0, prompt], "clearsight": clearsight[0, prompt],
                  "avisc": avisc[0, prompt][0]}
        assert 0 < avisc[0, prompt][1] < avisc[0, prompt][2]  # some image tokens zeroed, not all
        plain = out["none"][0][j]
        assert plain.decoded is not None
        for name in NEWER:
            ours = out[name][0][j]
            assert ours.first_token_id == int(theirs[name].argmax()) and ours.decoded is None, \
                (name, prompt)
            for token, value in ours.candidate_logits.items():
                expected = float(theirs[name][token])
                assert value == expected if math.isinf(expected) else \
                    abs(value - expected) <= 1e-4, (name, prompt, token, value, expected)
            assert ours.candidate_logits != plain.candidate_logits, name
    with pytest.raises(ValueError,
                       match=r"^VisualAmplification scales keys on the prompt pass only"):
        engine.answer(IMAGES[0], QUESTIONS[:1],
                      intervention=VisualAmplification((0, 0), 1.6, 0.5))
    for name, why in (("vista", "baseline under VISTA's name"),
                      ("clearsight", "baseline under ClearSight's name"),
                      ("avisc", "no image to zero")):
        with pytest.raises(TextOnlyRefused,
                           match=rf"^method {name} cannot answer a text-only question .*{why}$"):
            engine.run_methods([None], [QUESTIONS[:1]], [parse_method(NEWER[name])])


def test_diffusion_noise_follows_vcds_schedule():
    betas = 1 / (1 + np.exp(-np.linspace(-6, 6, DIFFUSION_STEPS))) * (0.5e-2 - 1e-5) + 1e-5
    assert diffusion_alpha_bar(500) == pytest.approx(float(np.prod(1 - betas[:501])), rel=1e-5)
    pixels = np.full((3, 4, 4), 0.5, dtype=np.float32)
    noised = diffusion_noise((pixels, (4, 4)), 999, torch.Generator().manual_seed(0))
    assert noised[1] == (4, 4)  # integer parts pass unchanged
    a = diffusion_alpha_bar(999)
    expected = math.sqrt(a) * 0.5 + math.sqrt(1 - a) * torch.randn(
        (3, 4, 4), generator=torch.Generator().manual_seed(0))
    assert np.allclose(noised[0], expected.numpy(), atol=1e-6)


def test_a_paired_run_shares_features_and_prefixes(checkpoint):
    """none + pai reads the image's features once and prefills each prefix once (PAI's edit is at
    the answer position); vcd adds only its noised copy's encode and prefix; the text-only pass is
    run once per distinct question, however many images ask it."""
    def counts(specs):
        engine = Engine.load(checkpoint, Settings(batch_size=4), readouts="template_aware")
        engine.run_methods(engine.prepare(IMAGES), [QUESTIONS[:3], QUESTIONS[:3]],
                           [parse_method(s) for s in specs])
        return engine.counts

    alone, with_pai, with_vcd = counts(["none"]), counts(["none", "pai:layers=0-1"]), \
        counts(["none", "vcd"])
    engine = Engine.load(checkpoint, Settings(batch_size=4), readouts="template_aware")
    # text-only prompts run once, until a cold reset
    for clear, text_only in ((False, 3), (False, 0), (True, 3)):
        engine.reset(clear_cache=clear)
        engine.run_methods(engine.prepare(IMAGES), [QUESTIONS[:3]] * 2,
                           [parse_method("pai:layers=0-1")])
        assert engine.counts.prompts == 6 + text_only
    assert with_pai.images_encoded == alone.images_encoded == 2
    assert with_pai.prefix_tokens == alone.prefix_tokens
    # the edited pass, and 3 text-only prompts for 6 questions
    assert with_pai.prompts == 2 * alone.prompts + 3
    assert with_vcd.images_encoded == 4 and with_vcd.prefix_tokens == 2 * alone.prefix_tokens


def test_parse_method_settings_and_errors():
    vcd = parse_method("vcd:alpha=0.5,noise_step=999")
    assert isinstance(vcd, VCD) and \
        vcd.settings == {"alpha": 0.5, "beta": 0.1, "noise_step": 999, "seed": 0}
    assert isinstance(parse_method("none"), Baseline) and not parse_method("none").contrastive
    assert parse_method("pai").passes(32)["main"].edit.layers == (2, 31)
    assert isinstance(parse_method("icd"), ICD) and isinstance(parse_method("pai"), PAI)
    with pytest.raises(ValueError, match="unknown method 'dola'"):
        parse_method("dola")
    with pytest.raises(ValueError, match="method vcd: unknown setting"):
        parse_method("vcd:gamma=2")
    with pytest.raises(ValueError, match="layers 0-40 are not within the model's 32 layers"):
        parse_method("pai:layers=0-40").passes(32)


def test_a_noised_pass_of_ones_own_is_noised_at_vcds_step():
    from pope_fast.engine.methods import VCD_NOISE_STEP, Pass

    # a user's Method that asks for "the noised image" gets VCD's noise, not step 0 (an all but
    # clean image)
    assert Pass("noised").noise_step == VCD_NOISE_STEP == 500
    assert Pass("noised") == parse_method("vcd").passes(32)["noised"]
    assert Pass("noised", noise_step=0).noise_step == 0 and Pass().noise_step is None
    with pytest.raises(ValueError,
                       match=r"Pass: noise_step must be an integer in \[0, 999\], not 1000"):
        Pass("noised", noise_step=1000)
    with pytest.raises(ValueError, match="Pass: noise_step applies to a 'noised' pass, "
                                         "not to image='image'"):
        Pass(noise_step=500)
    with pytest.raises(ValueError,
                       match="Pass: image must be one of image, noised, none, not 'blurred'"):
        Pass("blurred")


def _lines(folder):
    return sorted((folder / "records.jsonl").read_text().splitlines())


def test_paired_run_writes_a_folder_per_method_and_resumes(checkpoint, tmp_path):
    from tinymodels import write_pope_set

    from pope_fast.sweep import run_paired, run_plain
    from pope_fast.readout import load_questions

    images, files = write_pope_set(tmp_path / "pope")
    questions = [q for f in files for q in load_questions(f)]
    engine = Engine.load(checkpoint, Settings(image_batch=1, max_new_tokens=3),
                         readouts="template_aware,legacy_2tok,first_token,string_parse")
    plain = run_plain(engine, questions, images, tmp_path / "plain")

    class Stop(Exception):
        pass

    def stop(n):
        if n:  # told 0 first, as the run starts (the progress bar opens then)
            raise Stop

    methods = [parse_method("none"), parse_method("vcd")]
    with pytest.raises(Stop):  # stopped after the first image: both folders hold its records only
        run_paired(engine, questions, images, tmp_path / "paired", methods, progress=stop)
    assert 0 < len(_lines(tmp_path / "paired/vcd")) == len(_lines(tmp_path / "paired/none")) \
        < len(questions)
    results = run_paired(engine, questions, images, tmp_path / "paired", methods)
    assert [r.out_dir.name for r in results] == ["none", "vcd"] and results[0].recorded_before > 0
    # the baseline's records are a plain run's, byte for byte; its meta names the method
    assert _lines(tmp_path / "paired/none") == _lines(tmp_path / "plain")
    assert [dict(r, source=None) for r in results[0].runs] == \
        [dict(r, source=None) for r in plain.runs]
    meta = json.loads((tmp_path / "paired/vcd/meta.json").read_text())
    assert meta["method"]["name"] == "vcd" and meta["method"]["settings"]["noise_step"] == 500
    # no text readout for a contrast
    assert meta["readouts"] == [n for n in engine.readout.names if n != "string_parse"]
    assert "string_parse" in engine.readout.names
    def strict(constant):
        raise ValueError(f"{constant} is not JSON")

    vcd = [json.loads(line, parse_constant=strict) for line in _lines(tmp_path / "paired/vcd")]
    # the plausibility cut's -inf is written as null (JSON has no infinities) and read back as -inf
    assert any(v is None for r in vcd for v in r["candidate_logits"].values())
    from pope_fast.readout import read_records

    entries = read_records(tmp_path / "paired/vcd").entries
    assert float("-inf") in {v for e in entries for v in e.candidate_logits.values()}
    assert len(vcd) == len(questions) and all("decoded" not in r and
                                              "string_parse" not in r["predictions"]
                                              for r in vcd)
    # a folder holds one method's records: a plain run into the vcd folder is refused, naming the
    # method
    with pytest.raises(ValueError, match="method.name: 'vcd' recorded, 'none' now"):
        run_plain(engine, questions, images, tmp_path / "paired/vcd")


def _score_output(out) -> str:
    """What `pope-fast score` prints for a paired run's folder."""
    from click.testing import CliRunner

    from pope_fast.cli import main

    return CliRunner().invoke(main, ["score", str(out)]).output


def test_eval_with_methods_then_compare_on_the_command_line(checkpoint, tmp_path):
    from click.testing import CliRunner
    from tinymodels import write_pope_set

    from pope_fast.cli import main

    images, files = write_pope_set(tmp_path / "pope")
    out = tmp_path / "out"
    inputs = ["eval", "--model", str(checkpoint), "--images", str(images), "--out", str(out)] + \
        [a for f in files for a in ("--questions", str(f))]
    args = inputs + ["--readouts", "template_aware,legacy_2tok", "--method", "none", "--method",
                     "vcd", "--method", "pai:layers=0-1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "compare.json").read_text())
    assert [(p["a"], p["b"]) for p in saved["pairs"]] == \
        [(str(out / "none"), str(out / m)) for m in ("vcd", "pai")]
    result = CliRunner().invoke(main, ["compare", str(out / "none"), str(out / "vcd"), "--format",
                                       "json"])
    assert result.exit_code == 0, result.output
    [pair] = json.loads(result.output)["pairs"]
    assert pair == saved["pairs"][0]
    cell = pair["splits"]["random"]["template_aware"]
    # full precision
    assert cell["delta_f1"] == cell["f1_b"] - cell["f1_a"] and 0 <= cell["mcnemar_p"] <= 1
    assert set(cell["flips"]) == {"yes_to_no", "no_to_yes"} and len(cell["delta_f1_ci95"]) == 2
    # every readout's answers with every candidate cut (null in the records): counted as such, per
    # method (issue 48)
    sets = json.loads((out / "vcd" / "meta.json").read_text())["token_sets"]
    vcd = [json.loads(line) for line in _lines(out / "vcd")]
    for name in ("template_aware", "legacy_2tok"):
        ids = [str(i) for i in sets[name]["yes_ids"] + sets[name]["no_ids"]]
        cut = sum(all(r["candidate_logits"][i] is None for i in ids) for r in vcd
                  if r["split"] == "random")
        b = cell["b"] if name == "template_aware" else pair["splits"]["random"][name]["b"]
        assert b["unknown_reasons"] == ({"all candidates cut": cut} if cut else {}) and \
            b["unknown"] >= cut
        # a question with no margin is left out of it, counted alike
        bias = pair["splits"]["random"][name]["bias"]
        assert bias["excluded"]["b"] == b["unknown_reasons"] and \
            bias["n"] == cell["a"]["tp"] + cell["a"]["fp"] + cell["a"]["tn"] + cell["a"]["fn"] + \
            cell["a"]["unknown"] - bias["excluded"]["either"]
        assert (f"{name} {cut} of" in _score_output(out)) == (cut > 0)
    # a contrastive method with a text readout named explicitly is refused before any work
    refused = CliRunner().invoke(main, inputs + ["--readouts", "string_parse", "--method", "vcd"])
    assert refused.exit_code != 0 and "method vcd combines logits at the answer position" in \
        refused.output
