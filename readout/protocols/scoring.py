"""A run scored under a protocol: what keeps it from being the tool's own number (`checks`, against
the Coverage its meta.json records), the tool's rows per dataset, and those rows as the tool shows
them."""
from __future__ import annotations

from typing import Mapping

from ..cells import csv_text
from ..records import RecordSet, strict_json
from ..score import POOLED, Unavailable, predictions, question_order
from ..tool_steps import TOOL_STEPS
from .base import STEP_DEFAULTS, Protocol
from .registry import SCORING_PROTOCOLS

# Settings' names → meta's resolved
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
COUNTS = ("TP", "FP", "TN", "FN", "unknown")  # shown as counts, not in the tool's number format


# What each TOOL_STEP that is not an image step changes, as a check names it
STEP_KINDS = {"min_new_tokens": "generation", "answer_cut": "answer", "image_mask": "attention",
              "generation_config": "generation", "repetition_penalty": "generation",
              "num_beams": "generation", "length_penalty": "generation", "max_length": "generation",
              "do_sample": "generation", "temperature": "generation", "top_k": "generation",
              "top_p": "generation"}
# The steps that decide which of the checkpoint's generation config rules a continuation applies;
# where meta.json records those rules, a check compares the rules applied (a checkpoint that sets
# none differs in nothing)
RULE_STEPS = ("generation_config", "repetition_penalty")
NO_RULE = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0,
           "min_new_tokens": 0, "suppress_tokens": [], "begin_suppress_tokens": [],
           "guidance_scale": 1.0}


def applied_rules(recorded: Mapping, steps: Mapping) -> dict:
    """The generation config rules a continuation applies: the checkpoint's (`recorded`, meta.json's
    generation_config) where its steps apply them, under an explicit repetition_penalty; those that
    change nothing left out."""
    how = steps.get("generation_config", "none")
    rules = dict(recorded) if how != "none" else {}
    if steps.get("repetition_penalty") is not None:
        rules["repetition_penalty"] = steps["repetition_penalty"]
    rules = {k: v for k, v in rules.items() if k not in NO_RULE or v != NO_RULE[k]}
    if how == "greedy_output" and {"repetition_penalty", "no_repeat_ngram_size"} & set(rules):
        # generate given inputs_embeds alone: the prompt's ids unseen
        rules["read"] = "the output only"
    return rules


def _rules_text(rules: Mapping) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(rules.items())) or "no rule"


# How each image_reencode hands an image to the processor, in words (engine/inputs/images.py
# reencoded).
REENCODED = {"none": "hands its processor each image file as read",
             "rgb": "converts each image to RGB first (PIL's convert('RGB'), which drops a "
                    "transparency band)",
             "load_image": "opens each image as transformers' load_image does (turned upright by "
                           "its EXIF orientation, then converted to RGB)",
             "jpeg85": "re-encodes each image as a quality-85 JPEG first"}


def checks(protocol: Protocol, meta: Mapping, capped: int) -> list[str]:
    """What stands between a run and the number `protocol`'s tool prints for its model: each line a
    difference (the prompt, the length, the image preprocessing, a method), or what the tool's
    pipeline does that this engine does not; [] when the run is the protocol's as far as the engine
    reproduces it. `capped`: how many of the run's answers its length cut for the protocol's
    readout."""
    if protocol.unprescribed is not None:
        return [protocol.unprescribed]
    coverage = (meta.get("protocol_coverage") or {}).get(protocol.name)
    if coverage is None:
        return [f"meta.json does not record {protocol.name}'s prompt for this model "
                "(a run made before --protocol, or imported): the prompt and length are unchecked"]
    if "not_covered" in coverage:
        return [f"{protocol.name} does not cover this model: {coverage['not_covered']}"]
    out = []
    if meta.get("template") != coverage["template"]:
        out.append(f"prompt: this run's template is {meta.get('template')}, {protocol.name}'s is "
                   f"{coverage['template']} (a different prompt is a different run: "
                   f"eval --protocol {protocol.name})")
    method = (meta.get("method") or {}).get("name", "none")
    if method != "none":
        out.append(f"method: {method} changes what the model is asked")
    if (meta.get("settings") or {}).get("image_aspect", "processor") != coverage["image_aspect"]:
        out.append(f"image: this run's image_aspect is {meta['settings']['image_aspect']}, "
                   f"{protocol.name}'s {coverage['image_aspect']}")
    # the checkpoint's rules; absent in a run from before they were kept
    recorded = meta.get("generation_config")
    for name in TOOL_STEPS:
        if recorded is not None and name in RULE_STEPS:
            continue
        default = STEP_DEFAULTS[name]
        theirs, ours = coverage.get(name, default), (meta.get("settings") or {}).get(name, default)
        if ours != theirs and name == "image_reencode":
            out.append(f"image: this run {REENCODED.get(ours, ours)}; "
                       f"{protocol.name} {REENCODED.get(theirs, theirs)}, "
                       f"so the pixels the model sees can differ "
                       f"(image_reencode {ours}, {protocol.name}'s {theirs})")
        elif ours != theirs:  # no processor bounds set: the checkpoint's own
            shown = [v if v is not None else "the checkpoint's" for v in (ours, theirs)]
            kind = STEP_KINDS.get(name, "image")
            out.append(f"{kind}: this run's {name} is {shown[0]}, {protocol.name}'s {shown[1]}")
    if recorded is not None:
        ours, theirs = (applied_rules(recorded, meta.get("settings") or {}),
                        applied_rules(recorded, coverage))
        if ours != theirs:
            out.append(f"generation: this run's continuations apply {_rules_text(ours)}, "
                       f"{protocol.name}'s generate {_rules_text(theirs)} "
                       "(the checkpoint's generation_config.json under the tool's arguments)")
    dtype, ours = coverage.get("dtype"), (meta.get("settings") or {}).get("resolved_dtype")
    if dtype in TORCH_DTYPES and ours is not None and ours != TORCH_DTYPES[dtype]:
        out.append(f"dtype: this run computed in {ours}, "
                   f"{protocol.name} loads the model in {TORCH_DTYPES[dtype]}")
    out += _length_checks(protocol, coverage, meta, capped)
    return out + [f"not reproduced: {d}" for d in coverage.get("deviations", [])]


def _length_checks(protocol: Protocol, coverage: Mapping, meta: Mapping, capped: int) -> list[str]:
    """The check on length: the run's text for the protocol's readout generated to another cap
    than the tool's, or cut where the tool's cap would have gone on."""
    wanted = coverage["max_new_tokens"]
    generated = ((meta.get("generation") or {}).get(protocol.readout) or {}).get("max_new_tokens")
    if wanted is None or generated == wanted:
        return []
    if generated is None:
        return [f"generation: this run has no {protocol.readout} text"]
    if generated > wanted:
        return [f"generation: {protocol.readout} read up to {generated} new tokens, "
                f"{protocol.name} {wanted}"]
    return [f"generation: {capped} answers were cut at {generated} new tokens; "
            f"{protocol.name} generates up to {wanted}"] if capped else []


def score_protocol(records: RecordSet, protocol: Protocol) -> list[dict]:
    """Per dataset of the records: the tool's rows (one per split, then `Overall` where it pools),
    the number its users derive (`summary`), and `checks`: what keeps this from being the tool's own
    number. Error records (questions that got no answer) are left out and counted; the tool would
    have stopped."""
    out = []
    for dataset in dict.fromkeys(e.dataset for e in records.entries):
        entries = sorted((e for e in records.entries if e.dataset == dataset), key=question_order)
        answered = [e for e in entries if e.error is None]
        try:
            decided = dict(zip(map(id, answered), predictions(records, protocol.readout, answered)))
            if protocol.counted is not None:
                decided = dict(zip(map(id, answered), protocol.counted_answers(answered)))
        except Unavailable as why:
            raise Unavailable(f"{records.source}: protocol {protocol.name} "
                              f"reads {protocol.readout}: {why}") from None
        groups = {split: [e for e in answered if e.split == split]
                  for split in dict.fromkeys(e.split for e in entries)}
        if protocol.pooled:
            groups[POOLED] = answered
        rows = [{"split": split, "n": len(group),
                 **protocol.score_group([e.label for e in group], [decided[id(e)] for e in group])}
                for split, group in groups.items() if group]
        capped = sum(1 for e in answered if protocol.readout in e.capped)
        errors = len(entries) - len(answered)
        notes = checks(protocol, records.meta, capped)
        notes += [f"{errors} questions have error records (no answer), left out"] if errors else []
        run = {"source": records.source, **({"dataset": dataset} if dataset else {}),
               "protocol": protocol.name, "readout": protocol.readout, "rows": rows,
               "errors": errors, "checks": notes}
        summary = protocol.summary(rows)
        if summary is not None:
            run["summary"] = summary
        out.append(run)
    return out


def _protocol_csv(runs: list[dict]) -> str:
    """The tool's rows as one CSV (its metric names and unit, full precision), Overall first as
    VLMEvalKit's score file has it, each row named by its run (source, dataset); checks are not in
    it: see the table."""
    names = list(dict.fromkeys(k for run in runs for row in run["rows"] for k in row
                               if k not in ("split", "n", "error")))
    rows = [["source", "dataset", "split", "n", *names]]
    for run in runs:
        for row in sorted(run["rows"], key=lambda r: r["split"] != POOLED):
            rows.append([run["source"], run.get("dataset", ""), row["split"], row["n"],
                         *("" if row.get(k) is None else repr(row[k]) for k in names)])
    return csv_text(rows)


def format_protocol_runs(runs: list[dict], fmt: str = "table") -> str:
    """The rows as the tool shows them (its metric names, its unit and number format), one table per
    run and dataset, its checks under it ("! ..."); json: every value at full precision; csv: the
    rows at full precision, Overall first."""
    # the shape of every score's JSON, with the means over several datasets' splits
    if fmt == "json":
        averages = protocol_averages(runs)
        return strict_json({"runs": runs, **({"averages": averages} if averages else {})}, indent=2)
    if fmt == "csv":
        return _protocol_csv(runs)
    blocks = []
    for run in runs:
        protocol = SCORING_PROTOCOLS[run["protocol"]]
        where = run["source"] + (f" ({run['dataset']})" if run.get("dataset") else "")
        names = ([k for k in run["rows"][0] if k not in ("split", "n", "error")]
                 if run["rows"] else [])
        lines = [f"{protocol.name}: {protocol.title}, {protocol.version}; "
                 f"answer rule {protocol.readout}; {where}",
                 "| split | n | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
        for row in run["rows"]:
            cells = ["-" if row[k] is None else str(row[k]) if k in COUNTS
                     else protocol.shown(row[k]) for k in names]
            lines.append(f"| {row['split']} | {row['n']} | " + " | ".join(cells) + " |")
            lines += [f"! {row['split']}: {row['error']}"] if "error" in row else []
        if "summary" in run:
            lines.append(f"mean of the {run['summary']['splits']} splits' F1: "
                         f"{run['summary']['mean split F1']!r}")
        lines += [f"! {note}" for note in run["checks"]] or [
            f"the run is {protocol.name}'s: its prompt, length and image preprocessing"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks + [_average_block(source, rows)
                                 for source, rows in protocol_averages(runs).items()])


def protocol_averages(runs: list[dict]) -> dict[str, dict]:
    """Per source whose runs span several datasets (POPE's three: readout/grid.py): the mean of each
    of the tool's rates over the dataset x split rows (pooled rows left out), as papers print POPE
    under the tool's rule, and how many rows it is the mean of; a rate some row lacks (the script
    stopped there) has none."""
    out = {}
    for source in dict.fromkeys(run["source"] for run in runs):
        mine = [run for run in runs if run["source"] == source]
        rows = [row for run in mine for row in run["rows"] if row["split"] != POOLED]
        if len({run.get("dataset", "") for run in mine}) < 2:
            continue
        names = [k for k in rows[0] if k not in ("split", "n", "error", *COUNTS)
                 and all(r.get(k) is None or isinstance(r.get(k), float) for r in rows)]
        out[source] = {"rows": len(rows),
                       **{k: None if any(r.get(k) is None for r in rows)
                          else sum(r[k] for r in rows) / len(rows) for k in names}}
    return out


def _average_block(source: str, average: dict) -> str:
    names = [k for k in average if k != "rows"]
    return "\n".join([f"{source}: the mean of its {average['rows']} dataset x split rows, "
                      "as papers print POPE",
                      "| " + " | ".join(names) + " |", "|" + "---|" * len(names),
                      "| " + " | ".join("-" if average[k] is None else repr(average[k])
                                        for k in names) + " |"])
