"""Issue 48: a checkpoint's chat template that does not parse or raises is one line naming its file
and why, where the prompt is rendered (the engine's templates, the backend's, Qwen3-VL's thinking
check alike)."""
import json

import pytest

from pope_fast.readout import get_template

RAISES = "{{ raise_exception('this template takes no images') }}"
UNPARSED = "{% for m in messages %}{{ m['content'] }"


@pytest.fixture
def tokenizer_with(tmp_path):
    """A stand-in tokenizer saved with `template` in `where` (chat_template.jinja, or
    tokenizer_config.json), and read back as a run reads it."""
    from transformers import AutoTokenizer

    from pope_fast.engine.synthetic import builtin_chat_tokenizer

    def make(template: str, where: str):
        folder = tmp_path / where.replace(".", "-")
        builtin_chat_tokenizer(["<image>"], eos="</s>", pad="<pad>",
                               chat_template=template).save_pretrained(folder)
        if where == "tokenizer_config.json":
            (folder / "chat_template.jinja").unlink(missing_ok=True)
            config = json.loads((folder / where).read_text())
            (folder / where).write_text(json.dumps({**config, "chat_template": template}))
        return folder / where, AutoTokenizer.from_pretrained(str(folder))
    return make


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_a_template_that_raises_names_its_file_and_its_message(where, tokenizer_with):
    path, tokenizer = tokenizer_with(RAISES, where)
    with pytest.raises(ValueError) as refused:
        get_template("reference_chat").render("Is there a dog?", tokenizer)
    assert str(refused.value) == (f"{path}: its chat template fails "
                                  "(TemplateError: this template takes no images)")


def test_a_template_that_does_not_parse_names_its_file_and_line(tokenizer_with):
    path, tokenizer = tokenizer_with("{{ messages[0] }}\n" + UNPARSED, "chat_template.jinja")
    with pytest.raises(ValueError) as refused:
        get_template("qwen2_vl_chat").render("Is there a dog?", tokenizer)
    assert str(refused.value).startswith(
        f"{path}: its chat template fails at line 2 (TemplateSyntaxError: "), \
        str(refused.value)


def test_a_template_that_renders_is_unchanged(tokenizer_with):
    _, tokenizer = tokenizer_with("{% for m in messages %}"
                                  "{{ m['role'] }}: {{ m['content'][-1]['text'] }}\n"
                                  "{% endfor %}assistant:", "chat_template.jinja")
    assert get_template("reference_chat").render("Is there a dog?", tokenizer) == \
        "user: Is there a dog? Answer yes or no only.\nassistant:"
