"""XRAG's tables in the paper's shapes (Tables 3-6 and 9-11), with the published numbers
of the `expected` file beside ours, then the settings the paper did not run and the rates."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from xling.tasks.tables import delta, fmt, pipe_table, read_expected

from .data import open_path
from .metrics import COUNTS
from .settings import LANGS, SETTING_SPECS, SETTINGS, STUDY, TABLE6_ROWS

if TYPE_CHECKING:
    from .options import Options

CHECKOUT_EXPECTED = Path(os.path.abspath(__file__)).parents[3] / "configs" / "xrag.expected.yaml"
DAGGER = "†"
TRUNCATION_NOTE = (f"{DAGGER} some prompts of this cell were cut to fit the model's "
                   "max_model_len (metric `truncated`; the generate manifests count them "
                   "too): raise max_model_len before comparing.")


def expected_path(opts: Options | None) -> str | None:
    """The published-numbers file the tables read: the ``expected`` option (``auto``: the
    checkout's configs/xrag.expected.yaml, beside configs/xrag.yaml, when it exists)."""
    value = opts.expected if opts is not None else "auto"
    if value == "auto":
        return str(CHECKOUT_EXPECTED) if CHECKOUT_EXPECTED.is_file() else None
    return value or None


def load_expected(path: str | None) -> dict:
    """An xrag.expected.yaml (see configs/xrag.expected.yaml) as a dict; ``{}`` for None."""
    return read_expected(path, opener=open_path) if path else {}


def paper_model(expected: dict, model: str) -> str | None:
    """The paper's name of one of our models (by the expected file's ``aliases``, without
    case), or None when the paper did not run it."""
    want = model.strip().lower()
    for name, spec in (expected.get("models") or {}).items():
        names = [name, *((spec or {}).get("aliases") or [])]
        if want in (str(n).strip().lower() for n in names):
            return name
    return None


def _number(value) -> str:
    """Two decimals (an integer too), a dash for a missing value."""
    return fmt(float(value) if isinstance(value, int) else value)


def _table(title: str, header: list[str], rows: list[list[str]], notes=()) -> str:
    flagged = any(DAGGER in c for r in rows for c in r)
    return pipe_table(header, rows, title=title,
                      notes=[*notes, *([TRUNCATION_NOTE] if flagged else [])])


class _Results:
    """The metric values of one evaluation and the published numbers, as the tables read
    them."""

    def __init__(self, metrics: Iterable[dict], options: Options | None):
        self.values: dict[tuple[str, str, str, str], float | None] = {}
        self.ns: dict[tuple[str, str, str, str], int | None] = {}
        models: list[str] = []
        for r in metrics:
            if r.get("study", STUDY) != STUDY:
                continue
            self.values[(r["setting"], r["lang"], r["model"], r["metric"])] = r["value"]
            self.ns[(r["setting"], r["lang"], r["model"], r["metric"])] = r.get("n")
            if r["model"] != "all" and r["model"] not in models:
                models.append(r["model"])
        self.models = sorted(models)
        self.expected = load_expected(expected_path(options))
        self.run_langs = set(options.langs if options is not None else LANGS)
        self.accuracy_over = options.accuracy_over if options is not None else "all"
        self.full = self.run_langs == set(LANGS)  # our Avg is over the paper's languages
        self.avg_note = [] if self.full else [
            f"Avg is over the run's languages ({', '.join(sorted(self.run_langs))}); the "
            "paper's is over all four, so no difference is shown for it."]

    def get(self, setting, lang, model, metric="accuracy"):
        return self.values.get((setting, lang, model, metric))

    def cut(self, setting, lang, model) -> bool:
        if lang == "avg":
            return any(self.cut(setting, x, model) for x in self.run_langs)
        return bool(self.values.get((setting, lang, model, "truncated")))

    def cell(self, setting, lang, model, metric="accuracy") -> str:
        return _number(self.get(setting, lang, model, metric)) + (
            f" {DAGGER}" if self.cut(setting, lang, model) else "")

    def has(self, model, settings, metric="accuracy") -> bool:
        return any(k[2] == model and k[0] in settings and k[3] == metric for k in self.values)

    def published(self, table: str, model: str) -> tuple[str | None, dict | None]:
        """(the paper's name of the model, its row of `table`), or Nones."""
        name = paper_model(self.expected, model)
        return name, ((self.expected.get(table) or {}).get(name) if name else None)

    def with_paper(self, label, model, cols: list, paper: list | None, paper_name) -> list:
        """Our row, then (for a model the paper ran) the paper's row and the difference."""
        ours = [self.get(s, lang, model) for s, lang in cols]
        rows = [[label] + [self.cell(s, lang, model) for s, lang in cols]]
        if paper is not None:
            rows.append([f"↳ paper: {paper_name}"] + [_number(v) for v in paper])
            rows.append(["↳ Δ (ours − paper)"] + [
                # an average over X is the paper's only over the same four languages
                "–" if (lang == "avg" and not self.full and SETTING_SPECS[s].question == "x")
                else delta(o, p) for o, p, (s, lang) in zip(ours, paper, cols)])
        return rows


def _table3(res: _Results) -> str:
    # Table 3 (xrag.txt L194-201): English questions; our value is the mean over the X cells.
    cols = [("no_retrieval", "avg"), ("oracle", "avg")]
    rows = []
    for model in res.models:
        if not res.has(model, {"no_retrieval", "oracle"}):
            continue
        name, pub = res.published("table3", model)
        paper = [pub.get("no_retrieval"), pub.get("oracle")] if pub else None
        rows += res.with_paper(model, model, cols, paper, name)
    return _table("Table 3: no retrieval and oracle retrieval (English questions of the "
                  "monolingual subset), accuracy (%)",
                  ["Model", "No Retrieval", "Oracle Retrieval"], rows,
                  ["Ours: the mean over the X cells run (each asks the English questions "
                   "of its language's monolingual instances)."])


def _table4(res: _Results) -> str:
    # Table 4 (xrag.txt L211-219)
    cols = [("mono_en", "avg")] + [("mono", lang) for lang in LANGS] + [("mono", "avg")]
    rows = []
    for model in res.models:
        if not res.has(model, {"mono", "mono_en"}):
            continue
        name, pub = res.published("table4", model)
        paper = [pub.get(k) for k in ("en", *LANGS, "avg")] if pub else None
        rows += res.with_paper(model, model, cols, paper, name)
    return _table("Table 4: monolingual retrieval (2 supporting + 6 distracting English "
                  "articles), accuracy (%)",
                  ["Model", "En"] + [lang.capitalize() for lang in LANGS] + ["Avg"], rows,
                  res.avg_note)


def _table5(res: _Results) -> str:
    # Table 5 (xrag.txt L230-237)
    cols = [c for lang in LANGS for c in (("multi_en_x", lang), ("multi", lang))] + \
        [("multi", "avg")]
    header = ["Model"] + [h for lang in LANGS for h in (
        f"En+En_{lang.capitalize()} (En)", f"En+{lang.capitalize()} ({lang.capitalize()})")] + \
        ["Avg (crossling.)"]
    rows = []
    for model in res.models:
        if not res.has(model, {"multi", "multi_en_x"}):
            continue
        name, pub = res.published("table5", model)
        paper = [v for lang in LANGS for v in ((pub.get("en_x") or {}).get(lang),
                                               (pub.get("x") or {}).get(lang))] + \
            [pub.get("avg")] if pub else None
        rows += res.with_paper(model, model, cols, paper, name)
    return _table("Table 5: multilingual retrieval (1 supporting + 3 distracting articles "
                  "in X and the same in English), accuracy (%)", header, rows,
                  res.avg_note + ["En_X: the X articles machine-translated to English by the "
                                  "translate stage (the paper used Google Translate)."])


def _table6(res: _Results) -> list[str]:
    # Table 6 and Tables 9-11 (xrag.txt L247-257, L690-712): one table per model
    header = ["Setting"] + [f"En+{lang.capitalize()}" for lang in LANGS] + ["Avg"]
    out = []
    for model in res.models:
        if not res.has(model, set(TABLE6_ROWS)):
            continue
        name, pub = res.published("table6", model)
        rows = []
        for setting in TABLE6_ROWS:
            cols = [(setting, lang) for lang in LANGS] + [(setting, "avg")]
            paper = [(pub.get(setting) or {}).get(k) for k in (*LANGS, "avg")] if pub else None
            rows += res.with_paper(SETTING_SPECS[setting].label, model, cols, paper, name)
        where = f" (paper: Table {pub.get('table', 6)}, {name})" if pub else ""
        out.append(_table(f"Table 6: controlled analysis of {model} on the multilingual "
                          f"retrieval subset{where}, accuracy (%)", header, rows,
                          res.avg_note if pub else []))
    return out or [_table("Table 6: controlled analysis (multilingual retrieval), accuracy (%)",
                          header, [])]


def _by_setting(res: _Results, title: str, settings, metric: str, show,
                notes=()) -> list[str]:
    """One row per (setting, model) that has `metric`: the languages and Avg; none when no
    row has it."""
    rows = [[model, f"{s}: {SETTING_SPECS[s].label}"]
            + [show(s, lang, model) for lang in LANGS] + [show(s, "avg", model)]
            for s in settings for model in res.models if res.has(model, {s}, metric)]
    if not rows:
        return []
    return [_table(title, ["Model", "Setting"] + [lang.capitalize() for lang in LANGS]
                   + ["Avg"], rows, notes)]


def _n(res: _Results, setting: str, lang: str, model: str) -> str:
    """An accuracy's n, with the failed, unjudged and unparsed items among it named."""
    n = res.ns.get((setting, lang, model, "accuracy"))
    if n is None:
        return "–"
    langs = res.run_langs if lang == "avg" else [lang]
    parts = []
    for name in COUNTS:
        count = sum(int(res.get(setting, x, model, name) or 0) for x in langs)
        if count:
            parts.append(f"{count} {name}")
    return f"{n}" + (f" ({', '.join(parts)})" if parts else "")


def _denominators(res: _Results) -> list[str]:
    """Every accuracy's n: the items it is over and the failed, unjudged and unparsed ones
    among them (how they count: the accuracy_over option)."""
    over = res.accuracy_over
    how = ("failed and unjudged items count as wrong, as the paper's accuracy is over every "
           "item (accuracy_over: all)" if over == "all" else
           "failed and unjudged items are left out of n (accuracy_over: judged)")
    return _by_setting(res, "Items behind each accuracy: n (failed, unjudged, unparsed)",
                       SETTINGS, "accuracy", lambda s, lang, model: _n(res, s, lang, model),
                       notes=[f"n: the items of the cell; {how}. Unparsed answers (no "
                              "<answer>) are wrong. Failed: no output (the call failed, or "
                              "the prompt could not be built, e.g. a flagged translation "
                              "under flagged_translations: wrong); unjudged: no valid "
                              "verdict from the judge panel."])


def _rates(res: _Results) -> list[str]:
    out = []
    for metric, title in (
            ("response_language_error_rate", "Response-language errors (% answered in English)"),
            ("answer_rate", "Answer rate (% of outputs with an <answer> tag)"),
            ("abstain_rate", "Abstain rate (% of answers that are <answer>None</answer>)"),
            ("flagged_translation_rate", "Flagged translations (% of items whose prompt used "
             "an article translate's language check flagged; used unless "
             "flagged_translations: wrong)"),
            ("truncated", "Truncated prompts (count)")):
        def show(setting, lang, model, metric=metric):
            value = res.get(setting, lang, model, metric)
            return fmt(value, 0) if metric == "truncated" else _number(value)
        out += _by_setting(res, title, SETTINGS, metric, show)
    return out


def tables(metrics: Iterable[dict], options: Options | None = None) -> str:
    """Markdown tables in the paper's shapes: Table 3 (models x No Retrieval / Oracle
    Retrieval, English questions), Table 4 (models x En, De, Es, Zh, Ar, Avg), Table 5
    (models x En+En_X and En+X per language, Avg (crossling.)), Table 6 (one table per
    model: rows XRAG-MultiR, +EQ, +EQ, +ES, MonoRAG; columns En+De..En+Ar, Avg); then the
    settings not in the paper, every accuracy's n with the failed, unjudged and unparsed
    items among it, the response-language errors, answer and abstain rates, and the
    judge-human kappa when present. A model the paper ran (the ``expected`` option's
    file, matched by alias) gets the paper's row and the difference (ours - paper) under
    its own; cells with truncated prompts carry a dagger."""
    res = _Results(metrics, options)
    out = [_table3(res), _table4(res), _table5(res), *_table6(res)]
    # settings the paper did not run
    extensions = [s for s in SETTINGS if SETTING_SPECS[s].paper is None]
    out += _by_setting(res, "Not in the paper (ext_* settings), accuracy (%)", extensions,
                       "accuracy", res.cell)
    out += _denominators(res)
    out += _rates(res)
    kappa = [(k[2], v) for k, v in res.values.items() if k[3] == "kappa"]
    if kappa:
        out.append(_table("Judge panel vs humans, Cohen's kappa", ["Judged model", "kappa"],
                          [[model, _number(v)] for model, v in sorted(kappa)]))
    return "\n\n".join(out) + "\n"
