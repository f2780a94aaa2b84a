"""The batch sizes a run takes when its options leave them to the device (engine/utils/budget.py),
without a model."""
import pytest
import torch

from pope_fast.cli import main
from pope_fast.engine import Settings
from pope_fast.engine.utils import budget
from pope_fast.engine.inputs.plan import PromptLayout, Row, make_plan

GB, GIB = 10 ** 9, 1 << 30


@pytest.mark.parametrize("memory, rows, images", [
    # an H200 (~140 GiB): every row of a step in one batch, the most images
    (150_000_000_000, 2048, 32),
    (85_000_000_000, 1266, 19),  # an H100 (~79 GiB)
    (24 * GB, 357, 8),
    (4 * GIB, 64, 8),
    (1 * GIB, 32, 8),  # the floors
], ids=["h200", "h100", "24GB", "4GiB", "1GiB"])
def test_the_budget_follows_total_memory_within_its_bounds(memory, rows, images):
    assert budget.question_rows(memory) == rows
    assert budget.step_images(memory) == images
    assert budget.step_images(memory, gpu=False) == 8  # the CPU's steps, whatever its RAM


def test_settings_left_open_take_the_devices_budget_and_record_it():
    memory = budget.device_memory(torch.device("cpu"))
    assert memory > GIB
    open_ = Settings()
    assert (open_.batch_size, open_.image_batch) == (None, None)
    assert open_.question_rows == budget.question_rows(memory) and open_.step_images == 8
    meta = open_.to_json()  # meta.json says what ran
    assert (meta["batch_size"], meta["image_batch"]) == (open_.question_rows, open_.step_images)
    chosen = Settings(batch_size=5, image_batch=3)
    assert (chosen.question_rows, chosen.step_images) == (5, 3)
    assert (chosen.to_json()["batch_size"], chosen.to_json()["image_batch"]) == (5, 3)
    with pytest.raises(ValueError, match="batch_size must be at least 1, not 0"):
        Settings(batch_size=0)


def test_eval_and_bench_leave_the_batch_sizes_to_the_device():
    for command, args in (("eval", ["--out", "x"]), ("bench", [])):
        params = main.commands[command].make_context(command, args).params
        assert params["batch_size"] is None, command
    assert main.commands["eval"].make_context("eval", ["--out", "x"]).params["image_batch"] is None
    assert main.commands["eval"].make_context(
        "eval", ["--out", "x", "--batch-size", "7"]).params["batch_size"] == 7


def test_an_h200_step_of_pope_questions_is_one_prefill(monkeypatch):
    """A step of LLaVA-1.5's POPE (about 10 prompts an image, one prefix length) is one question
    batch at the default on an H200, where 32-row batches cut it into 11."""
    monkeypatch.setattr(budget, "device_memory", lambda device: 150_000_000_000)
    # Settings' check that the device exists
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    settings = Settings(device="cuda")
    rows = [Row(i, j, PromptLayout.of([1, 9, 9, 5 + j], 9), torch.ones(2, 4))
            for i in range(settings.step_images)
            for j in range(10)]
    [stage] = make_plan(rows, settings.question_rows, prefix_reuse=True)
    assert len(stage.prefix.rows) == 32 and [len(b.rows) for b in stage.batches] == [320]


def test_a_hybrid_decoders_rows_are_budgeted_with_their_states():
    """Qwen3.5-9B's question row keeps 24 DeltaNet states of 32 x 128 x 128 fp32 (50 MB) besides
    its KV: the budget counts them, so an H200 is not asked for 2,048 such rows (100 GB of states
    beside the weights); a model with no state gets the rule as it was, and a chosen batch size
    stays the user's."""
    from pope_fast.engine.layers.deltanet import HybridDims
    from pope_fast.engine.layers.dims import DecoderDims

    base = DecoderDims(vocab_size=248320, hidden_size=4096, num_layers=32, num_heads=16,
                       num_kv_heads=4, head_dim=256, intermediate_size=12288, rms_eps=1e-6,
                       rope_theta=1e7)
    dims = HybridDims(**{f: getattr(base, f) for f in base.__dataclass_fields__},
                      linear_layers=(True, True, True, False) * 8, linear_k_heads=16,
                      linear_v_heads=32, linear_k_dim=128, linear_v_dim=128, conv_kernel=4)
    state = 24 * 4 * (32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3)
    assert base.row_state_bytes == 0 and dims.row_state_bytes == state
    h200 = 150_000_000_000
    assert budget.question_rows(h200, 0) == budget.question_rows(h200) == 2048
    rows = budget.question_rows(h200, dims.row_state_bytes)
    assert rows == h200 // (GIB // 16 + state) and rows * state < 0.5 * h200
    assert Settings(batch_size=4000).rows_for(state) == 4000
