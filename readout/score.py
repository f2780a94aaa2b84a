"""Scoring records under any set of readouts, without the model.

Logit readouts are recomputed from the stored candidate logits and the run's token sets; text
readouts from the decoded continuation; imported records contribute their stored predictions. A
readout that a record set cannot supply is reported as unavailable (with the reason), never guessed.
"""
from __future__ import annotations

from collections import Counter
from itertools import combinations

from .attention_stats import attention_by_outcome, default_layers, layer_mean
from .metrics import mcnemar_exact, summarize
from .readouts import ALL_CUT, GENERATING, NO_CANDIDATE, NON_FINITE, READOUTS, UNKNOWN, Missing
from .records import Entry, RecordSet, model_name
from .thinking import NOT_CLOSED


# every split of a dataset together: VLMEvalKit's and lmms-eval's row, a run of its own here
POOLED = "Overall"
# Why a readout answered unknown (readouts.undecidable), as the lines under a table name it
REASON_TEXT = {ALL_CUT: "all candidates cut "
                        "(every candidate logit -inf: the method's plausibility cut removed them)",
               NON_FINITE: "non-finite logit (NaN or +inf among the candidates)",
               NO_CANDIDATE: "no candidate id (a side of the readout's token set is empty)",
               NOT_CLOSED: "reasoning not closed (a thinking checkpoint's reasoning ran past its "
                           "cap, or ended, before </think>: no answer position)"}


class Unavailable(Exception):
    """A readout this record set cannot supply; the message says why."""


def _decide(entry: Entry, name: str, records: RecordSet) -> str:
    """A record's decision: UNKNOWN for an error record, an imported file's stored prediction where
    it has one, else the readout computed from what the record holds (its stored prediction where
    the record lacks that), else Unavailable saying why."""
    if entry.error is not None:
        return UNKNOWN
    if records.prefer_stored and name in entry.stored:
        return entry.stored[name]
    try:
        return READOUTS[name].read(records.token_sets.get(name), entry)
    except Missing as why:
        if name in entry.stored:
            return entry.stored[name]
        raise Unavailable(f"question {entry.key}: {why}") from None


def question_order(entry: Entry) -> tuple:
    """Numeric question ids in numeric order, then any others by their text."""
    return (0, int(entry.key), "") if entry.key.isdigit() else (1, 0, entry.key)


def predictions(records: RecordSet, name: str, entries: list[Entry] | None = None) -> list[str]:
    try:
        return [_decide(e, name, records)
                for e in (records.entries if entries is None else entries)]
    except Unavailable:
        method = answer_position_method(records.meta) if READOUTS[name].kind in GENERATING else None
        if method is None:
            raise
        raise Unavailable(METHOD_RUN.format(method=method)) from None


METHOD_RUN = ("the run of method {method} is scored under the answer position's readouts only "
              "(logit and first-token readouts): a contrastive method (VCD, PAI, ICD) changes the "
              "first token's logits, and a text readout would need it inside a decode loop")


def answer_position_method(meta: dict) -> str | None:
    """The method of a run whose records hold the answer position's readouts only (a contrastive
    method of a paired run: VCD, PAI, ICD), else None."""
    method, recorded = (meta.get("method") or {}).get("name"), meta.get("readouts")
    if method in (None, "none") or not isinstance(recorded, list):
        return None
    generated = any(READOUTS[n].kind in GENERATING for n in recorded if n in READOUTS)
    return None if generated else method


def unknown_reasons(records: RecordSet, name: str, entries: list[Entry]) -> dict[str, int]:
    """Per reason (readouts.UNKNOWN_REASONS: every candidate cut, a non-finite logit, an empty
    side), how many of these answered records the readout could not decide, most frequent first; {}
    where none has such a reason (a text readout's unknowns, an imported file's stored
    predictions)."""
    readout, sets = READOUTS[name], records.token_sets.get(name)
    counts = Counter(readout.why_unknown(sets, e) for e in entries
                     if e.error is None and not (records.prefer_stored and name in e.stored))
    counts.pop(None, None)
    return dict(counts.most_common())


def reason_lines(reasons: dict[str, dict[str, int]], of: int | None = None,
                 who: str = "") -> list[str]:
    """'unknown, all candidates cut (...): legacy_2tok 90 of 90, ...': per reason, the readouts
    whose unknown answers it explains (`reasons`: readout → its unknown_reasons), each with its
    count (of `of` answers, where given); `who` names the run the line is about."""
    by_reason: dict[str, list[str]] = {}
    for name, counts in reasons.items():
        for reason, count in counts.items():
            of_all = f" of {of}" if of is not None else ""
            by_reason.setdefault(reason, []).append(f"{name} {count}" + of_all)
    return [f"{who}unknown, {REASON_TEXT.get(reason, reason)}: {', '.join(names)}"
            for reason, names in by_reason.items()]


def _metrics(labels: list[str], decided: list[str], seed: int, resamples: int,
             reasons: dict[str, int]) -> dict:
    """summarize()'s metrics plus `yes_rate_all`: yes answers over every scored question, unknowns
    included, as run_multi_model_audit.py divides (`yes_rate` divides by the answered ones), and
    `unknown_reasons`: why the readout could not decide (unknown_reasons)."""
    m = summarize(labels, decided, seed=seed, resamples=resamples)
    m["yes_rate_all"] = (m["tp"] + m["fp"]) / len(labels) if labels else 0.0
    m["unknown_reasons"] = reasons
    return m


def score_records(records: RecordSet, names: list[str], *, strict: bool = False, seed: int = 0,
                  resamples: int = 1000, layers: tuple[int, int] | None = None) -> list[dict]:
    """One run per dataset and split, and per dataset of several splits one more of them pooled
    (split `Overall`, `pooled`: its splits; skipped where a split has that name): metrics per
    readout, first-token counts, pairwise McNemar p-values, and where the records hold the
    image-attention probe, its statistics per readout over `layers` (inclusive; default: the paper's
    14-19 on 32-layer models, else the middle fifth).

    Error records (a question that got no answer: an unreadable image, a failed generate) are
    counted in `errors` and left out of every metric, as the paper's code drops them. With strict, a
    requested readout the records cannot supply is an error; otherwise it is listed under
    `unavailable` with its reason.
    """
    runs = []
    datasets: dict[str, list[str]] = {}
    for e in records.entries:
        splits = datasets.setdefault(e.dataset, [])
        if e.split not in splits:
            splits.append(e.split)
    for dataset, splits in datasets.items():
        groups = [(split, [split]) for split in splits]
        if len(splits) > 1 and POOLED not in splits:
            groups.append((POOLED, splits))
        for split, members in groups:
            run = _score_group(records, dataset, split, members, names, strict, seed, resamples,
                               layers)
            if split == POOLED:
                run["pooled"] = members
            runs.append(run)
    return runs


def group_entries(records: RecordSet, dataset: str, splits: list[str]) -> list[Entry]:
    """One group's records (a split, or the splits pooled) in question order: by split name, then
    question id, never file order: the bootstrap draws question indices, so a shuffled, resumed or
    merged record file must give the same interval, and POPE's question ids repeat in every
    split."""
    return sorted((e for e in records.entries if e.dataset == dataset and e.split in splits),
                  key=lambda e: (e.split, *question_order(e)))


def run_entries(records: RecordSet, run: dict) -> list[Entry]:
    """The answered records a scored run (one of score_records') was computed from."""
    splits = run.get("pooled") or [run["split"]]
    return [e for e in group_entries(records, run.get("dataset", ""), splits) if e.error is None]


def _score_group(records: RecordSet, dataset: str, split: str, members: list[str], names: list[str],
                 strict: bool, seed: int, resamples: int, layers: tuple[int, int] | None) -> dict:
    everything = group_entries(records, dataset, members)
    entries = [e for e in everything if e.error is None]
    labels = [e.label for e in entries]
    decided, unavailable = {}, {}
    for name in names:
        try:
            decided[name] = predictions(records, name, entries)
        except Unavailable as why:
            if strict:
                raise Unavailable(f"{records.source}: readout {name}: {why}") from None
            unavailable[name] = str(why)
    first_tokens = Counter(str(e.first_token_id) for e in entries if e.first_token_id is not None)
    questions = records.meta.get("questions") or {}
    asked = sum(n if isinstance(n := questions.get(f"{dataset}/{s}" if dataset else s), int) else 0
                for s in members)
    run = {
        "source": records.source,
        **({"model": name} if (name := model_name(records.meta)) else {}),
        **({"dataset": dataset} if dataset else {}),  # records before datasets were named: no key
        "split": split,
        "n": len(everything),
        **({"asked": asked} if asked > len(everything) else {}),  # a run that stopped
        "errors": len(everything) - len(entries),
        "readouts": {n: _metrics(labels, p, seed, resamples, unknown_reasons(records, n, entries))
                     for n, p in decided.items()},
        "first_token_counts": dict(first_tokens.most_common()),
        **_capped(entries, decided),
        "mcnemar": {f"{a} vs {b}": float(f"{mcnemar_exact(labels, decided[a], decided[b]):.4g}")
                    for a, b in combinations(decided, 2)},
    }
    if entries and all(e.image_attention is not None for e in entries):
        run["image_attention"] = _attention(entries, labels, decided, layers, seed, resamples)
    if unavailable:
        run["unavailable"] = unavailable
    non_finite = [e.key for e in entries if e.non_finite]
    if non_finite:  # a numerical fault the logit readouts answer unknown to (NaN): each named
        run["non_finite"] = non_finite
    return run


def _capped(entries: list[Entry], decided: dict) -> dict:
    """{"capped": {readout: answers}}: per text readout, the answers whose text hit its
    max_new_tokens (the model may have said more than the readout read); none when no answer did."""
    counts = Counter(name for e in entries for name in e.capped if name in decided)
    return {"capped": dict(counts)} if counts else {}


def _attention(entries: list[Entry], labels: list[str], decided: dict[str, list[str]],
               layers: tuple[int, int] | None, seed: int, resamples: int) -> dict:
    """Per readout, image attention (mean over `layers`): correct vs wrong, TP vs FP, TN vs FN."""
    depth = len(entries[0].image_attention)
    layers = layers or default_layers(depth)
    values = [layer_mean(e.image_attention, layers) for e in entries]
    return {"layers": list(layers), "num_layers": depth,
            "readouts": {n: attention_by_outcome(values, labels, p, seed=seed, resamples=resamples)
                         for n, p in decided.items()}}
