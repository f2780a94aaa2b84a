"""The Qwen2.5-VL tower count (bench/tower.py): what it counts, and the counts of both forwards."""
import torch

from pope_fast.bench.tower import CallCounter, main, random_tower, tower_counts


def test_counter_counts_attention_and_reads_back_only():
    x = torch.randn(1, 2, 5, 8)
    with CallCounter() as counter:
        torch.nn.functional.scaled_dot_product_attention(x, x, x)
        lengths = torch.tensor([2, 3])
        lengths.tolist(), lengths[0].item(), bool(lengths[1]), int(lengths[0]), x.cpu()
        torch.split(x, [2, 3], dim=2), x + 1
    assert counter.counts == {"attention_calls": 1, "reads_back": 5}


def test_a_640_by_480_image_takes_one_call_per_window_length_and_no_read_back():
    """A 640 x 480 image's grid (17 x 23 merged tokens in 30 windows of 112 px: 4 x 4, 4 x 3, 1 x 4,
    1 x 3) through 2 windowed and 2 whole-image blocks: transformers attends window by window and
    reads the lengths back three times a block (q, k, v), after 4 reads of the grid; the engine
    makes 4 calls a windowed block and reads nothing back, with the same bits."""
    counts = tower_counts([(1, 34, 46)],
                          random_tower(width=16, depth=4, fullatt_block_indexes=[1, 3]))
    assert counts == {"transformers": {"attention_calls": 2 * 30 + 2, "reads_back": 4 + 3 * 4},
                      "engine": {"attention_calls": 2 * 4 + 2, "reads_back": 0}, "bits_equal": True}


def test_the_command_prints_both_forwards_and_exits_0_where_the_bits_agree(capsys):
    assert main(["--grid", "1,4,4", "--grid", "1,4,4", "--grid", "1,2,6", "--width", "16",
                 "--heads", "2"]) == 0
    out = capsys.readouterr().out
    # 7B's 32 blocks, 4 of them whole-image; one window an image (2 x 2, 2 x 2 and 1 x 3 merged
    # tokens): transformers 3 calls a block, the engine 2 a windowed block; 3 reads of the grid, 3
    # of window lengths, 3 a block
    assert "| transformers | 96 | 102 | - |" in out and "| engine | 68 | 0 | - |" in out
    assert "features equal bit for bit: True" in out
