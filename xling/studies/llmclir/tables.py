"""The paper's Tables 2-7 over the evaluate stage's cells: each topic set and measure as
systems x language pairs with AVG and significance stars, PRI and Realized % on the AVG
column (L249-257), the paper's own rows beside xling's (the `paper:` section of the
config's expected file), and the settings the paper ran beside the config's."""

from __future__ import annotations

import math
from typing import Mapping

from xling.tasks.irmetrics import RunTable, average, canonical, pairs_table
from xling.tasks.tables import fmt, pipe_table

from .metrics import parse_published, pri_on_average
from .settings import beside_paper


def headroom(table: RunTable) -> str:
    """PRI and Realized % on the AVG column for each reranker whose first stage and its
    oracle are in the table ("" when none is)."""
    rows = []
    for reranker, first in table.first_stage.items():
        values = table.values
        if reranker not in values or first not in values or f"{first}+oracle" not in values:
            continue
        got = pri_on_average(*([values[name].get(p, math.nan) for p in table.pairs]
                               for name in (first, f"{first}+oracle", reranker)))
        rows.append([reranker, first, fmt(got["s1"], 4, dash="n/a"),
                     fmt(got["s_star"], 4, dash="n/a"), fmt(got["pri"], 4, dash="n/a"),
                     fmt(got["s2"], 4, dash="n/a"), fmt(got["realized_pct"], 1, dash="n/a")])
    if not rows:
        return ""
    return "PRI and Realized % on the AVG column (LLM-CLIR Eq. 1, 2):\n\n" + pipe_table(
        ["reranker", "first stage", "s1", "s*", "PRI", "s2", "Realized %"], rows) + "\n"


def _printed(table: RunTable, paper_tables: Mapping) -> list[Mapping]:
    """The paper's tables of this topic set and measure."""
    return [printed for printed in paper_tables.values()
            if printed.get("topics") == table.topics and printed.get("metric")
            and canonical(printed["metric"]) == canonical(table.metric)]


def paper_order(table: RunTable, paper_tables: Mapping) -> list[str]:
    """xling's systems in the paper's row order: each `system:` of the paper's tables of this
    topic set and measure, as they first appear (Table 2 before 4 before 6)."""
    return [row["system"] for printed in _printed(table, paper_tables)
            for row in printed["rows"] if row.get("system")]


def paper_beside(table: RunTable, paper_tables: Mapping) -> list[str]:
    """Each of the paper's tables for this topic set and measure, its rows under xling's
    systems of the same name (a row's `system:`), with Δ AVG."""
    out = []
    shown = _printed(table, paper_tables)
    for name, printed in paper_tables.items():
        if not any(printed is p for p in shown):
            continue
        columns = [c for c in printed["columns"] if c != "AVG"]
        rows = []
        for row in printed["rows"]:
            cells = dict(zip(printed["columns"], map(parse_published, row["values"])))
            ours = table.values.get(row.get("system") or "")
            if ours is not None:
                ours_avg = average(ours.get(c, math.nan) for c in columns)
                rows.append({"label": f"xling {row['system']}", "values": ours,
                             "sig": table.significant.get(row["system"], {}),
                             "section": row["section"],
                             "note": f"Δ {ours_avg - cells['AVG'][0]:+.3f}"})
            rows.append({"label": f"paper {row['label']}", "section": row["section"],
                         "values": {c: cells[c][0] for c in columns},
                         "sig": {c: cells[c][1] for c in columns}, "avg": cells["AVG"][0],
                         "note": f"L{row['line']}"})
        out.append(pairs_table(rows, columns,
                               title=f"{name} ({table.metric}): the paper beside xling"))
    return out


def render(tables: list[RunTable], *, paper_tables: Mapping, config: Mapping,
           show_headroom: bool = True, show_paper: bool = True,
           show_settings: bool = True) -> str:
    out = []
    for table in tables:
        out.append(table.markdown(paper_order(table, paper_tables)))
        if show_headroom and (block := headroom(table)):
            out.append(block)
        if show_paper:
            out += paper_beside(table, paper_tables)
    settings = beside_paper(config) if show_settings else []
    if settings:
        out.append(pipe_table(["entry", "setting", "this config", "the paper", "where"],
                              settings, title="LLM-CLIR: this config's settings beside the "
                              "paper's (≠ where they differ)", heading="###") + "\n")
    return "\n".join(out)
