"""Scoring XRAG's generations: the judge panel's majority AND the response-language check
per generation (xrag.txt L186, L591), then accuracy and the rates per cell with their
cross-language averages, and Cohen's kappa against human labels (README.md, "Metrics")."""

from __future__ import annotations

import io
import json
import math
import re
from collections import defaultdict
from typing import TYPE_CHECKING

from xling.tasks.tables import wilson
from xling.tasks.judge import cohen_kappa, language_ok, majority_vote, normalize_verdict

from .data import open_path
from .settings import SETTING_SPECS, STUDY, expected_language

if TYPE_CHECKING:
    from .options import Options

Key = tuple[str, str, str, str]  # (setting, lang, model, item_id)
# Extra generation columns the evaluate stage reads for scoring: the engine's record of a
# prompt cut to fit max_model_len (counted per cell, flagged in the tables).
SCORE_COLUMNS = ("truncated_from", "meta")
# The counts behind each accuracy (metric rows per cell, the items' `outcome`, the table's
# n): a generation that failed (no output: the call failed, or its prompt could not be
# built, e.g. a flagged translation under flagged_translations: wrong), one answered but
# left without a valid judgment, one whose output has no <answer>.
COUNTS = ("failed", "unjudged", "unparsed")
# Figure 19's abstain, <answer>None</answer>, with the decoration models add around it
_ABSTAIN = re.compile(r"[\[\s\"'*]*none[\]\s\"'.*]*", re.I)


def _key(row: dict) -> Key:
    return (str(row.get("setting")), str(row.get("lang")), str(row.get("model")),
            str(row.get("item_id")))



def read_labels(path: str) -> dict[Key, bool]:
    """Human labels: JSON lines or CSV (by extension: .csv/.tsv, else JSON lines) with
    ``item_id, setting, lang, model, label``; label ``correct``/``incorrect`` (or 1/0,
    true/false). A local path or a URI pyarrow opens (``s3://...``). A row that breaks the
    format is a ValueError naming its line."""
    import csv

    out: dict[Key, bool] = {}
    with open_path(path) as f:
        text = f.read().decode("utf-8-sig")
    if path.endswith((".csv", ".tsv")):
        reader = csv.DictReader(io.StringIO(text, newline=""),
                                delimiter="\t" if path.endswith(".tsv") else ",")
        rows = [(line_no, row) for line_no, row in enumerate(reader, 2)]
    else:
        rows = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((line_no, json.loads(line)))
                except ValueError as e:
                    raise ValueError(f"{path}: line {line_no}: malformed JSON ({e})") from None
    for line_no, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {line_no}: expected an object")
        missing = [k for k in ("item_id", "setting", "lang", "model", "label")
                   if row.get(k) in (None, "")]
        if missing:
            raise ValueError(f"{path}: line {line_no}: missing {missing}")
        label = row["label"]
        if isinstance(label, str) and label.strip() in ("0", "1"):
            label = label.strip() == "1"
        elif isinstance(label, int) and not isinstance(label, bool) and label in (0, 1):
            label = bool(label)
        verdict = normalize_verdict(label)
        if verdict is None:
            raise ValueError(f"{path}: line {line_no}: label must be correct/incorrect, "
                             f"got {label!r}")
        out[_key(row)] = verdict == "correct"
    return out


def score_generations(opts: Options, generations: list[dict], judgments: list[dict] | None,
          detected: dict | None = None, labels: str | None = None
          ) -> tuple[list[dict], list[dict]]:
    """Per-generation verdicts and the metrics rows (README.md, "Metrics").

    A generation's verdict: the judges' majority (valid judges only; a tie is not correct)
    AND its answer's language (``detected[(setting, lang, model, item_id)]``) is the
    expected one; without ``detected`` there is no language check. A generation that failed
    (an error and no output at all) has no verdict (outcome ``failed``), nor has an answer
    no judge gave a valid verdict for (``unjudged``); one whose output (even blank) has no
    parsed answer is incorrect (``unparsed``: it did not answer in the asked format).
    Accuracy is over every item of a cell, failed and unjudged ones counting as wrong (the
    paper's accuracy is over all items), or, with ``opts.accuracy_over == "judged"``,
    over the items with a verdict; the counts are metric rows either way.
    ``judgments=None`` (no judge panel): no verdicts, only the answer and language rates.
    """
    panel = judgments is not None
    votes: dict[Key, dict[str, str | None]] = defaultdict(dict)
    for judgment in judgments or ():
        verdict = None if judgment.get("error") else normalize_verdict(judgment.get("verdict"))
        votes[_key(judgment)][str(judgment.get("judge"))] = verdict  # re-judged: the last one
    items = [_score_generation(g, votes.get(_key(g), {}) if panel else None,
                               len(votes.get(_key(g), {})), detected)
             for g in generations]
    metrics = _metrics(opts, items, panel, detected is not None)
    if labels:
        metrics += _kappa_rows(items, read_labels(labels))
    return items, metrics


def _score_generation(generation: dict, votes: dict[str, str | None] | None, n_judges: int,
                      detected: dict | None) -> dict:
    """One generation's item row; ``votes`` is None without a judge panel."""
    key = _key(generation)
    setting, lang, model, item_id = key
    row = {"study": STUDY, "item_id": item_id, "setting": setting, "lang": lang,
           "model": model, "verdict": None, "judge_correct": None, "n_valid_judges": 0,
           "n_judges": n_judges, "answered": None, "lang_ok": None,
           "detected_lang": None, "expected_lang": None, "abstained": None,
           "truncated": generation.get("truncated_from") is not None, "outcome": None,
           "flagged_translation": _flagged(generation), "error": None}
    if setting not in SETTING_SPECS:
        row["error"] = f"unknown setting {setting!r}"
        row["outcome"] = "invalid"
        return row
    row["expected_lang"] = expected_language(setting, lang)
    if generation.get("error") and generation.get("output") is None:  # the call failed
        row["error"] = f"generation failed: {generation['error']}"
        row["outcome"] = "failed"
        return row
    parsed = generation.get("parsed")
    row["answered"] = isinstance(parsed, dict) and bool(str(parsed.get("answer") or "").strip())
    if SETTING_SPECS[setting].docs == "none" and row["answered"]:  # Figure 19's abstain
        row["abstained"] = _ABSTAIN.fullmatch(str(parsed["answer"]).strip()) is not None
    if detected is not None and row["answered"]:
        row["detected_lang"] = detected.get(key)
        row["lang_ok"] = language_ok(row["detected_lang"], row["expected_lang"])
    if votes is None:
        row["outcome"] = "answered" if row["answered"] else "unparsed"
        return row
    correct, n_valid = majority_vote(list(votes.values()))
    row["n_valid_judges"] = n_valid
    row["outcome"] = "judged"
    if correct is None:
        if row["answered"]:
            row["error"] = "no valid judgment"
            row["outcome"] = "unjudged"
            return row
        correct = False
        row["error"] = f"no answer in the output: {generation.get('error') or 'nothing parsed'}"
        row["outcome"] = "unparsed"
    elif not row["answered"]:
        row["outcome"] = "unparsed"
    row["judge_correct"] = correct
    row["verdict"] = bool(correct and row["lang_ok"] is not False)
    return row


def _flagged(generation: dict) -> bool | None:
    """Did the prompt use a translation translate's language check flagged? None for a
    setting that reads no translation (or a prompt made before prompts recorded it)."""
    meta = generation.get("meta")
    if isinstance(meta, str):
        meta = json.loads(meta)
    if not isinstance(meta, dict) or "flagged_translations" not in meta:
        return None
    return bool(meta["flagged_translations"])


def _metric_row(setting, lang, model, metric, value, n, ci=(None, None)) -> dict:
    return {"study": STUDY, "setting": setting, "lang": lang, "model": model,
            "metric": metric, "value": value, "ci_low": ci[0], "ci_high": ci[1], "n": n}


def _rate(setting, lang, model, name, hits, n) -> dict:
    return _metric_row(setting, lang, model, name, 100 * hits / n if n else None, n,
                       wilson(hits, n))


def _cell_metrics(setting: str, lang: str, model: str, rows: list[dict], panel: bool,
                  with_language: bool, over: str = "all") -> list[dict]:
    """The metric rows of one (setting, lang, model) cell; ``over`` is the accuracy's
    denominator: ``all`` items (failed and unjudged ones wrong) or the ``judged`` ones."""
    cell = (setting, lang, model)
    ran = [r for r in rows if r["answered"] is not None]
    out = [_rate(*cell, "answer_rate", sum(r["answered"] for r in ran), len(ran))]
    if panel:
        scored = [r for r in rows if r["verdict"] is not None]
        n = len(scored)
        base = rows if over == "all" else scored
        out += [
            _rate(*cell, "accuracy", sum(r["verdict"] is True for r in base), len(base)),
            _rate(*cell, "judge_accuracy", sum(r["judge_correct"] is True for r in base),
                  len(base)),
            _metric_row(*cell, "n_valid_judges",
                        sum(r["n_valid_judges"] for r in scored) / n if n else None, n)]
        out += [_metric_row(*cell, name, float(sum(r["outcome"] == name for r in rows)),
                            len(rows)) for name in COUNTS]
    if with_language:
        checked = [r for r in rows if r["lang_ok"] is not None]
        out.append(_rate(*cell, "wrong_language_rate",
                         sum(not r["lang_ok"] for r in checked), len(checked)))
        if expected_language(setting, lang) != "en":
            in_english = sum(r["detected_lang"] is not None
                             and language_ok(r["detected_lang"], "en") for r in checked)
            out.append(_rate(*cell, "response_language_error_rate", in_english, len(checked)))
    if SETTING_SPECS[setting].docs == "none":
        told = [r for r in ran if r["answered"]]
        out.append(_rate(*cell, "abstain_rate", sum(bool(r["abstained"]) for r in told),
                         len(told)))
    flagged = [r["flagged_translation"] for r in rows if r.get("flagged_translation") is not None]
    if flagged:  # the share of items whose prompt used a flagged translation (issue 45)
        out.append(_rate(*cell, "flagged_translation_rate", sum(flagged), len(flagged)))
    cut = sum(bool(r.get("truncated")) for r in rows)
    if cut:
        out.append(_metric_row(*cell, "truncated", float(cut), len(rows)))
    return out


def _metrics(opts: Options, items: list[dict], panel: bool, with_language: bool) -> list[dict]:
    """Every cell's metrics, then the ``lang="avg"`` rows: the unweighted mean over the
    configured languages, only where every language has a value."""
    cells: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in items:
        if r["setting"] in SETTING_SPECS:
            cells[(r["setting"], r["lang"], r["model"])].append(r)
    out: list[dict] = []
    # (setting, model, metric) -> lang -> row
    by_lang: dict[tuple[str, str, str], dict[str, dict]] = defaultdict(dict)
    for (setting, lang, model), rows in sorted(cells.items()):
        cell_rows = _cell_metrics(setting, lang, model, rows, panel, with_language,
                                  opts.accuracy_over)
        out += cell_rows
        for r in cell_rows:
            if r["metric"] not in (*COUNTS, "truncated"):
                by_lang[(setting, model, r["metric"])][lang] = r
    for (setting, model, metric), rows_of_lang in sorted(by_lang.items()):
        values = [rows_of_lang.get(lang) for lang in opts.langs]
        if any(v is None or v["value"] is None for v in values):
            continue
        out.append(_metric_row(setting, "avg", model, metric,
                               sum(v["value"] for v in values) / len(values),
                               sum(v["n"] for v in values)))
    return out


def _kappa_rows(items: list[dict], labels: dict[Key, bool]) -> list[dict]:
    pairs: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for r in items:
        key = (r["setting"], r["lang"], r["model"], r["item_id"])
        if key in labels and r["judge_correct"] is not None:
            pairs[r["model"]].append((r["judge_correct"], labels[key]))
    out = []
    groups = [("all", [p for model_pairs in pairs.values() for p in model_pairs])]
    if len(pairs) > 1:
        groups += sorted(pairs.items())
    for model, model_pairs in groups:
        value = cohen_kappa([a for a, _ in model_pairs], [b for _, b in model_pairs]) \
            if model_pairs else None
        if value is not None and math.isnan(value):
            value = None
        out.append(_metric_row("all", "all", model, "kappa", value, len(model_pairs)))
    return out
