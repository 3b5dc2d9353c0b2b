"""BordIRLines' report: the paper's Table 4 per prompt (beside the published numbers where
the run matches the paper's), the citation analysis' table (Fig. 4) and the answers left out
of the CS metrics, as markdown."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from xling.studies.bordirlines.metrics import OUTCOMES
from xling.studies.bordirlines.options import MODES, PROMPTS, STUDY, Options, split_setting
from xling.studies.bordirlines.published import TABLE_METRICS, load_published, paper_label
from xling.tasks.tables import beside, pipe_table


def _beside(metric: str, ours, paper) -> str:
    """xling's value as the paper prints it (CS and rates x100 with one decimal, # Country
    with three), and where the paper has one: ``ours (paper; ours - paper)``."""
    if metric.startswith("Response Countries"):
        return beside(ours, paper, 3)
    return beside(ours, paper, 1, scale=100.0)


def _collect(rows: list[Mapping]):
    """The "all"-language values by (model, setting, metric), and the models, prompts and
    each model's modes in the order the metrics name them."""
    values: dict[tuple[str, str, str], float | None] = {}
    models, prompts, modes_of = [], [], defaultdict(list)
    for row in rows:
        if row.get("lang") != "all":
            continue
        if row.get("setting") == "random":
            values[("RANDOM", "random", row["metric"])] = row["value"]
            continue
        try:
            mode, prompt = split_setting(row["setting"])
        except (ValueError, KeyError):
            continue
        values[(row["model"], row["setting"], row["metric"])] = row["value"]
        if row["model"] not in models:
            models.append(row["model"])
        if mode not in modes_of[row["model"]]:
            modes_of[row["model"]].append(mode)
        if prompt not in prompts:
            prompts.append(prompt)
    return values, models, [p for p in PROMPTS if p in prompts], modes_of


def _cs_tables(values, models, prompts, modes_of, published, retriever, counts
               ) -> list[str]:
    """One Table 4 per prompt: rows RANDOM (direct only), then model x mode; a last column
    n: the answers of the row, with the unparsed, failed and invalid ones among them."""

    def paper(model: str, mode: str, prompt: str) -> dict | None:
        if published is None:
            return None
        if mode == "random":
            return published["table4"].get(("RANDOM", "random"))
        label = paper_label(published, model)
        if label is None or prompt != published["prompt"]:
            return None
        if mode != "no_ir" and retriever != published["retriever"]:
            return None  # no_ir has no retrieval: comparable whatever the retriever
        return published["table4"].get((label, mode))

    head = ["model", "IR mode"] + [h for _, h in TABLE_METRICS] + ["n"]
    tables = []
    for prompt in prompts:
        if prompt == "direct":
            title = "BordIRLines Table 4: concurrence scores, direct prompt (%)"
        else:
            title = ("BordIRLines concurrence scores, citation prompt (%; the paper's Table 4 "
                     "is the direct prompt's; no_ir rows are the direct prompt's)")
        table_rows = []
        if prompt == "direct" and any(k[0] == "RANDOM" for k in values):
            table_rows.append(("", "RANDOM", "random", paper("", "random", prompt)))
        for model in models:
            for mode in [x for x in MODES if x in modes_of[model]]:
                setting = "no_ir-direct" if mode == "no_ir" else f"{mode}-{prompt}"
                if not any(k[0] == model and k[1] == setting for k in values):
                    continue
                table_rows.append((str(model), mode, setting, paper(model, mode, prompt)))
        cells = []
        for model, mode, setting, published_row in table_rows:
            key = "RANDOM" if setting == "random" else model
            cells.append([model, mode] + [
                _beside(metric, values.get((key, setting, metric)),
                        (published_row or {}).get(metric))
                for metric, _ in TABLE_METRICS] + [_n_cell(counts.get((key, setting)))])
        tables.append(pipe_table(head, cells, title=title, heading="###", empty=None))
    return tables


def _citation_table(rows, published, retriever) -> str | None:
    """Citation analysis (Fig. 4): cr / nr of the query language's own documents."""
    cite: dict[tuple[str, str], dict[str, dict[str, tuple]]] = defaultdict(
        lambda: defaultdict(dict))
    for row in rows:
        if row["metric"] in ("citation_rate:qlang", "inclusion_rate:qlang", "no_citations"):
            cite[(row["model"], row["setting"])][row["lang"]][row["metric"]] = (row["value"],
                                                                                row["n"])
    if not cite:
        return None
    paper_citation = (published or {}).get("citation") or {}
    lines = []
    for (model, setting), by_lang in cite.items():
        mode, _ = split_setting(setting)
        match = (published is not None and paper_citation
                 and paper_label(published, model) == paper_citation.get("model")
                 and mode == paper_citation.get("mode")
                 and retriever == published["retriever"])
        for lang in sorted(by_lang, key=lambda x: (x != "all", x)):
            rates = by_lang[lang]
            paper = (paper_citation.get("langs") or {}).get(lang) if match else None
            cr, n = rates.get("citation_rate:qlang", (None, 0))
            nr, _ = rates.get("inclusion_rate:qlang", (None, 0))
            uncited = rates.get("no_citations")
            lines.append([
                model, setting, "all (mean over languages)" if lang == "all" else lang,
                _beside("", cr, (paper or {}).get("cr")),
                _beside("", nr, (paper or {}).get("nr")),
                f"{n} {'languages' if lang == 'all' else 'queries'}",
                f"{int(uncited[0]) if uncited else 0} of {uncited[1] if uncited else 0}"])
    return pipe_table(
        ["model", "setting", "query language", "cr(l_q)", "nr(l_q)", "queries",
         "answers citing nothing"], lines, heading="###",
        title="Citation rate (cr) and inclusion rate (nr) of the query language's documents "
              "(%, averaged over each query language's queries; Fig. 4)")


def _outcomes(rows) -> dict[tuple[str, str], dict[str, int]]:
    """{(model, setting): {"n": answers, "unparsed"/"failed"/"invalid": count}} of the
    "all" rows."""
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for row in rows:
        if row.get("lang") == "all" and row["metric"] in OUTCOMES[1:]:
            key = (row["model"], row["setting"])
            counts[key][row["metric"]] = int(row["value"] or 0)
            counts[key]["n"] = int(row["n"])
    return counts


def _n_cell(c: Mapping | None) -> str:
    """Table 4's n: the answers, with the unparsed, failed and invalid ones named."""
    if not c:
        return ""
    parts = [f"{c[k]} {k}" for k in OUTCOMES[1:] if c.get(k)]
    return f"{c['n']}" + (f" ({', '.join(parts)})" if parts else "")


def _outcomes_table(rows, unparsed: str) -> str | None:
    counts = _outcomes(rows)
    if not counts:
        return None
    how = ("counted as the authors' code counts them (English: 'None'; a claimant language: "
           "the first claimant)" if unparsed == "authors" else "left out (unparsed: drop)")
    return pipe_table(
        ["model", "setting", "answers", "scored", "unparsed", "failed", "invalid"],
        [[model, setting, c.get("n", 0),
          c.get("n", 0) - sum(c.get(k, 0) for k in OUTCOMES[1:]),
          c.get("unparsed", 0), c.get("failed", 0), c.get("invalid", 0)]
         for (model, setting), c in counts.items()],
        title="Answers behind the CS metrics", heading="###",
        notes=[f"Unparsed answers (no option naming a claimant): {how}. Failed answers (no "
               "output) and invalid ones (a query or territory not in the data) are left "
               "out of the CS metrics."])


def render_tables(metrics: Iterable[Mapping], opts: Options | None = None) -> str:
    """Markdown: the paper's Table 4 (bordirlines.txt L466-477) for each prompt run, rows
    model x IR mode (no_ir, qlang, qlang_en, en, rel_langs, swap; the paper's qlang+en,
    en_only and swap_docs) after the RANDOM row, columns KB CS, Con CS, Non CS, ΔCS, ΔCS
    abs, Cst CS (unk), Cst CS (all), # Country mean and std dev; CS in %. ``no_ir`` runs
    with the direct prompt only, so its rows are the ``no_ir-direct`` numbers in every
    prompt's table.

    With ``opts.expected`` (the study options; the paper's numbers, `load_published`), a
    cell whose model, mode, prompt and retriever the paper ran shows ``xling (paper; xling -
    paper)``; the other cells show xling's number only. Then, for citation settings, the
    citation and inclusion rates of the query language's own documents per query language
    (Fig. 4; beside the paper's where it quotes them), and the answers behind the CS
    metrics (scored, unparsed, failed, invalid; Table 4's n column has the same counts)."""
    rows = [m for m in metrics if m.get("study", STUDY) == STUDY]
    values, models, prompts, modes_of = _collect(rows)
    if not models:
        return "_No BordIRLines metrics._\n"
    published = load_published(opts.expected) if opts is not None and opts.expected else None
    retriever = opts.retriever if opts is not None else None
    unparsed = opts.unparsed if opts is not None else "authors"
    parts = _cs_tables(values, models, prompts, modes_of, published, retriever, _outcomes(rows))
    if published is not None:
        parts[-1] += (
            f"\n\nPublished numbers: {published['source']}, Table 4 (the direct prompt, "
            f"{published['retriever']} retrieval). A cell with one shows "
            "`xling (paper; xling − paper)`, where the model, the IR mode, the prompt "
            "and the retriever match (no_ir for any retriever); the others show "
            "xling's number only. The paper's modes qlang+en, en_only and swap_docs "
            "are qlang_en, en and swap here.")
    parts += [t for t in (_citation_table(rows, published, retriever),
                          _outcomes_table(rows, unparsed)) if t]
    return "\n\n".join(parts) + "\n"
