"""Prefix attention (prefix_attention.py) in torch: the reference, one explicit fp32 softmax
per prefix; the batched fp32 path the CPU runs for every prefix at once; and the runs of rows
grouped by prefix that all three paths walk.

Without a kernel (CPU) the torch path computes the same softmax in a few batched ops for all runs
at once (rows padded to the longest run), not one reference call per prefix.
"""
import torch


def prefix_attention_ref(
    q: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    k_suffix: torch.Tensor,
    v_suffix: torch.Tensor,
    suffix_lens: torch.Tensor,
    scale: float | None = None,
    prefix_index: list[int] | None = None,
    key_edit: "tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None" = None,
) -> torch.Tensor:
    """[B, Hq, S, D] in q's dtype: explicit fp32 softmax over [prefix ; causal suffix] per row;
    with prefix_index, k/v_prefix are [G, Hkv, P, D] and each run of rows takes its own prefix;
    key_edit as prefix_attention's (marked [G, P], or [P] without prefix_index)."""
    if prefix_index is not None:
        outs = [_one_prefix_ref(q[a:e], k_prefix[g], v_prefix[g], k_suffix[a:e], v_suffix[a:e],
                                suffix_lens[a:e], scale,
                                None if key_edit is None else (key_edit[0][g], *key_edit[1:]))
                for g, a, e in prefix_runs(prefix_index)]
        return torch.cat(outs) if outs else torch.zeros_like(q)
    return _one_prefix_ref(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, key_edit)


def prefix_runs(prefix_index: list[int]) -> list[tuple[int, int, int]]:
    """[0, 0, 1, 1, 1] → [(0, 0, 2), (1, 2, 5)]: (prefix, first row, end row) per run; raises unless
    rows are grouped by prefix."""
    runs: list[tuple[int, int, int]] = []
    for row, g in enumerate(prefix_index):
        if runs and runs[-1][0] == g:
            runs[-1] = (g, runs[-1][1], row + 1)
        else:
            if any(r[0] == g for r in runs):
                raise ValueError("rows must be grouped by prefix (prefix_index has a prefix "
                                 "in two runs)")
            runs.append((g, row, row + 1))
    return runs


class PrefixRuns:
    """A batch's rows grouped by prefix, worked out once for all its layers: the (prefix, first row,
    end row) runs, and (on first use) their int32 table on the device for the kernel, instead of a
    Python pass over the rows and a host-to-device copy in every layer's call."""

    def __init__(self, prefix_index: list[int], device: torch.device | str):
        self.index = list(prefix_index)
        self.runs = prefix_runs(self.index)
        self.device = torch.device(device)
        self._table: torch.Tensor | None = None

    def table(self) -> torch.Tensor:
        if self._table is None:
            self._table = torch.tensor(self.runs, dtype=torch.int32).to(  # [R, 3]
                self.device, non_blocking=True)
        return self._table


def _one_prefix_ref(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, key_edit=None):
    batch, q_heads, length, head_dim = q.shape
    group = q_heads // k_prefix.shape[0]
    scale = head_dim**-0.5 if scale is None else scale
    lens = suffix_lens.to(q.device).long()
    position = torch.arange(length, device=q.device)
    valid = position[None, :] < lens[:, None]  # [B, S]: real tokens, queries and keys alike

    def expand_heads(t, dim):
        # GQA: query head h reads KV head h // group (transformers' repeat_kv)
        return t.float().repeat_interleave(group, dim=dim) if group > 1 else t.float()

    k_p, v_p = expand_heads(k_prefix, 0), expand_heads(v_prefix, 0)  # [Hq, P, D]
    zero_pads = valid[:, None, :, None]
    k_s = torch.where(zero_pads, expand_heads(k_suffix, 1), 0.0)  # [B, Hq, S, D]
    v_s = torch.where(zero_pads, expand_heads(v_suffix, 1), 0.0)
    q32 = torch.where(zero_pads, q.float(), 0.0)
    scores_p = q32 @ k_p.transpose(-1, -2) * scale
    if key_edit is not None:  # [P] marked keys: scale * logit + bias per query head
        marked, head_scale, head_bias = key_edit
        edited = (scores_p * head_scale.float().view(1, -1, 1, 1)
                  + head_bias.float().view(1, -1, 1, 1))
        scores_p = torch.where(marked.view(1, 1, 1, -1), edited, scores_p)
    scores = torch.cat([scores_p, q32 @ k_s.transpose(-1, -2) * scale], dim=-1)
    # [S, S]: key t visible from query i when t <= i
    causal = position[None, :] <= position[:, None]
    allowed = torch.cat(
        [torch.ones(batch, length, k_prefix.shape[1], dtype=torch.bool, device=q.device),
         causal[None] & valid[:, None, :]],
        dim=-1,
    )  # [B, S, P + S]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = probs[..., : k_prefix.shape[1]] @ v_p + probs[..., k_prefix.shape[1]:] @ v_s
    return torch.where(zero_pads, out, 0.0).to(q.dtype)


def prefix_attention_torch(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, runs,
                           key_edit=None):
    """The reference's values in batched fp32 ops for every run at once. k/v_prefix [G, Hkv, P, D];
    runs from prefix_runs. The prefix and suffix softmaxes are computed apart and merged by their
    maxima and sums, so no [prefix ; suffix] score tensor is concatenated per row."""
    batch, q_heads, length, head_dim = q.shape
    kv_heads = k_prefix.shape[1]
    group = q_heads // kv_heads
    lens = suffix_lens.to(q.device).long()
    position = torch.arange(length, device=q.device)
    valid = position[None, :] < lens[:, None]  # [B, S]
    qf = torch.where(valid[:, None, :, None], q.float(), 0.0) * scale  # padded rows may hold NaN
    out_p, max_p, sum_p = _prefix_part(qf, k_prefix, v_prefix, runs, key_edit)

    # Own part: [B, Hkv, g * S, D] @ [B, Hkv, D, S], causal and within each row's length.
    zero_pads = valid[:, None, :, None]
    k_s = torch.where(zero_pads, k_suffix.float(), 0.0)
    v_s = torch.where(zero_pads, v_suffix.float(), 0.0)
    own = qf.reshape(batch, kv_heads, group * length, head_dim) @ k_s.transpose(-1, -2)
    own = own.view(batch, q_heads, length, length)
    allowed = (position[None, :] <= position[:, None])[None] & valid[:, None, :]  # [B, S, S]
    own = own.masked_fill(~allowed[:, None], float("-inf"))
    # finite: every row has P >= 1 prefix keys
    best = torch.maximum(max_p, own.amax(-1, keepdim=True))
    prefix_weight = torch.exp(max_p - best)
    own_weights = torch.exp(own - best)
    total = sum_p * prefix_weight + own_weights.sum(-1, keepdim=True)
    own_out = own_weights.view(batch, kv_heads, group * length, length) @ v_s
    own_out = own_out.view(batch, q_heads, length, head_dim)
    out = (out_p * prefix_weight + own_out) / total
    return torch.where(zero_pads, out, 0.0).to(q.dtype)


def _prefix_part(qf, k_prefix, v_prefix, runs, key_edit):
    """The prefix keys' part of every row's softmax, as [B, Hq, S, X] in row order: the output
    unnormalized (X = D), the scores' maximum and their exponentials' sum (X = 1), to merge with the
    own keys' part by log-sum-exp. qf: the scaled fp32 queries, padded rows zeroed."""
    batch, q_heads, length, head_dim = qf.shape
    kv_heads, prefix_len = k_prefix.shape[1:3]
    group = q_heads // kv_heads
    # rows of each run padded to the longest run (W rows): [R, Hkv, W * g * S, D] @ [R, Hkv, D, P]
    widest = max(e - a for _, a, e in runs)
    slot = torch.full((len(runs) * widest,), batch, device=qf.device)  # row `batch` is all zeros
    for r, (_, a, e) in enumerate(runs):
        slot[r * widest:r * widest + e - a] = torch.arange(a, e, device=qf.device)
    rows = torch.cat([qf, qf.new_zeros(1, q_heads, length, head_dim)])[slot]  # [R * W, Hq, S, D]
    rows = rows.view(len(runs), widest, kv_heads, group * length, head_dim).transpose(1, 2)
    rows = rows.reshape(len(runs), kv_heads, widest * group * length, head_dim)
    prefixes = [g for g, _, _ in runs]
    if prefixes == list(range(prefixes[0], prefixes[-1] + 1)):  # the usual case: views, no copies
        k_p, v_p = k_prefix[prefixes[0]:prefixes[-1] + 1], v_prefix[prefixes[0]:prefixes[-1] + 1]
    else:
        k_p, v_p = k_prefix[prefixes], v_prefix[prefixes]
    scores = rows @ k_p.float().transpose(-1, -2)  # [R, Hkv, W * g * S, P]
    if key_edit is not None:  # scale * s + bias on the marked prefix keys, per query head
        marked, head_scale, head_bias = key_edit
        view = scores.view(len(runs), kv_heads, widest, group, length, prefix_len)
        hs, hb = (t.float().view(1, kv_heads, 1, group, 1, 1) for t in (head_scale, head_bias))
        keys = marked[prefixes].view(len(runs), 1, 1, 1, 1, prefix_len)
        scores = torch.where(keys, view * hs + hb, view).view_as(scores)
    max_p = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - max_p)
    sum_p = weights.sum(-1, keepdim=True)
    out_p = weights @ v_p.float()  # [R, Hkv, W * g * S, D], unnormalized

    def to_rows(t):  # [R, Hkv, W * g * S, X] → [B, Hq, S, X] in row order
        t = t.view(len(runs), kv_heads, widest, group * length, -1).transpose(1, 2)
        t = t.reshape(len(runs) * widest, q_heads, length, -1)
        return t[torch.cat([torch.arange(r * widest, r * widest + e - a, device=qf.device)
                            for r, (_, a, e) in enumerate(runs)])]

    return to_rows(out_p), to_rows(max_p), to_rows(sum_p)
