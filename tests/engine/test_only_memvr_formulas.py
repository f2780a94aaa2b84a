"""ONLY's and MemVR's arithmetic on small tensors, against their papers' formulas written here in
numpy (float64), and the refusals of their settings and of layers they cannot rebuild: the quick
lane's check (tests/engine/test_only_memvr.py runs them through whole models against their official
code's arithmetic, slow)."""
import math

import numpy as np
import pytest
import torch

from pope_fast.engine.layers.decoder import DecoderLayer
from pope_fast.engine.methods import MemVR, parse_method
from pope_fast.engine.methods.memvr import top_entropy
from pope_fast.engine.methods.only import entropy, outliers_zeroed, plain_layers
from pope_fast.engine.models.gemma3 import Gemma3DecoderLayer


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_only_adds_the_enhanced_logits_where_the_distributions_agree_and_contrasts_them_elsewhere():
    """ONLY (Wan et al., ICCV 2025, eq. 6-7): TVD = sum |p - p_cd|; l + alpha_pos l_cd where TVD <
    gamma, else (1 + alpha_neg) l - alpha_neg l_cd; -inf where p < beta max p."""
    g = torch.Generator().manual_seed(3)
    main = torch.rand(4, 19, generator=g) * 4 - 2
    # near, far, ...
    cd = main + torch.rand(4, 19, generator=g) * torch.tensor([0.05, 3.0, 0.05, 3.0])[:, None]
    method = parse_method("only:alpha_pos=2.5,alpha_neg=0.7,beta=0.2,gamma=0.3")
    got = method.combine({"main": main, "enhanced": cd}).numpy()
    m, c = main.double().numpy(), cd.double().numpy()
    tvd = np.abs(_softmax(m) - _softmax(c)).sum(axis=-1)
    assert (tvd < 0.3).tolist() == [True, False, True, False]
    expected = np.where((tvd < 0.3)[:, None], m + 2.5 * c, 1.7 * m - 0.7 * c)
    cut = _softmax(m) < 0.2 * _softmax(m).max(axis=-1, keepdims=True)
    assert np.array_equal(np.isinf(got), cut) and cut.any() and not cut.all(axis=-1).any()
    np.testing.assert_allclose(got[~cut], expected[~cut], rtol=0, atol=1e-5)


def test_only_zeroes_outliers_by_the_unbiased_std_and_takes_entropies_over_the_members():
    weights = torch.tensor([[[0.05, 0.4, 0.1, 0.1, 0.05, 0.3]]])  # [B 1, heads 1, keys 6]
    member = torch.tensor([[False, True, True, True, True, False]])
    kept = np.array([0.4, 0.1, 0.1, 0.05])
    limit = kept.mean() + kept.std(ddof=1)  # 0.4 lies above it
    assert 0.4 > limit > 0.1
    got = outliers_zeroed(weights, member)
    # the non-members untouched
    assert torch.equal(got, weights * torch.tensor([1.0, 0, 1, 1, 1, 1]))
    q = np.array([0.1, 0.1, 0.05]) / 0.25
    assert float(entropy(got, member)) == pytest.approx(-(q * np.log(q + 1e-6)).sum(), abs=1e-6)


def test_memvr_entropy_is_over_the_ten_largest_logits_over_log_ten():
    logits = torch.tensor([[5.0, 1.0, *range(-3, 9), -20.0]])
    top = np.sort(logits.double().numpy()[0])[::-1][:10]
    p = _softmax(top)
    assert float(top_entropy(logits)) == pytest.approx(-(p * np.log(p)).sum() / math.log(10),
                                                       abs=1e-6)


def test_settings_and_refusals():
    assert parse_method("only").to_json(32)["settings"] == {"alpha_pos": 3.0, "alpha_neg": 1.0,
                                                            "beta": 0.1, "gamma": 0.2, "layer": 0}
    assert MemVR().settings == {"ratio": 0.12, "threshold": 0.75, "starting": 5, "ending": 16}
    with pytest.raises(ValueError,
                       match=r"^method only: layer 3 must lie before the model's last layer \(3\)"):
        parse_method("only:layer=3").passes(4)
    with pytest.raises(ValueError,
                       match=r"^method memvr: starting 5 and ending 16 must have starting < ending "
                             r"<= 2"):
        parse_method("memvr").passes(3)
    with pytest.raises(ValueError, match=r"^method memvr: ratio must lie in \[0.0, 1.0\]"):
        parse_method("memvr:ratio=1.5")
    assert (set(parse_method("only").passes(4)) == {"main", "enhanced"}
            and parse_method("memvr").contrastive)

    class LM:
        layers = [Gemma3DecoderLayer.__new__(Gemma3DecoderLayer)]

    with pytest.raises(ValueError,
                       match=r"^method only: decoder layer 0 is Gemma3DecoderLayer, and the "
                             r"method "):
        plain_layers(LM, "only")
    moe = DecoderLayer.__new__(DecoderLayer)
    object.__setattr__(moe, "experts", object())
    LM.layers = [moe]
    with pytest.raises(ValueError, match=r"^method memvr: decoder layer 0 is experts"):
        plain_layers(LM, "memvr")
