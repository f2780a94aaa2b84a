"""Thinking checkpoints' named modes without a model: the mode's parameter, the prompt each mode
renders (a template that reads enable_thinking, one that only opens a <think> block, one that does
neither), which checkpoint thinks and what decode is refused for, and an answer with no answer
position read as unknown with its reason."""
from types import SimpleNamespace

import pytest

from pope_fast.readout import READOUTS, Entry, RecordSet, TokenSets, make_record, score_records
from pope_fast.readout.templates import render_chat
from pope_fast.readout.thinking import (DEFAULT_MAX_TOKENS, NOT_CLOSED, ThinkingMode, after_close,
                                       is_thinking)

USER = [{"role": "user", "content": "Is there a dog?"}]
TURN = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}")
# Qwen3-VL-Thinking's
OPENS = TURN + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
# Qwen3's hybrid
SWITCH = TURN + ("{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% if enable_thinking is defined and "
                 "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
PLAIN = TURN + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


class JinjaTokenizer:
    """apply_chat_template as transformers renders one: the template's variables are its keyword
    arguments."""

    def __init__(self, template: str):
        import jinja2

        self.chat_template, self._template = template, jinja2.Environment().from_string(template)

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **variables):
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **variables)


@pytest.mark.parametrize("spec, mode", [("off", ThinkingMode("off")),
                                        ("decode", ThinkingMode("decode", 4096)),
                                        ("decode:max_tokens=12", ThinkingMode("decode", 12))])
def test_modes_parse(spec, mode):
    assert ThinkingMode.parse(spec) == mode and DEFAULT_MAX_TOKENS == 4096


@pytest.mark.parametrize("spec", ["on", "decode:max_tokens=0", "decode:tokens=5",
                                  "off:max_tokens=5", "decode:"])
def test_a_bad_mode_is_one_line_naming_the_parameter(spec):
    with pytest.raises(ValueError, match="^thinking") as err:
        ThinkingMode.parse(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("template, default, off", [
    (OPENS, "<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    (SWITCH, "<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    (PLAIN, "<|im_start|>assistant\n", "<|im_start|>assistant\n"),
], ids=["opens-a-block", "reads-enable_thinking", "neither"])
def test_off_closes_the_block_as_the_template_allows(template, default, off):
    tokenizer = JinjaTokenizer(template)
    prompt, off_prompt = (render_chat(tokenizer, USER),
                          render_chat(tokenizer, USER, enable_thinking=False))
    assert prompt.endswith("<|im_end|>\n" + default) and off_prompt.endswith("<|im_end|>\n" + off)
    assert is_thinking(prompt, off_prompt) is (template is not PLAIN)
    assert after_close(off_prompt) == "\n\n"


def test_decode_is_refused_for_a_checkpoint_that_does_not_think(tmp_path):
    from pope_fast.engine.thinking import Thinking

    model = SimpleNamespace(tokenizer=JinjaTokenizer(PLAIN), folder=tmp_path, backend="engine",
                            family="qwen3_vl", default_template="qwen2_vl_chat",
                            image_marker="<|vision_start|><|image_pad|><|vision_end|>")
    with pytest.raises(ValueError, match="^thinking decode: .* opens no reasoning block") as err:
        Thinking.of(model, None, "decode")
    assert "\n" not in str(err.value)
    assert (Thinking.of(model, None, "off").to_meta() == {}
            and Thinking.of(model, None, None).mode is None)


def test_the_backend_runs_off_where_asked_and_refuses_decode(tmp_path):
    """The transformers backend reads one answer position: a thinking checkpoint runs as its
    template renders it unless --thinking off, and decode is refused in one line."""
    from pope_fast.engine.thinking import Thinking

    model = SimpleNamespace(tokenizer=JinjaTokenizer(OPENS), folder=tmp_path,
                            backend="transformers", family="qwen3_vl",
                            default_template="reference_chat", image_marker="")
    assert (Thinking.of(model, None, None).mode is None
            and Thinking.of(model, None, None).template.enable_thinking is None)
    off = Thinking.of(model, None, "off")
    assert (off.to_meta() == {"thinking": {"mode": "off"}} and off.template.enable_thinking is False
            and off.answer_template.enable_thinking is False)
    with pytest.raises(ValueError, match="^thinking decode: the transformers backend") as err:
        Thinking.of(model, None, "decode")
    assert "\n" not in str(err.value)


def test_warmup_reasons_a_few_tokens_not_the_cap():
    from pope_fast.engine.thinking import WARMUP_TOKENS, Thinking, warming
    from pope_fast.readout import get_template

    template = get_template("qwen2_vl_chat")
    decode = Thinking(ThinkingMode("decode", 4096), template, template, 7, (8,))
    assert decode.warming() == Thinking(ThinkingMode("decode", WARMUP_TOKENS), template,
                                        template, 7, (8,))
    assert (WARMUP_TOKENS < 8
            and Thinking(ThinkingMode("off"), template, template).warming().mode.mode == "off")
    engine = SimpleNamespace(thinking=decode)
    # Engine.warmup's: the engine's own cap again, even on a fault
    with pytest.raises(RuntimeError), warming(engine):
        assert engine.thinking.mode.max_tokens == WARMUP_TOKENS
        raise RuntimeError
    assert engine.thinking is decode


def test_an_unanswered_record_is_unknown_under_every_readout_with_its_reason():
    """A reasoning not closed within its cap: the record keeps it and says why; every readout reads
    unknown, even where the record's candidate logits would decide, and score counts the reason."""
    question = SimpleNamespace(question_id=1, split="random", image="a.png", label="yes",
                               text="Is there a dog?", dataset="")
    record = make_record(question, "qwen2_vl_chat", first_token_id=None, candidate_logits={},
                         reasoning="Let me look", reasoning_tokens=3, unanswered=NOT_CLOSED,
                         predictions={"template_aware": "unknown"})
    assert (record["reasoning"], record["reasoning_tokens"], record["unanswered"]) == (
        "Let me look", 3, NOT_CLOSED)
    sets = TokenSets((1,), (2,))
    entry = Entry("1", "random", "yes", first_token_id=1, candidate_logits={1: 5.0, 2: 1.0},
                  decoded="yes", unanswered=NOT_CLOSED)
    for name in ("template_aware", "first_token", "string_parse"):
        assert READOUTS[name].read(sets, entry) == "unknown"
        assert READOUTS[name].why_unknown(sets, entry) == NOT_CLOSED
    answered = Entry("2", "random", "no", first_token_id=2, candidate_logits={1: 1.0, 2: 5.0})
    records = RecordSet("run", [entry, answered], {"template_aware": sets}, {}, False)
    [run] = score_records(records, ["template_aware"], resamples=10)
    assert run["readouts"]["template_aware"]["unknown_reasons"] == {NOT_CLOSED: 1}


def test_the_protocols_listing_says_what_each_tool_does_with_a_reasoning(monkeypatch):
    """`pope-fast protocols`: lmms-eval strips the reasoning tags before scoring, VLMEvalKit splits
    at </think>; the tools with no thinking checkpoint say nothing of it (the families' lines left
    out: they load every family)."""
    from pope_fast import protocol_table

    monkeypatch.setattr(protocol_table, "FAMILIES", {})
    said = {block.split(":")[0]: [line for line in block.splitlines()
                                  if line.startswith("  thinking checkpoints: ")]
            for block in protocol_table.describe_protocols().split("\n\n")}
    assert ("reasoning stripped before scoring" in said["lmms-eval"][0]
            and "enable_thinking" in said["lmms-eval"][0])
    assert "the text after the last </think>" in said["vlmevalkit"][0]
    assert all(not lines for name, lines in said.items() if name not in ("lmms-eval", "vlmevalkit"))


def test_a_tools_template_reaches_the_engine_as_an_object(tmp_path):
    """The engine looks up only readout/templates.py's own templates by name: a tool's prompt is its
    protocol's fact, which the caller passes as the Template (one line saying how), and then runs as
    given."""
    from pope_fast.engine.thinking import Thinking
    from pope_fast.readout.protocols import get_template

    model = SimpleNamespace(tokenizer=JinjaTokenizer(PLAIN), folder=tmp_path, backend="engine",
                            family="qwen3_vl", default_template="qwen2_vl_chat",
                            image_marker="<|vision_start|><|image_pad|><|vision_end|>")
    assert Thinking.of(model, "qwen2_vl_chat", None).template.name == "qwen2_vl_chat"
    with pytest.raises(ValueError,
                       match=r"^template 'lmms_eval_qwen2_vl' is not one of the engine's own .*: "
                             r"readout.get_template\(name\)$"):
        Thinking.of(model, "lmms_eval_qwen2_vl", None)
    assert Thinking.of(model, get_template("lmms_eval_qwen2_vl"), None).template.name \
        == "lmms_eval_qwen2_vl"
