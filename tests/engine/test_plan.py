"""The engine seam without a model: prompt layouts, the batching plan and the token rows the
language model takes."""
import pytest
import torch

from pope_fast.engine.inputs.plan import PromptLayout, Row, TokenBatch, image_runs, make_plan

IMG = 9  # the image slot id of these layouts


def row(item, prompt, ids, image_id=IMG, share=True, width=4, positions=None):
    layout = PromptLayout.of(ids, image_id, share_prefix=share, positions=positions)
    slots = sum(t == image_id for t in ids)
    features = torch.arange(slots * width, dtype=torch.float32).reshape(slots, width) + 100 * item
    return Row(item, prompt, layout, features)


def test_layout_spans_and_prefix_cut():
    layout = PromptLayout.of([1, 5, IMG, IMG, IMG, 6, 7], IMG)
    assert layout.image_spans == ((2, 5),)
    assert layout.prefix_cut == 5  # up to and including the last image slot
    assert PromptLayout.of([1, IMG, IMG, 6], IMG, share_prefix=False).prefix_cut == 0
    # one token left to read the answer at
    assert PromptLayout.of([1, 5, IMG, IMG], IMG).prefix_cut == 3
    assert PromptLayout.of([1, 5, 6], IMG).prefix_cut == 0  # no image, nothing shared
    assert image_runs([IMG, 1, IMG, IMG, 2, IMG], IMG) == ((0, 1), (2, 4), (5, 6))
    assert PromptLayout.of([IMG, 1, IMG, IMG, 2], IMG).image_tokens_before(3) == 2


def test_plan_groups_prefixes_by_length_and_orders_rows_by_prefix():
    rows = [row(0, 0, [1, IMG, IMG, 5, 6]), row(1, 0, [1, IMG, IMG, IMG, 5]),
            row(0, 1, [1, IMG, IMG, 7]), row(1, 1, [1, IMG, IMG, IMG, 8, 8]),
            row(2, 0, [1, IMG, IMG, 5, 6]), row(0, 2, [3, IMG, IMG, 5])]
    stages = make_plan(rows, batch_size=3, prefix_reuse=True)
    assert [s.prefix.length for s in stages] == [3, 4]  # in order of first appearance
    first = stages[0]
    # image 0 asks two different texts before its image: two prefixes of one image
    assert [(r.item, r.prompt) for r in first.prefix.rows] == [(0, 0), (2, 0), (0, 2)]
    assert [[(r.item, r.prompt) for r in b.rows] for b in first.batches] == [
        [(0, 0), (0, 1), (2, 0)], [(0, 2)]]
    assert [b.slots for b in first.batches] == [[0, 0, 1], [2]]
    assert [[(r.item, r.prompt) for r in b.rows] for b in stages[1].batches] == [[(1, 0), (1, 1)]]


def test_plan_without_reuse_or_shared_prefix_runs_prompts_whole_in_order():
    rows = [row(0, 0, [1, IMG, 5]), row(0, 1, [1, IMG, 6]), row(1, 0, [1, IMG, 7])]
    [stage] = make_plan(rows, batch_size=2, prefix_reuse=False)
    assert stage.prefix is None
    assert [[(r.item, r.prompt) for r in b.rows] for b in stage.batches] == [
        [(0, 0), (0, 1)], [(1, 0)]]
    assert all(b.slots is None for b in stage.batches)
    unshared = [row(0, 0, [IMG, 1, 5], share=False), row(0, 1, [IMG, 1, 6], share=False)]
    [stage] = make_plan(unshared, batch_size=8, prefix_reuse=True)
    assert stage.prefix is None and len(stage.batches[0].rows) == 2


def test_token_batch_of_suffixes_and_whole_prompts():
    a, b = row(0, 0, [1, IMG, IMG, 5, 6, 7]), row(1, 0, [1, IMG, IMG, 8])
    suffix = TokenBatch.of([a, b], 3, None, torch.device("cpu"), mrope=False)
    assert suffix.ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert suffix.lengths.tolist() == [3, 1]
    assert suffix.image_mask is None and suffix.features is None
    assert suffix.positions.tolist() == [3, 4, 5]  # a prompt's columns, shared by every row
    assert suffix.next_position.tolist() == [6, 4]
    whole = TokenBatch.of([a, b], 0, None, torch.device("cpu"), mrope=False)
    assert whole.image_mask.tolist() == [[False, True, True, False, False, False],
                                         [False, True, True, False] + [False] * 2]
    assert torch.equal(whole.features, torch.cat([a.features, b.features]))  # row-major slot order
    assert whole.image_spans == [((1, 3),), ((1, 3),)]
    # the slots' places in the flattened [2, 6] ids, where features' rows go without reading
    # the mask back
    assert whole.image_index.tolist() == [1, 2, 7, 8]
    assert torch.equal(whole.ids.flatten()[whole.image_index], torch.zeros(4, dtype=torch.long))
    assert whole.image_mask.flatten().nonzero().flatten().tolist() == whole.image_index.tolist()


def test_token_batch_marks_sentinel_slots_and_slices_features_per_span():
    sentinel = -200  # mPLUG-Owl2's: not a vocabulary id, never looked up
    r = row(0, 0, [1, sentinel, sentinel, 4, sentinel, 5], image_id=sentinel)
    batch = TokenBatch.of([r], 2, None, torch.device("cpu"), mrope=False)
    assert batch.ids.tolist() == [[0, 4, 0, 5]]
    assert batch.image_mask.tolist() == [[True, False, True, False]]
    assert torch.equal(batch.features, r.features[1:3])  # the slots from column 2 on
    assert batch.image_spans == [((0, 1), (2, 3))]
    assert batch.image_index.tolist() == [0, 2]
    # 3 slots, 2 feature rows: refused on the host, before the model
    short = Row(0, 0, r.layout, r.features[:2])
    with pytest.raises(ValueError, match="^3 image tokens in the prompt but 2 image features$"):
        TokenBatch.of([short], 0, None, torch.device("cpu"), mrope=False)


def test_token_batch_mrope_streams_are_padded_and_continue():
    positions = torch.tensor([[0, 1, 1, 1, 1, 3, 4], [0, 1, 1, 2, 2, 3, 4], [0, 1, 2, 1, 2, 3, 4]])
    a = row(0, 0, [1, IMG, IMG, IMG, IMG, 5, 6], positions=positions)
    b = row(0, 1, [1, IMG, IMG, IMG, IMG, 7], positions=positions[:, :6])
    batch = TokenBatch.of([a, b], 5, None, torch.device("cpu"), mrope=True)
    assert batch.positions.shape == (3, 2, 2)
    assert batch.positions[:, 1].tolist() == [[3, 3]] * 3  # padding repeats the last position
    assert batch.next_position.tolist() == [5, 4]
    prefix = TokenBatch.of([a], 0, 5, torch.device("cpu"), mrope=True)
    # after the grid: its longer side, not its token count
    assert prefix.next_position.tolist() == [3]
