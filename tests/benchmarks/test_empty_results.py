"""An empty result file is refused in one line naming it, never scored as 0 (issue 33): our records,
a VLMEvalKit table, an lmms-eval samples log, an MME result file, AMBER and HallusionBench response
files."""
import re

import pytest
from click.testing import CliRunner

from pope_fast.cli import main

POPE_HEADER = "index\tquestion\tanswer\tprediction\tcategory\n"
MME_HEADER = "index\tquestion\tanswer\tprediction\tcategory\timage_path\n"


@pytest.mark.parametrize("name,content,named,needle", [
    ("run/records.jsonl", "", None, "no records yet"),
    ("run/records.jsonl", "\n  \n", None, "no records yet"),
    ("model_POPE.tsv", "", None, "no rows"),
    ("model_POPE.tsv", POPE_HEADER, None, "no rows"),
    ("samples_pope.jsonl", "", None, "no records yet"),
    ("samples_mme.jsonl", "", "mme", "no samples"),
    ("model_MME.tsv", MME_HEADER, "mme", "no rows"),
    ("results/OCR.txt", "", "mme", "no lines"),
    ("amber.json", "[]", "amber", "no answers in this file"),
    ("hallusionbench.json", "[]", "hallusionbench", "no answers in this file"),
], ids=["records", "records-blank-lines", "vlmevalkit-pope", "vlmevalkit-pope-header-only",
        "lmms-eval-pope", "lmms-eval-mme", "vlmevalkit-mme-header-only", "mme-result-file", "amber",
        "hallusionbench"])
def test_an_empty_result_file_is_refused_naming_it(tmp_path, name, content, named, needle):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    args = ["score", str(path)] + (["--benchmark", named] if named else [])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert re.search(re.escape(str(path)) + r".*" + needle, line), line
    assert "Traceback" not in result.output
