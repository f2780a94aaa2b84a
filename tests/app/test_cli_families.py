"""`pope-fast eval` on a checkpoint of every supported family, through the CLI: the family comes
from config.json, the template from the family, and the run resumes to nothing when repeated."""
import json
import re

import pytest
from click.testing import CliRunner
from registry import REGISTRY
from tinymodels import eval_args, write_pope_set

from pope_fast.cli import main
from pope_fast.engine.models import family_class
from pope_fast.readout import load_questions, load_tokenizer

pytestmark = pytest.mark.slow  # eval through the CLI on each family's tiny checkpoint


@pytest.mark.parametrize("name", REGISTRY)
def test_eval_cli_runs_every_family(name, tiny, tmp_path):
    # the registry's (../shared's real tokenizers where the family has one)
    checkpoint = tiny.checkpoint(name)
    images, files = write_pope_set(tmp_path / "pope", n_images=2, sizes=((90, 40), (40, 90)))
    args = eval_args(checkpoint, images, files, tmp_path / "out", "--readouts", "all",
                     "--max-new-tokens", "3")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert (meta["model"]["family"] == name
            and meta["template"] == family_class(name).default_template)
    # the report's token labels: every candidate id the tokenizer has
    tokenizer = load_tokenizer(checkpoint)
    assert meta["token_strings"] == {str(i): tokenizer.convert_ids_to_tokens(i)
                                     for i in meta["candidate_ids"] if i < len(tokenizer)}
    assert set(meta["token_strings"]) >= {str(i) for s in meta["token_sets"].values()
                                          for i in s["yes_ids"] if i < len(tokenizer)}
    records = [json.loads(line)
               for line in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 16 and all("string_parse" in r["predictions"] and "decoded" in r
                                      for r in records)
    assert all(set(r["predictions"]) >= {"legacy_2tok", "template_aware", "first_token"}
               for r in records)

    counts = re.search(r"(\d+) unique prompts evaluated for (\d+) questions", result.output)
    prompts, questions = map(int, counts.groups())
    asked = [q for f in files for q in load_questions(f)]
    # shared questions asked once
    assert questions == 16 and prompts == len({(q.image, q.text) for q in asked}) < 16
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "0 unique prompts evaluated" in again.output
