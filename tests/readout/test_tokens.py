import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import audit_tokens, derive_token_sets, get_template, load_tokenizer
from pope_fast.readout.tokens import token_strings

LEGACY_IDS = [3582, 8241, 4874, 3869, 1217, 3782, 694, 1939]


@pytest.fixture(scope="module")
def tokenizers(shared):
    root = shared / "tokenizers"
    return {"llama2": load_tokenizer(root / "llama2/llava-1.5-7b-hf"),
            "mistral": load_tokenizer(root / "mistral/llava-v1.6-mistral-7b-hf"),
            "qwen2": load_tokenizer(root / "qwen2/qwen2-vl-7b-instruct")}


def test_legacy_ids_mean_yes_no_only_in_llama2(tokenizers):
    llama = tokenizers["llama2"].convert_ids_to_tokens(LEGACY_IDS)
    assert llama == ["yes", "Yes", "▁yes", "▁Yes", "no", "No", "▁no", "▁No"]
    for name in ("mistral", "qwen2"):
        words = [t.replace("▁", "").replace("Ġ", "").lower()
                 for t in tokenizers[name].convert_ids_to_tokens(LEGACY_IDS)]
        assert not {"yes", "no"} & set(words), (name, words)


def test_token_strings_name_the_ids_the_tokenizer_has(tokenizers):
    """What the report labels its first-token bars with: the tokenizer's own strings, ids past its
    vocabulary (a padded lm_head row) left out rather than guessed."""
    assert token_strings(tokenizers["llama2"], [3869, 1939, 3582, 32001, 32002, 40000]) == {
        "3869": "▁Yes", "1939": "▁No", "3582": "yes", "32001": "<pad>"}
    assert token_strings(tokenizers["qwen2"], [9454, 2753, 3869]) == {"9454": "Yes", "2753": "No",
                                                                      "3869": "Ġ}}"}


@pytest.mark.parametrize("name, template, yes_id, no_id", [
    ("llama2", "llava_plain", 3869, 1939),
    ("mistral", "mistral_inst", 5592, 1770),
    ("qwen2", "qwen2_vl_chat", 9454, 2753),
])
def test_template_aware_first_tokens(tokenizers, name, template, yes_id, no_id):
    sets = derive_token_sets(tokenizers[name], get_template(template))
    aware = sets["template_aware"]
    assert yes_id in aware.yes_ids and no_id in aware.no_ids
    assert not set(aware.yes_ids) & set(aware.no_ids)
    assert sets["first_token"] == aware
    tok = tokenizers[name]
    for i in aware.yes_ids + aware.no_ids:   # every derived id spells a bare yes/no form
        assert (tok.convert_ids_to_tokens(i).replace("▁", "").replace("Ġ", "").lower()
                in ("yes", "no"))


def test_template_aware_is_the_token_after_the_prompt(tokenizers):
    tok = tokenizers["llama2"]
    prompt = get_template("llava_plain").render("Is there a cat in the image?")
    aware = derive_token_sets(tok, get_template("llava_plain"))["template_aware"]
    assert tok.encode(prompt + " Yes")[-1] in aware.yes_ids


def test_dynamic_single_matches_the_tokenizer(tokenizers):
    tok = tokenizers["qwen2"]
    sets = derive_token_sets(tok, get_template("qwen2_vl_chat"))["dynamic_single"]
    assert set(sets.yes_ids) == {tok.encode(f, add_special_tokens=False)[0]
                                 for f in ("yes", "Yes", " yes", " Yes")}
    # Qwen2 spells all eight forms as one token
    assert len(sets.yes_ids) == 4 and len(sets.no_ids) == 4


def test_audit_warns_about_ported_ids(tokenizers):
    llama = audit_tokens(tokenizers["llama2"], get_template("llava_plain"))
    assert not [w for w in llama["warnings"] if "not a yes form" in w or "not a no form" in w]
    assert any(w.startswith("legacy_2tok: misses") and "3869" in w for w in llama["warnings"])
    mistral = audit_tokens(tokenizers["mistral"], get_template("mistral_inst"))
    assert sum("legacy_8tok: fixed" in w for w in mistral["warnings"]) == 8
    assert mistral["readouts"]["template_aware"]["yes_tokens"][-1] == {"id": 5592, "token": "▁Yes"}
    assert mistral["forms"][" Yes"] == {"ids": [5592], "single_token": True,
                                        "first_after_prompt": 5592}


def test_mplug_owl2_template_is_the_oracles_prompt(shared):
    cases = json.loads((shared / "fixtures/mplug_owl2_tiny/expected.json").read_text())["cases"]
    questions = {json.loads(line)["question_id"]: json.loads(line)["text"]
                 for line in (shared / "fixtures/mplug_owl2_tiny/questions.jsonl")
                 .read_text().splitlines()}
    for case in cases:
        assert get_template("mplug_owl2").render(questions[case["question_id"]]) == case["prompt"]
    assert get_template("mplug_owl2_conv").render("Is there a dog in the image?") == \
        "USER: <|image|>Is there a dog in the image? ASSISTANT:"


@pytest.mark.parametrize("template", ["mplug_owl2", "mplug_owl2_conv"])
def test_audit_tokens_cli_on_both_mplug_owl2_templates(shared, template):
    result = CliRunner().invoke(main, ["audit-tokens", "--tokenizer",
                                       str(shared / "tokenizers/llama2/vicuna-7b-v1.5"),
                                       "--template", template, "--format", "json"])
    assert result.exit_code == 0, result.output
    audit = json.loads(result.output)
    assert audit["template"] == template and audit["prompt"].endswith(
        "Is there a dog in the image?" + (" Answer yes or no only.\nASSISTANT:"
                                          if template == "mplug_owl2"
                                          else " ASSISTANT:"))
    aware = audit["readouts"]["template_aware"]
    assert 3869 in aware["yes_ids"] and 1939 in aware["no_ids"]  # ▁Yes / ▁No after "ASSISTANT:"
    assert not [w for w in audit["warnings"] if "not a yes form" in w or "not a no form" in w]
