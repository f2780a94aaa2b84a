"""The dtype each tool loads a model in (Coverage.dtype): pinned per class where the tool pins one,
the checkpoint's own where it passes dtype="auto" or none (transformers 5's default), resolved from
the checkpoint as from_pretrained resolves it; eval --protocol computes in it unless --dtype says
otherwise, and score --protocol names the difference."""
import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file
from tinymodels import make_tiny_llava, write_pope_set

from pope_fast.cli import main
from pope_fast.engine.utils.loader import checkpoint_dtype
from pope_fast.coverage import protocol_for
from pope_fast.engine.models import family_class
from pope_fast.readout.protocols import PROTOCOLS, Coverage, coverage
from pope_fast.readout.protocols.scoring import checks

# (tool, family) → the dtype its model class loads in, from each class's from_pretrained call (cited
# in the rooms)
PINNED = {
    ("lmms-eval", "llava"): "auto", ("lmms-eval", "llava_next"): "auto",
    ("lmms-eval", "instructblip"): "auto", ("lmms-eval", "qwen2_vl"): "auto",
    ("lmms-eval", "qwen2_5_vl"): "bf16", ("lmms-eval", "internvl"): "bf16",
    ("lmms-eval", "qwen3_vl"): "bf16", ("lmms-eval", "qwen3_vl_moe"): "bf16",
    ("lmms-eval", "gemma3"): "bf16",
    ("vlmevalkit", "llava"): "fp16", ("vlmevalkit", "llava_next"): "fp16",
    ("vlmevalkit", "mplug_owl2"): "fp16", ("vlmevalkit", "qwen2_vl"): "auto",
    ("vlmevalkit", "qwen2_5_vl"): "auto", ("vlmevalkit", "llava_onevision"): "fp16",
    ("vlmevalkit", "qwen3_vl"): "auto", ("vlmevalkit", "qwen3_vl_moe"): "auto",
    ("vlmevalkit", "gemma3"): "bf16",
    ("llava", "llava"): "fp16",
}


@pytest.mark.parametrize("tool, family", sorted(PINNED))
def test_each_tools_class_states_the_dtype_it_loads_in(tool, family):
    covered = coverage(tool, family_class(family), {})
    assert covered.dtype == PINNED[(tool, family)] and covered.to_json()["dtype"] == covered.dtype
    assert not any("dtype" in d for d in covered.deviations)


def test_protocols_that_pin_no_dtype_record_none():
    for tool in ("paper", "pope-official"):
        covered = coverage(tool, family_class("llava"), {})
        assert covered.dtype is None and "dtype" not in covered.to_json()


def _folder(tmp_path, config, tensors=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_auto_is_the_checkpoints_own_dtype_as_from_pretrained_reads_it(tmp_path):
    """modeling_utils _get_dtype under dtype="auto": config.json's dtype, torch_dtype in older
    files, else the first floating tensor's dtype (an integer buffer before it does not count)."""
    weights = {"a.position_ids": torch.zeros(3, dtype=torch.int64),
               "b.weight": torch.zeros(2, dtype=torch.bfloat16)}
    assert checkpoint_dtype(_folder(tmp_path / "a", {"dtype": "float16"}, weights),
                            {"dtype": "float16"}) == torch.float16
    assert checkpoint_dtype(tmp_path / "a", {"torch_dtype": "float32"}) == torch.float32
    assert checkpoint_dtype(tmp_path / "a", {}) == torch.bfloat16
    for i, (config, named) in enumerate((
            ({"model_type": "llava", "dtype": "bfloat16"}, "bf16"),
            ({"model_type": "llava", "torch_dtype": "float16"}, "fp16"),
            ({"model_type": "llava"}, "bf16"))):
        folder = _folder(tmp_path / str(i), config, weights)
        assert protocol_for(folder, "lmms-eval").dtype == named
        # pinned: the checkpoint's does not matter
        assert protocol_for(folder, "vlmevalkit").dtype == "fp16"


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    root = tmp_path_factory.mktemp("dtype")
    checkpoint = make_tiny_llava(root / "ckpt", init_std=0.3)
    images, files = write_pope_set(root / "pope", n_images=2, sizes=((60, 40), (40, 60)),
                                   questions_per_image=2)
    return root, checkpoint, images, files[0]


def _eval(llava, name, *extra):
    root, checkpoint, images, questions = llava
    result = CliRunner().invoke(main, ["eval", "--model", str(checkpoint), "--images", str(images),
                                       "--questions", str(questions), "--out", str(root / name),
                                       "--device", "cpu", *extra])
    assert result.exit_code == 0, result.output
    return json.loads((root / name / "meta.json").read_text())


def _checks(llava, name, protocol):
    result = CliRunner().invoke(main, ["score", str(llava[0] / name), "--protocol", protocol,
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["runs"][0]["checks"]


@pytest.mark.slow
def test_eval_under_a_protocol_computes_in_the_tools_dtype_unless_dtype_is_given(llava):
    """LLaVA's pope.sh loads fp16 (builder.py l.42-43): --protocol llava computes in fp16 on a
    float32 checkpoint on the CPU, where the engine's own default is fp32; lmms-eval's llava_hf
    takes the checkpoint's (float32). --dtype fp32 wins under --protocol llava, and score --protocol
    llava names the difference."""
    assert json.loads((llava[1] / "config.json").read_text())["dtype"] == "float32"
    meta = _eval(llava, "llava", "--protocol", "llava")
    assert (meta["settings"]["dtype"], meta["settings"]["resolved_dtype"]) == ("fp16", "float16")
    assert meta["protocol_coverage"]["llava"]["dtype"] == "fp16"
    # "auto", resolved for this checkpoint
    assert meta["protocol_coverage"]["lmms-eval"]["dtype"] == "fp32"
    assert _checks(llava, "llava", "llava") == []
    meta = _eval(llava, "llava32", "--protocol", "llava", "--dtype", "fp32")
    assert meta["settings"]["resolved_dtype"] == "float32"
    assert _checks(llava, "llava32", "llava") == [
        "dtype: this run computed in float32, llava loads the model in float16"]
    assert _eval(llava, "lmms", "--protocol", "lmms-eval")["settings"]["resolved_dtype"] \
        == "float32"


def test_nf4_under_a_tool_that_loads_fp32_keeps_nf4s_compute_dtype(tmp_path):
    """NF4 computes in fp16 or bf16, so a tool's fp32 (lmms-eval's InstructBLIP on a float32
    checkpoint) is not forced on it: the run keeps the engine's fp16, and score --protocol names the
    difference."""
    from pope_fast.engine import Settings
    from pope_fast.evaluate import protocol_settings

    fp32 = Coverage("a class", "t", 8, dtype="fp32")
    assert protocol_settings(Settings(), fp32).dtype == "fp32"
    assert protocol_settings(Settings(dtype="bf16"), fp32).dtype == "bf16"
    nf4 = protocol_settings(Settings(quant="nf4"), fp32)
    assert nf4.dtype is None and nf4.torch_dtype == torch.float16
    meta = {"template": "t", "protocol_coverage": {"lmms-eval": fp32.to_json()},
            "settings": nf4.to_json(), "generation": {"exact_match": {"max_new_tokens": 8}}}
    assert checks(PROTOCOLS["lmms-eval"], meta, 0) == [
        "dtype: this run computed in float16, lmms-eval loads the model in float32"]
