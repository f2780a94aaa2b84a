"""Published protocols: everything that decides the POPE number a tool prints, by name.

A protocol is a prompt per model class (what each family's room says it renders: `Coverage`), a
generation length, an answer rule (one of the readouts) and the tool's own aggregation: which groups it
reports (per split, pooled), how an answer that is neither yes nor no counts, what its yes-ratio counts,
and the unit. The aggregations below are the tools' formulas as their sources write them, operation for
operation, so that the floats are the ones the tool prints; each cites the file and lines it follows.

A run records every readout, so any run can be scored under any protocol; whether that reproduces the
tool's number depends on whether the run asked the tool's prompt at the tool's length, which `checks`
says from the run's meta.json.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from .metrics import summarize
from .readouts import NO, YES
from .records import RecordSet
from .score import POOLED, Unavailable, predictions, question_order

COUNTS = ("TP", "FP", "TN", "FN", "unknown")  # shown as counts, not in the tool's number format


@dataclass(frozen=True)
class Coverage:
    """How a protocol runs one family's checkpoint: the tool's model class it follows, the template that
    renders that class's prompt, the tool's new-token limit for it (None: its rule reads no text), the
    image preprocessing, and what of the tool's pipeline this engine does not reproduce."""

    model_class: str
    template: str
    new_tokens: int | None
    image_aspect: str = "processor"
    deviations: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"model_class": self.model_class, "template": self.template, "max_new_tokens": self.new_tokens,
                "image_aspect": self.image_aspect, "deviations": list(self.deviations)}


def _count(labels, decided, label, answer) -> int:
    return sum(1 for y, d in zip(labels, decided) if y == label and d == answer)


def lmms_eval_metrics(labels: list[str], decided: list[str]) -> dict:
    """lmms-eval v0.7.2 tasks/pope/utils.py l.31-84: accuracy the mean score (an answer other than the label
    scores 0); precision over answers "yes"; recall's false negatives only the answers "no" (another answer to
    a yes question leaves its denominator); F1 2(PR)/(P+R); the yes-ratio that of the labels; 0 for an empty
    denominator. Fractions."""
    score = 0.0
    for y, d in zip(labels, decided):
        score += 1.0 if d == y else 0.0
    tp, fp, fn = _count(labels, decided, YES, YES), _count(labels, decided, NO, YES), _count(labels, decided, YES, NO)
    precision = tp / (tp + fp) if (tp + fp) > 0 else 0
    recall = tp / (tp + fn) if (tp + fn) > 0 else 0
    f1 = 2 * (precision * recall) / (precision + recall) if (precision + recall) > 0 else 0
    yes, no = labels.count(YES), labels.count(NO)
    return {"pope_accuracy": score / len(labels), "pope_f1_score": f1, "pope_precision": precision,
            "pope_recall": recall, "pope_yes_ratio": yes / (yes + no) if (yes + no) > 0 else 0}


def vlmevalkit_metrics(labels: list[str], decided: list[str]) -> dict:
    """VLMEvalKit e8e78f05 vlmeval/dataset/utils/yorn.py POPE_rating l.148-187: an extracted 'Unknown' is a
    negative prediction in precision, recall and F1 (y_pred 1 only for 'Yes') and wrong in accuracy
    (image_yorn.py l.91: score = answer == extracted); F1 2(PR)/(P+R); 0 for an empty denominator; every value
    x100, F1 in the column it names `Overall`; no yes-ratio."""
    tp, fp = _count(labels, decided, YES, YES), _count(labels, decided, NO, YES)
    fn = sum(1 for y, d in zip(labels, decided) if y == YES and d != YES)
    precision = tp / (tp + fp) if (tp + fp) != 0 else 0
    recall = tp / (tp + fn) if (tp + fn) != 0 else 0
    f1 = 2 * (precision * recall) / (precision + recall) if (precision + recall) != 0 else 0
    right = sum(1 for y, d in zip(labels, decided) if y == d)
    return {"Overall": f1 * 100, "acc": right / len(labels) * 100, "precision": precision * 100,
            "recall": recall * 100}


SCRIPT_STOPS = "the script stops here with ZeroDivisionError (no yes answer, or no yes answer right)"


def _script_prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    """Precision, recall and F1 in the order of operations POPE's evaluate.py and RePOPE's compute_results
    share (float divisions, then 2PR/(P+R)); ZeroDivisionError where those scripts stop."""
    precision = float(tp) / float(tp + fp)
    recall = float(tp) / float(tp + fn)
    return precision, recall, 2 * precision * recall / (precision + recall)


def pope_evaluate_metrics(labels: list[str], decided: list[str]) -> dict:
    """RUCAIBox/POPE evaluate.py (3df3ba1) l.23-62, which LLaVA's llava/eval/eval_pope.py copies (l.22-61):
    every answer not "no" a yes prediction; precision, recall, F1 2PR/(P+R) in that order of operations,
    accuracy, and the yes-ratio of the predictions. Fractions. Where the script divides by zero (no yes
    answer, or none right) it stops with ZeroDivisionError: those values are None and `error` says so."""
    pred = [0 if d == NO else 1 for d in decided]
    truth = [0 if y == NO else 1 for y in labels]
    tp = sum(1 for p, y in zip(pred, truth) if p == 1 and y == 1)
    fp = sum(1 for p, y in zip(pred, truth) if p == 1 and y == 0)
    tn = sum(1 for p, y in zip(pred, truth) if p == 0 and y == 0)
    fn = sum(1 for p, y in zip(pred, truth) if p == 0 and y == 1)
    out = {"TP": tp, "FP": fp, "TN": tn, "FN": fn, "Accuracy": None, "Precision": None, "Recall": None,
           "F1 score": None, "Yes ratio": pred.count(1) / len(pred)}
    try:
        precision, recall, f1 = _script_prf(tp, fp, fn)
    except ZeroDivisionError:
        return {**out, "error": SCRIPT_STOPS}
    return {**out, "Accuracy": (tp + tn) / (tp + tn + fp + fn), "Precision": precision, "Recall": recall,
            "F1 score": f1}


def repope_metrics(labels: list[str], decided: list[str]) -> dict:
    """RePOPE's compute_results (YanNeu/RePOPE bcf22e5 src/eval_utils.py l.37-79), one subset: an answer
    compute_answer left None (unknown) is in none of TP/FP/TN/FN (l.49-56), so it leaves accuracy's and the
    yes-ratio's denominators too (l.65-66); precision, recall, F1 2PR/(P+R) in its order of operations.
    Fractions. `unknown` counts the answers left out (the script prints none). Where it divides by zero
    (no yes answer, or none right) it stops with ZeroDivisionError: those values are None, `error` says so."""
    tp, fp = _count(labels, decided, YES, YES), _count(labels, decided, NO, YES)
    tn, fn = _count(labels, decided, NO, NO), _count(labels, decided, YES, NO)
    out = {"TP": tp, "FP": fp, "TN": tn, "FN": fn, "Precision": None, "Recall": None, "F1": None, "ACC": None,
           "Yes Ratio": None, "unknown": sum(1 for d in decided if d not in (YES, NO))}
    try:
        precision, recall, f1 = _script_prf(tp, fp, fn)
    except ZeroDivisionError:
        return {**out, "error": SCRIPT_STOPS}
    return {**out, "Precision": precision, "Recall": recall, "F1": f1, "ACC": (tp + tn) / (tp + tn + fp + fn),
            "Yes Ratio": (tp + fp) / (tp + tn + fp + fn)}


def audit_metrics(labels: list[str], decided: list[str]) -> dict:
    """The audit's (ugaa-research run_multi_model_audit.py), as pope-fast scores every readout: an unknown
    answer kept out of the confusion matrix and wrong in accuracy; F1 2TP/(2TP+FP+FN); the yes-rate of
    the answered predictions."""
    m = summarize(labels, decided, resamples=1)
    return {k: m[k] for k in ("f1", "accuracy", "precision", "recall", "yes_rate", "unknown")}


@dataclass(frozen=True)
class Protocol:
    name: str
    title: str
    version: str  # the release or commit its sources were read at
    readout: str  # the answer rule: a READOUTS name
    aggregate: Callable[[list[str], list[str]], dict]  # one group's metrics, as the tool computes them
    headline: str  # the metric a paper quotes
    pooled: bool  # whether the tool reports the splits together too (the `Overall` row)
    shown: Callable[[float], str]  # how the tool prints a value
    sources: tuple[str, ...]
    reproduces: str  # which published numbers it is
    unknown_is_no: bool = False  # whether its F1 counts an answer neither yes nor no as a no (else leaves it out)
    mean_of_splits: bool = False  # whether its users quote the mean of the splits' F1 (LLaVA-1.5's paper)
    # A tool that prescribes no prompt, model class or length (it runs each model through its own code): why,
    # in one line; such a protocol scores runs but is no `eval --protocol` (the engine's families have no
    # Coverage for it), and `checks` says this line instead of comparing the run with a Coverage.
    unprescribed: str | None = None

    def score_group(self, labels: list[str], decided: list[str]) -> dict:
        """The tool's metrics of one group; every decision must be one (a readout's yes/no/unknown)."""
        if len(labels) != len(decided) or not labels:
            raise ValueError(f"protocol {self.name}: {len(labels)} labels, {len(decided)} answers")
        return self.aggregate(labels, decided)

    def summary(self, rows: list[dict]) -> dict | None:
        """A number the tool's users derive from its per-split rows: LLaVA-1.5's paper quotes the mean of
        the three splits' F1 (LLaVA issue #626 reproduces 85.9 that way; the scripts print per split)."""
        if not self.mean_of_splits:
            return None
        f1 = [r["F1 score"] for r in rows if r["split"] != POOLED]
        if len(f1) < 2 or any(v is None for v in f1):
            return None
        return {"mean split F1": sum(f1) / len(f1), "splits": len(f1)}

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "version": self.version, "readout": self.readout,
                "headline": self.headline, "pooled": self.pooled, "sources": list(self.sources),
                "reproduces": self.reproduces}


PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        Protocol("lmms-eval", "lmms-eval's POPE task", "lmms-eval v0.7.2 (cb45ac4d)", "exact_match",
                 lmms_eval_metrics, "pope_f1_score", True, lambda v: "%.4f" % v,
                 ("lmms_eval/tasks/pope/pope.yaml (max_new_tokens 128, greedy; post_prompt '\\nAnswer the question "
                  "using a single word or phrase.')",
                  "lmms_eval/tasks/pope/utils.py l.9-14 (prompt), l.17-28 (exact match), l.31-84 (aggregation)",
                  "lmms_eval/utils.py make_table l.606, l.625 (sorted metrics, '%.4f')",
                  "lmms_eval/models/chat/llava_hf.py, simple/qwen2_vl.py, simple/instructblip.py (each class's "
                  "prompt)"),
                 "`--tasks pope` (the Overall row: all 9,000 questions pooled) and `--tasks pope_full` (one row per "
                 "split), as fractions"),
        Protocol("vlmevalkit", "VLMEvalKit's POPE (offline: --judge exact_matching)", "VLMEvalKit 0.2rc1 (e8e78f05)",
                 "yorn", vlmevalkit_metrics, "Overall", True, lambda v: format(v, "g"),
                 ("vlmeval/dataset/image_yorn.py l.31-38 (the bare question), l.91 (score)",
                  "vlmeval/dataset/utils/yorn.py l.148-187 (POPE_rating), l.254-261 (YOrN_Extraction)",
                  "vlmeval/smp/misc.py l.18-33 (process_punctuation)",
                  "vlmeval/vlm/llava/llava.py, vlmeval/vlm/qwen2_vl/prompt.py, vlmeval/vlm/mplug_owl2.py (prompts, "
                  "generation)"),
                 "the POPE score CSV: F1 (`Overall`), acc, precision, recall in percent, an Overall row over every "
                 "split and one per split; with an API judge configured, VLMEvalKit asks GPT for its Unknown rows, "
                 "which this does not", unknown_is_no=True),
        Protocol("llava", "LLaVA-1.5's scripts/v1_5/eval/pope.sh", "haotian-liu/LLaVA c121f04", "pope_official",
                 pope_evaluate_metrics, "F1 score", False, str,
                 ("scripts/v1_5/eval/pope.sh (model_vqa_loader --conv-mode vicuna_v1 --temperature 0)",
                  "llava/eval/model_vqa_loader.py l.39-51 (prompt), l.104-114 (max_new_tokens 128, greedy)",
                  "llava/conversation.py l.242-251 (conv_vicuna_v1)",
                  "llava/eval/eval_pope.py l.8-20 (answer rule), l.22-61 (metrics, per category)"),
                 "eval_pope.py's per-split lines and the paper's one number, the mean of the splits' F1; LLaVA used "
                 "POPE at e3e39262 (random: 2,910 questions): give those files to reproduce its figures",
                 mean_of_splits=True),
        Protocol("pope-official", "RUCAIBox/POPE evaluate.py", "RUCAIBox/POPE 3df3ba1", "pope_official",
                 pope_evaluate_metrics, "F1 score", False, str,
                 ("evaluate.py l.9-21 (answer rule), l.23-62 (metrics, one split file)",),
                 "POPE's evaluate.py per split file; it prescribes no prompt or generation"),
        Protocol("paper", "the audit (arXiv 2610.25964)", "pope-fast's readouts", "template_aware", audit_metrics,
                 "f1", False, lambda v: "%.4f" % v,
                 ("ugaa-research run_multi_model_audit.py (its prompts, readouts and metrics, as readout/readouts.py "
                  "and readout/metrics.py state them)",),
                 "the audit's per-split F1 under the template-aware readout (its tables give every readout: "
                 "`pope-fast score`)"),
    )
}


# Protocols that only score: no family declares a Coverage for them (engine/models), so `eval --protocol`
# keeps to PROTOCOLS and score, compare and report take these too.
SCORE_ONLY: dict[str, Protocol] = {
    "repope": Protocol(
        "repope", "RePOPE's src/evaluate.py (POPE's questions, its labels and POPE's)", "YanNeu/RePOPE bcf22e5",
        "repope", repope_metrics, "F1", False, str,
        ("src/eval_utils.py l.5-13 (compute_answer), l.37-79 (compute_results, per subset)",
         "src/evaluate.py l.55-67 (one set of responses scored under POPE's and RePOPE's labels)"),
        "its results JSON per subset (TP, FP, TN, FN, Precision, Recall, F1, ACC, Yes Ratio), for POPE's labels and, "
        "with score --labels annotations/coco_repope_{split}.json, RePOPE's",
        unprescribed="RePOPE prescribes no prompt or length: each of its evaluators (src/vlms/) runs the model's "
                     "own code on POPE's question text, with its own max_new_tokens (15 to 1024): this run's are "
                     "unchecked"),
}
SCORING_PROTOCOLS: dict[str, Protocol] = {**PROTOCOLS, **SCORE_ONLY}


def get_protocol(name: str) -> Protocol:
    try:
        return SCORING_PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(SCORING_PROTOCOLS)}") from None


def checks(protocol: Protocol, meta: Mapping, capped: int) -> list[str]:
    """What stands between a run and the number `protocol`'s tool prints for its model: each line a
    difference (the prompt, the length, the image preprocessing, a method), or what the tool's pipeline
    does that this engine does not; [] when the run is the protocol's as far as the engine reproduces it.
    `capped`: how many of the run's answers its length cut for the protocol's readout."""
    if protocol.unprescribed is not None:
        return [protocol.unprescribed]
    coverage = (meta.get("protocol_coverage") or {}).get(protocol.name)
    if coverage is None:
        return [f"meta.json does not record {protocol.name}'s prompt for this model (a run made before --protocol, "
                "or imported): the prompt and length are unchecked"]
    if "not_covered" in coverage:
        return [f"{protocol.name} does not cover this model: {coverage['not_covered']}"]
    out = []
    if meta.get("template") != coverage["template"]:
        out.append(f"prompt: this run's template is {meta.get('template')}, {protocol.name}'s is "
                   f"{coverage['template']} (a different prompt is a different run: eval --protocol {protocol.name})")
    method = (meta.get("method") or {}).get("name", "none")
    if method != "none":
        out.append(f"method: {method} changes what the model is asked")
    if (meta.get("settings") or {}).get("image_aspect", "processor") != coverage["image_aspect"]:
        out.append(f"image: this run's image_aspect is {meta['settings']['image_aspect']}, {protocol.name}'s "
                   f"{coverage['image_aspect']}")
    wanted = coverage["max_new_tokens"]
    generated = ((meta.get("generation") or {}).get(protocol.readout) or {}).get("max_new_tokens")
    if wanted is not None and generated != wanted:
        if generated is None:
            out.append(f"generation: this run has no {protocol.readout} text")
        elif generated > wanted:
            out.append(f"generation: {protocol.readout} read up to {generated} new tokens, {protocol.name} {wanted}")
        elif capped:
            out.append(f"generation: {capped} answers were cut at {generated} new tokens; {protocol.name} generates "
                       f"up to {wanted}")
    return out + [f"not reproduced: {d}" for d in coverage.get("deviations", [])]


def score_protocol(records: RecordSet, protocol: Protocol) -> list[dict]:
    """Per dataset of the records: the tool's rows (one per split, then `Overall` where it pools), the
    number its users derive (`summary`), and `checks`: what keeps this from being the tool's own number.
    Error records (questions that got no answer) are left out and counted; the tool would have stopped."""
    out = []
    for dataset in dict.fromkeys(e.dataset for e in records.entries):
        entries = sorted((e for e in records.entries if e.dataset == dataset), key=question_order)
        answered = [e for e in entries if e.error is None]
        try:
            decided = dict(zip(map(id, answered), predictions(records, protocol.readout, answered)))
        except Unavailable as why:
            raise Unavailable(f"{records.source}: protocol {protocol.name} reads {protocol.readout}: {why}") from None
        groups = {split: [e for e in answered if e.split == split] for split in dict.fromkeys(e.split for e in entries)}
        if protocol.pooled:
            groups[POOLED] = answered
        rows = [{"split": split, "n": len(group),
                 **protocol.score_group([e.label for e in group], [decided[id(e)] for e in group])}
                for split, group in groups.items() if group]
        capped = sum(1 for e in answered if protocol.readout in e.capped)
        errors = len(entries) - len(answered)
        notes = checks(protocol, records.meta, capped)
        notes += [f"{errors} questions have error records (no answer), left out"] if errors else []
        run = {"source": records.source, **({"dataset": dataset} if dataset else {}), "protocol": protocol.name,
               "readout": protocol.readout, "rows": rows, "errors": errors, "checks": notes}
        summary = protocol.summary(rows)
        if summary is not None:
            run["summary"] = summary
        out.append(run)
    return out


def _protocol_csv(runs: list[dict]) -> str:
    """The tool's rows as one CSV (its metric names and unit, full precision), Overall first as VLMEvalKit's
    score file has it, each row named by its run (source, dataset); checks are not in it: see the table."""
    import csv
    import io

    names = list(dict.fromkeys(k for run in runs for row in run["rows"] for k in row
                               if k not in ("split", "n", "error")))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["source", "dataset", "split", "n", *names])
    for run in runs:
        for row in sorted(run["rows"], key=lambda r: r["split"] != POOLED):
            writer.writerow([run["source"], run.get("dataset", ""), row["split"], row["n"],
                             *("" if row.get(k) is None else repr(row[k]) for k in names)])
    return out.getvalue().rstrip("\n")


def format_protocol_runs(runs: list[dict], fmt: str = "table") -> str:
    """The rows as the tool shows them (its metric names, its unit and number format), one table per run and
    dataset, its checks under it ("! ..."); json: every value at full precision; csv: the rows at full
    precision, Overall first."""
    import json

    if fmt == "json":
        return json.dumps(runs, indent=2)
    if fmt == "csv":
        return _protocol_csv(runs)
    blocks = []
    for run in runs:
        protocol = SCORING_PROTOCOLS[run["protocol"]]
        where = run["source"] + (f" ({run['dataset']})" if run.get("dataset") else "")
        names = [k for k in run["rows"][0] if k not in ("split", "n", "error")] if run["rows"] else []
        lines = [f"{protocol.name}: {protocol.title}, {protocol.version}; answer rule {protocol.readout}; {where}",
                 "| split | n | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
        for row in run["rows"]:
            cells = ["-" if row[k] is None else str(row[k]) if k in COUNTS else protocol.shown(row[k]) for k in names]
            lines.append(f"| {row['split']} | {row['n']} | " + " | ".join(cells) + " |")
            lines += [f"! {row['split']}: {row['error']}"] if "error" in row else []
        if "summary" in run:
            lines.append(f"mean of the {run['summary']['splits']} splits' F1: {run['summary']['mean split F1']!r}")
        lines += [f"! {note}" for note in run["checks"]] or [f"the run is {protocol.name}'s: its prompt, length and "
                                                             "image preprocessing"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
