"""The sliding window on prompts, without a model (engine/layers/attention.py): a prefix or whole
prompt attends within it as transformers' sliding mask says, AND(q - k < window, OR(causal, same
image run)), and a question continuing a prefix reads what the same tokens read in one pass."""
import math

import pytest
import torch

from pope_fast.engine.layers.attention import (PrefixKV, prompt_attention, suffix_attention,
                                               windowed_suffix_attention)
from pope_fast.engine.layers.interventions import AttentionEdit


def _qkv(rows: int, length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 4, length, 8, generator=g),
            torch.randn(rows, 2, length, 8, generator=g),
            torch.randn(rows, 2, length, 8, generator=g))


def _reference(q, k, v, allowed):
    """Explicit fp32 attention under allowed [S, S] (query, key), grouped heads repeated."""
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def test_an_image_run_sees_its_later_tokens_and_its_earlier_ones_within_the_window():
    q, k, v = _qkv(1, 14)
    image = torch.zeros(1, 14, dtype=torch.bool)
    image[0, 3:11] = True  # one run of 8 image tokens, longer than the window of 5
    i = torch.arange(14)
    run = image[0][:, None] & image[0][None, :]
    allowed = ((i[None, :] <= i[:, None]) | run) & (i[:, None] - i[None, :] < 5)
    got = prompt_attention(q, k, v, image, 5)
    assert torch.allclose(got, _reference(q, k, v, allowed), atol=1e-5)
    # without the window: other keys
    assert not torch.allclose(got, prompt_attention(q, k, v, image))


def test_a_question_reads_what_the_whole_sequence_reads_within_the_window():
    """Two rows, each continuing its own 11-token prefix with 6 tokens: the windowed
    suffix pass equals the suffix rows of one windowed pass over prefix + suffix, and the
    window changes them."""
    q, k, v = _qkv(2, 17, seed=1)
    whole = prompt_attention(q, k, v, None, 5)
    prefix = PrefixKV([k[:, :, :11]], [v[:, :, :11]], 11, [(), ()], None)
    got = windowed_suffix_attention(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], prefix, 0,
                                    [(0, 0, 1), (1, 1, 2)], 5)
    assert torch.allclose(got, whole[:, :, 11:], atol=1e-5)
    assert not torch.allclose(whole[:, :, 11:], prompt_attention(q, k, v)[:, :, 11:])


def test_an_edit_past_the_window_is_refused():
    q, k, v = _qkv(1, 9)
    edit = AttentionEdit(scale=0.5)
    with pytest.raises(NotImplementedError, match="past the sliding window of 5 tokens"):
        suffix_attention(q, k, v, None, None, None, 0, edit, "torch", window=5)
