"""Each method's arithmetic on small logits, against its paper's formula written here in numpy
(float64, in probability space where the paper writes it so), with settings away from the defaults:
the quick lane's check of the numbers a method records (and the one refusal of its settings that
needs no model). tests/engine/test_methods.py runs the same formulas through whole models (slow)."""
import hashlib
import math

import numpy as np
import pytest
import torch

from pope_fast.engine.layers.attention import (answer_image_attention, answer_key_attention,
                                               kept_causal_attention, key_scaled_causal_attention)
from pope_fast.engine.layers.interventions import (ImageAttentionAmplification, ImageTokenDrop,
                                                   PAIAttention, VisualAmplification)
from pope_fast.engine.inputs.plan import PromptResult, Row
from pope_fast.engine.methods import parse_method
from pope_fast.engine.methods.avisc import ImageTokenZeroing, avisc_masked


def _logits(seed: int, rows: int = 4, vocab: int = 23) -> torch.Tensor:
    """[rows, vocab] fp32 logits spread over 4 nats: a plausibility cut of 0.1-0.3 keeps some of
    each row, not all."""
    return (torch.rand(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 4 - 2).float()


def _probabilities(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _head(logits: np.ndarray, beta: float) -> np.ndarray:
    """The adaptive plausibility constraint of VCD (Leng et al., CVPR 2024), which ICD and PAI
    take over: V_head = {y : p(y | v, x) >= beta * max_w p(w | v, x)}, on the probabilities of
    the image-conditioned pass."""
    p = _probabilities(logits)
    return p >= beta * p.max(axis=-1, keepdims=True)


def _check(ours: torch.Tensor, expected: np.ndarray) -> None:
    ours = ours.double().numpy()
    assert (np.isneginf(ours) == np.isneginf(expected)).all(), "another set of tokens cut"
    assert 0 < np.isfinite(expected).sum() < expected.size  # the cut matters in these rows
    kept = np.isfinite(expected)
    worst = np.abs(ours[kept] - expected[kept]).max()
    assert worst < 1e-5, f"off by {worst}"


def _contrast(main: np.ndarray, other: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """VCD's contrast (Leng et al., CVPR 2024) and ICD's (Wang et al., ACL Findings
    2024), before the softmax: (1 + alpha) logit(y | v, x) - alpha logit(y | v', x), set
    to -inf outside V_head."""
    return np.where(_head(main, beta), (1 + alpha) * main - alpha * other, -np.inf)


def test_vcd_contrasts_the_noised_pass_within_the_plausible_tokens():
    main, noised = _logits(1), _logits(2)
    ours = parse_method("vcd:alpha=0.7,beta=0.3").combine({"main": main, "noised": noised})
    _check(ours, _contrast(main.double().numpy(), noised.double().numpy(), 0.7, 0.3))


def test_icd_contrasts_the_disturbed_instruction_within_the_plausible_tokens():
    main, disturbed = _logits(3), _logits(4)
    ours = parse_method("icd:alpha=0.4,beta=0.15").combine({"main": main, "disturbed": disturbed})
    _check(ours, _contrast(main.double().numpy(), disturbed.double().numpy(), 0.4, 0.15))


def test_pai_contrasts_log_probabilities_with_the_text_only_pass():
    """PAI's contrast (Liu et al., ECCV 2024): gamma log p(y | X_V, X_I) - (gamma - 1) log p(y |
    X_I), the text-only pass without the image, within the image pass's V_head."""
    main, text = _logits(5), _logits(6)
    ours = parse_method("pai:gamma=1.4,beta=0.2").combine({"main": main, "text": text})
    log_main, log_text = (np.log(_probabilities(x.double().numpy())) for x in (main, text))
    _check(ours,
           np.where(_head(main.double().numpy(), 0.2), 1.4 * log_main - 0.4 * log_text, -np.inf))


def test_m3id_amplifies_what_the_image_adds_over_the_text_only_pass():
    """M3ID (Favero et al., CVPR 2024) as sangminwoo/AvisC avisc_utils/avisc_sample.py:246-269
    computes it, at the first token (t = 1): gamma = exp(-lambda),
    log p(y | c, x) + (1 - gamma) / gamma (log p(y | c, x) - log p(y | x)), -inf where the
    conditioned logit is below log(beta) + its row's max."""
    main, text = _logits(10), _logits(11)
    log_main, log_text = (np.log(_probabilities(x.double().numpy())) for x in (main, text))
    for spec, lam, beta in (("m3id:lambda=0.7,beta=0.2", 0.7, 0.2), ("m3id", 0.02, 0.1)):
        ours = parse_method(spec).combine({"main": main, "text": text})
        weight = (1 - math.exp(-lam)) / math.exp(-lam)
        _check(ours,
               np.where(_head(main.double().numpy(), beta),
                        log_main + weight * (log_main - log_text), -np.inf))
    # docs/methods.md's ~0.02
    assert (1 - math.exp(-0.02)) / math.exp(-0.02) == pytest.approx(0.0202, abs=1e-4)


def test_the_baseline_records_the_models_logits_as_they_are():
    main = _logits(7)
    assert torch.equal(parse_method("none").combine({"main": main}), main)


def test_pais_attention_edit_is_s_plus_alpha_abs_s_in_its_layers_at_the_answer_only():
    """PAI's edit of the image keys' attention logits (LALBJ/PAI attention.py): s + alpha |s|,
    layers first..last inclusive, at the answer position only."""
    edit = PAIAttention(0.3, (1, 2))
    assert edit.image_attention(0) is None and edit.image_attention(3) is None
    scores = _logits(8, rows=3 * 5, vocab=7).view(1, 3, 5, 7)  # [B, heads, queries, keys]
    for layer in (1, 2):
        applied = edit.image_attention(layer)
        assert applied.answer_only
        edited = applied.per_head(3, torch.device("cpu")).apply(scores,
                                                                lambda x: x.view(1, 3, 1, 1))
        expected = scores.double().numpy() + 0.3 * np.abs(scores.double().numpy())
        assert np.abs(edited.double().numpy() - expected).max() < 1e-6


def test_amplified_image_attention_is_the_attention_times_alpha_renormalized():
    """ImageAttentionAmplification(alpha): after the softmax, each image key's weight is alpha times
    its weight before, the row renormalized."""
    alpha = 2.5
    scores = _logits(9, rows=6, vocab=9).double()
    image = torch.tensor([False, True, True, True, False, False, False, False, False])
    edit = ImageAttentionAmplification(alpha, (0, 0)).image_attention(0)
    edited = torch.where(image,
                         edit.apply(scores, lambda x: torch.as_tensor(x, dtype=scores.dtype)),
                         scores)
    before = _probabilities(scores.numpy())
    weighted = np.where(image.numpy(), alpha * before, before)
    assert torch.softmax(edited, -1).numpy() == pytest.approx(
        weighted / weighted.sum(-1, keepdims=True), abs=1e-12)
    assert math.isclose(edit.bias, math.log(alpha))


def test_a_setting_given_twice_in_one_method_is_refused():
    with pytest.raises(ValueError,
                       match=r"^method 'vcd:alpha=1,alpha=2': alpha is given twice; give each "
                             r"setting once$"):
        parse_method("vcd:alpha=1,alpha=2")
    assert parse_method("vcd:alpha=1, beta=0.2").settings["alpha"] == 1  # distinct keys as before


def _vti_layer(x: np.ndarray, direction: np.ndarray, alpha: float) -> np.ndarray:
    """VTILayer.forward (shengliu66/VTI vti_utils/llm_layers.py:16-31) with one direction and lam
    [alpha], in float64: y = alpha * d / |d|; x -> (x / |x| + 0.1 y) / |x / |x| + 0.1 y| * |x|."""
    y = alpha * direction / np.linalg.norm(direction)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    turned = x / norm + 0.1 * y
    return turned / np.linalg.norm(turned, axis=-1, keepdims=True) * norm


def test_vti_turns_each_layers_mlp_output_toward_its_direction_keeping_its_norm():
    from pope_fast.engine.methods import VTISteering

    directions = _logits(12, rows=3, vocab=16)  # [layers, hidden]
    out = _logits(13, rows=2 * 5, vocab=16).view(2, 5, 16)  # an MLP output [B, S, H]
    steering = VTISteering(directions, 0.7)
    for layer in range(3):
        ours = steering.mlp(layer, out, "suffix").double().numpy()
        expected = _vti_layer(out.double().numpy(), directions[layer].double().numpy(), 0.7)
        assert np.abs(ours - expected).max() < 1e-5
        assert np.abs(ours - out.double().numpy()).max() > 1e-2  # it moved
    half = steering.mlp(0, out.half(), "decode")
    assert half.dtype == torch.float16  # back to the model's dtype, as VTILayer returns x.half()


def _directions_file(path, **tensors):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def test_vti_reads_its_directions_file_and_refuses_what_it_cannot_use(tmp_path):
    with pytest.raises(ValueError,
                       match=r"^method vti: give directions=PATH, a safetensors file whose tensor "
                             r"text "):
        parse_method("vti:alpha=0.5")
    good = _directions_file(tmp_path / "vti.safetensors", text=_logits(14, rows=4, vocab=8))
    vti = parse_method(f"vti:directions={good},alpha=0.5")
    assert not vti.contrastive  # one steered pass: the model's own records, text readouts included
    [main] = vti.passes(4).values()
    assert (main.edit.alpha == 0.5 and main.edit.unit.shape == (4, 8)
            and main.edit_name.startswith("vti:0.5:"))
    assert vti.to_json(4)["settings"] == {
        "directions": str(good), "alpha": 0.5,
        "directions_sha256": hashlib.sha256(good.read_bytes()).hexdigest()}
    with pytest.raises(ValueError,
                       match=r"tensor text has 4 directions, the model 6 decoder layers \(one "
                             r"each"):
        vti.passes(6)
    with pytest.raises(ValueError,
                       match=r"tensor text is \[4, 8\], but the model's hidden size is 16"):
        main.edit.mlp(0, torch.zeros(1, 2, 16), "suffix")
    both = _directions_file(tmp_path / "both.safetensors", text=_logits(14, rows=4, vocab=8),
                            vision=_logits(15, rows=4, vocab=8))
    with pytest.raises(ValueError,
                       match=r"holds text, vision; it must hold one tensor, text \[layers, "
                             r"hidden\] \(VTI's visual direction steers the vision encoder"):
        parse_method(f"vti:directions={both}").passes(4)
    with pytest.raises(ValueError,
                       match=rf"^method vti: directions {tmp_path}/missing.safetensors: "):
        parse_method(f"vti:directions={tmp_path}/missing.safetensors").passes(4)
    flat = _directions_file(tmp_path / "flat.safetensors", text=torch.ones(8))
    with pytest.raises(ValueError,
                       match=r"tensor text must be finite floats \[layers, hidden\], not "
                             r"torch.float32 \[8\]"):
        parse_method(f"vti:directions={flat}").passes(4)


def test_an_unknown_method_is_refused_naming_the_known_ones():
    known = "none, vcd, pai, icd, m3id, vti, sid, only, memvr, vista, clearsight, avisc"
    with pytest.raises(ValueError, match=rf"^unknown method 'dola'; known: {known}$"):
        parse_method("dola")


def test_sid_contrasts_its_token_dropped_pass_as_vcd_sample_does():
    """SID's combination (huofushuo/SID vcd_sample.py:177-184): (1 + alpha) l - alpha l_cd, -inf
    where l is below log(beta) + its row's max; beta 0 is its greedy argmax over the uncut
    contrast (:190-191). Defaults as its POPE command runs: alpha 0.5, beta 0.1 (:168-169), layer
    2, keep 100 (pope_eval.py:91-93)."""
    main, dropped = _logits(16), _logits(17)
    ours = parse_method("sid:alpha=0.8,beta=0.2").combine({"main": main, "contrast": dropped})
    _check(ours, _contrast(main.double().numpy(), dropped.double().numpy(), 0.8, 0.2))
    uncut = parse_method("sid:beta=0").combine({"main": main, "contrast": dropped}).double().numpy()
    expected = 1.5 * main.double().numpy() - 0.5 * dropped.double().numpy()
    assert np.isfinite(uncut).all() and np.abs(uncut - expected).max() < 1e-5
    sid = parse_method("sid")
    assert sid.settings == {"alpha": 0.5, "beta": 0.1, "layer": 2, "keep": 100} and sid.contrastive
    contrast = sid.passes(32)["contrast"]
    assert (contrast.edit.layer, contrast.edit.keep, contrast.edit.whole_prompt) == (2, 100, True)
    with pytest.raises(ValueError,
                       match=r"^method sid: layer 4 is not within the model's 4 layers$"):
        parse_method("sid:layer=4").passes(4)
    with pytest.raises(ValueError, match=r"^method sid: layer must lie in \[1, ∞\), not 0$"):
        parse_method("sid:layer=0")


def test_sids_drop_keeps_each_rows_least_attended_image_tokens_and_all_text():
    """modeling_llama.py:655-665: the head-averaged answer-row weights over the image, topk(keep,
    largest=False) kept, every other image token masked; a row with no more image tokens than keep
    keeps them all."""
    weights = torch.softmax(_logits(18, rows=2 * 3, vocab=10).view(2, 3, 10), dim=-1)  # [B, Hq, S]
    image = torch.zeros(2, 10, dtype=torch.bool)
    image[0, 2:8], image[1, 4:6] = True, True
    kept = ImageTokenDrop(1, 3).kept(weights, image)
    mean = weights.double().mean(dim=1).numpy()
    least = 2 + np.argsort(mean[0, 2:8])[:3]
    assert sorted(np.flatnonzero(~kept[0].numpy() & image[0].numpy())) == \
        sorted(set(range(2, 8)) - set(least))
    assert kept[1].all()  # 2 image tokens, keep 3
    assert kept[0, :2].all() and kept[0, 8:].all()


def test_per_key_attention_sums_to_the_probe_and_kept_attention_drops_keys_at_every_query():
    """answer_key_attention is answer_image_attention per key (right-padded rows, grouped heads);
    kept_causal_attention equals causal attention over the sequence with the dropped tokens removed,
    at every query kept."""
    g = torch.Generator().manual_seed(19)
    q, k, v = (torch.randn(2, heads, 7, 8, generator=g) for heads in (4, 2, 2))
    lengths, image = torch.tensor([7, 5]), torch.zeros(2, 7, dtype=torch.bool)
    image[:, 1:4] = True
    per_key = answer_key_attention(q, lengths, k)
    assert torch.allclose((per_key * image[:, None]).sum(-1),
                          answer_image_attention(q, lengths, k, image), atol=1e-6)
    assert per_key[1, :, 5:].abs().max() == 0  # padding
    kept = torch.ones(2, 7, dtype=torch.bool)
    kept[:, 2] = False
    ours = kept_causal_attention(q, k, v, kept)
    keep = torch.tensor([0, 1, 3, 4, 5, 6])
    short = torch.nn.functional.scaled_dot_product_attention(q[:, :, keep],
                                                             k[:, :, keep].repeat_interleave(2, 1),
                                                             v[:, :, keep].repeat_interleave(2, 1),
                                                             is_causal=True)
    assert torch.allclose(ours[:, :, keep], short, atol=1e-5)


def test_vista_mixes_its_steered_logits_with_the_windows_and_resolves_its_defaults():
    """VISTA's logits (LzVv123456/VISTA llava_llama.py:93-103): alpha times the window's mean
    lm_head output plus (1 - alpha) times the steered pass's own; defaults as run_pope.sh and
    pope_eval.py:31-37 (lambda 0.01, alpha 0.3, layers 25-30 on 32 layers)."""
    steered, lens = _logits(20), _logits(21)
    ours = parse_method("vista:logits_alpha=0.6").combine({"main": _logits(22), "steered": steered,
                                                           "steered:lens": lens})
    expected = 0.6 * lens.double().numpy() + 0.4 * steered.double().numpy()
    assert np.abs(ours.double().numpy() - expected).max() < 1e-6
    vista = parse_method("vista")
    assert vista.contrastive and vista.residuals
    assert vista.to_json(32)["settings"] == {"vsv_lambda": 0.01, "logits_alpha": 0.3,
                                             "logits_layers": "25-30"}
    assert [p.image for p in vista.passes(32).values()] == ["image", "none"]
    with pytest.raises(ValueError,
                       match=r"^method vista: logits_layers 3-4 are not within the model's 4 "
                             r"layers$"):
        parse_method("vista:logits_layers=3-4").passes(4)
    with pytest.raises(ValueError,
                       match=r"^method vista: logits_layers takes FIRST-LAST \(e.g. 25-30\), not "
                             r"3$"):
        parse_method("vista:logits_layers=3")
    with pytest.raises(ValueError,
                       match=r"^method vista: logits_alpha must lie in \[0.0, 1.0\], not 1.5$"):
        parse_method("vista:logits_alpha=1.5")


def test_vistas_steering_vector_and_steered_mlps_follow_its_code():
    """obtain_vsv on one question (steering_vector.py:113-129): the difference of its residual
    streams with and without the image through a rank-1 PCA of that one row (myutils.py:104-130:
    LAPACK's SVD of the zero centred row, svd_flip), component plus mean; then VSVLayer
    (llm_layers.py:15-34) on each row with its own question's vector, picked by the batch's rows."""
    g = torch.Generator().manual_seed(23)
    streams = {(i, j): (torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g))
               for i in (0, 1) for j in (0, 1)}
    results = {role: [[PromptResult(first_token_id=0, candidate_logits={},
                                    residuals=streams[i, j][k]) for j in (0, 1)]
                      for i in (0, 1)] for k, role in enumerate(("main", "text"))}
    steered = parse_method("vista:vsv_lambda=0.7,logits_layers=1-2").later(results)["steered"]
    edit = steered.edit
    assert edit.whole_prompt and edit.lens_layers == (1, 2) and steered.edit_name == "vista:0.7:1-2"
    for key, (pos, neg) in streams.items():
        row = (pos - neg).double().numpy().reshape(1, -1)
        u, _, vt = np.linalg.svd(row - row.mean(0), full_matrices=False)
        expected = (vt[:1] * np.sign(u[np.abs(u).argmax(0), 0]) + row.mean(0)).reshape(3, 8)
        assert np.abs(edit.vectors[key].double().numpy() - expected).max() < 1e-5
    edit.rows([Row(1, 0, None, None), Row(0, 1, None, None)])
    out = torch.randn(2, 5, 8, generator=g)
    ours = edit.mlp(2, out, "suffix").double().numpy()
    for b, key in enumerate([(1, 0), (0, 1)]):
        x, v = out[b].double().numpy(), edit.vectors[key][2].double().numpy()
        cos = x @ -v / (np.linalg.norm(x, axis=-1) * np.linalg.norm(v))
        turned = x / np.linalg.norm(x, axis=-1, keepdims=True) \
            + 0.7 * (1 + np.maximum(cos, 0))[:, None] * v / np.linalg.norm(v)
        expected = turned / np.linalg.norm(turned, axis=-1, keepdims=True) \
            * np.linalg.norm(x, axis=-1, keepdims=True)
        assert np.abs(ours[b] - expected).max() < 1e-5


def test_clearsight_scales_the_image_and_system_keys_for_the_queries_after_the_image():
    """ClearSight's AttnAdapter (AttnAdapter.py:68-78) on a row [system x2, image x3, question x2]
    and a row with no image: in its layers, each query after the image takes enh on the image's
    logits and sup on the system prompt's, before the causal mask and softmax; defaults as its POPE
    script (infer_pope.sh, infer_pope.py:53-58)."""
    clearsight = parse_method("clearsight")
    assert (clearsight.settings == {"enh_para": 1.15, "sup_para": 0.95, "layers": "9-14"}
            and clearsight.contrastive)
    edit = clearsight.passes(32)["main"].edit
    assert (edit.layers, edit.enhance, edit.suppress, edit.whole_prompt) == \
        ((9, 14), 1.15, 0.95, True)
    with pytest.raises(ValueError,
                       match=r"^method clearsight: layers 9-14 are not within the model's 4 "
                             r"layers$"):
        clearsight.passes(4)
    image = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0] * 7], dtype=torch.bool)
    assert VisualAmplification((1, 2), 1.5, 0.5).key_scale(0, image) is None
    scale, queries = VisualAmplification((1, 2), 1.5, 0.5).key_scale(2, image)
    assert (scale[0].tolist() == [0.5, 0.5, 1.5, 1.5, 1.5, 1, 1]
            and queries.tolist() == [[False] * 5 + [True] * 2, [False] * 7])
    g = torch.Generator().manual_seed(24)
    q, k, v = (torch.randn(2, heads, 7, 4, generator=g) for heads in (2, 1, 1))
    ours = key_scaled_causal_attention(q, k, v, scale, queries).double().numpy()
    qd, kd, vd = (t.double().numpy()
                  for t in (q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))
    scores = qd @ kd.transpose(0, 1, 3, 2) / 2
    scores[0, :, 5:, 2:5] *= 1.5
    scores[0, :, 5:, :2] *= 0.5
    scores = np.where(np.tril(np.ones((7, 7), dtype=bool)), scores, -np.inf)
    assert np.abs(ours - _probabilities(scores) @ vd).max() < 1e-5


def test_avisc_zeroes_the_tokens_below_its_threshold_in_its_most_attentive_layers():
    """avisc_sample.py:138-179 in numpy: layer shares of the image attention, the fewest largest
    layers whose share reaches layer_gamma (those below it plus one), their weights averaged,
    tokens below mean + lamb * std (ddof 1) zeroed; the contrast as VCD's (:203-208); defaults as
    its POPE script (pope_eval_batch.sh)."""
    weights = torch.rand(5, 12, generator=torch.Generator().manual_seed(25)) ** 3
    w = weights.double().numpy()
    share = w.sum(1) / w.sum()
    for gamma, lamb in ((0.3, 1.0), (0.7, 0.2)):
        k = int((np.cumsum(np.sort(share)[::-1]) < gamma).sum()) + 1
        image = w[np.argsort(-share)[:k]].mean(0)
        expected = image < image.mean() + lamb * image.std(ddof=1)
        assert avisc_masked(weights, gamma, lamb).tolist() == expected.tolist()
        assert 0 < expected.sum() < 12
    # the layers matter
    assert avisc_masked(weights, 0.3, 1.0).tolist() != avisc_masked(weights, 0.7, 1.0).tolist()
    avisc = parse_method("avisc")
    assert (avisc.settings == {"layer_gamma": 0.5, "lamb": 1.0, "alpha": 1.0, "beta": 0.1}
            and avisc.contrastive)
    main, masked = _logits(26), _logits(27)
    ours = parse_method("avisc:alpha=0.6,beta=0.2").combine({"main": main, "masked": masked})
    _check(ours, _contrast(main.double().numpy(), masked.double().numpy(), 0.6, 0.2))
    x, image = torch.ones(2, 5, 3), torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 0]],
                                                 dtype=torch.bool)
    zeroing = ImageTokenZeroing({(0, 1): torch.tensor([True, False, True]),
                                 (1, 0): torch.tensor([False, True])})
    zeroing.rows([Row(0, 1, None, None), Row(1, 0, None, None)])
    assert zeroing.embedded(x, image)[:, :, 0].tolist() == [[1, 0, 1, 0, 1], [1, 1, 1, 0, 1]]
