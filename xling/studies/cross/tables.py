"""The paper-shaped tables from the item scores (pandas): T1's summary (exact and
containment accuracy, the paper's <=64k / >64k slices per length unit, mid / edge), accuracy
by length, measured depth (nominal kept beside) and k, hit@k, the query x context matrices,
failure classes and input reduction, rendered as markdown."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from xling.tasks.tables import frame_table

from .data import length_value
from .metrics import ORACLE_LABEL, depth_bin
from .paper import FAILURE_DETAILS, LANGS, MID_POSITIONS


def length_order(values: Iterable[str]) -> list[str]:
    """Length labels, shortest first."""
    return sorted(set(values), key=lambda v: (length_value(v) or 0, str(v)))


def system_order(system: str) -> tuple:
    """Sort key of a system: baseline, cross@k by k, cross (the mean), needle_only (an
    oracle system, "cross@10 (oracle)", after its blind one)."""
    base, oracle = (system[:-len(ORACLE_LABEL)], 1) if system.endswith(ORACLE_LABEL) \
        else (system, 0)
    if base.startswith("cross@"):
        return (1, int(base[6:]), oracle)
    return ({"baseline": 0, "cross": 2, "needle_only": 3}.get(base, 4), 0, oracle)


def _cross_mean_name(cross_cols: list[str]) -> str:
    """``cross``, or ``cross (oracle)`` when the caps are the oracle's."""
    return "cross" + (ORACLE_LABEL if all(c.endswith(ORACLE_LABEL) for c in cross_cols)
                      else "")


def _pct(values: pd.Series) -> float:
    values = values.dropna()
    return float(100 * values.astype(float).mean()) if len(values) else float("nan")


def accuracy_table(items: pd.DataFrame, by: str | Sequence[str], *, metric: str = "correct",
                   cross_mean: bool = True) -> pd.DataFrame:
    """% of items with ``metric`` true, rows ``needles`` x ``by``, columns system (per model
    when there are several): baseline, cross@k..., ``cross`` (unweighted mean over k, the
    paper's "CROSS" average, s3.1), needle_only."""
    by = [by] if isinstance(by, str) else list(by)
    multi = items["model"].nunique() > 1
    col = ["model", "system"] if multi else ["system"]
    grouped = items.groupby(["needles", *by, *col], dropna=False)[metric].apply(_pct)
    table = grouped.unstack(col)
    if cross_mean:
        cross_cols = [c for c in table.columns
                      if str(c[1] if multi else c).startswith("cross@")]
        if cross_cols:
            if multi:
                for m in sorted({c[0] for c in cross_cols}):
                    mine = [c for c in cross_cols if c[0] == m]
                    table[(m, _cross_mean_name([c[1] for c in mine]))] = \
                        table[mine].mean(axis=1)
            else:
                table[_cross_mean_name(cross_cols)] = table[cross_cols].mean(axis=1)
    cols = sorted(table.columns, key=lambda c: (c[0], system_order(c[1])) if multi
                  else system_order(c))
    table = table[cols]
    if multi:
        table.columns = [f"{m}: {s}" for m, s in table.columns]
    else:
        table.columns = [str(c) for c in table.columns]
    table.columns.name = None
    if "length" in by:
        order = length_order(items["length"])
        table = table.reindex(sorted(table.index, key=lambda ix: (
            ix[0], *[order.index(v) if b == "length" else v
                     for b, v in zip(by, ix[1:])])))
    return table


def unit_kind(unit) -> str:
    """What a length counts: ``words`` / ``tokens`` (from ``words:nltk``, ``tokens:gpt-4o``),
    or ``unknown unit``."""
    kind = str(unit or "").split(":", 1)[0]
    return kind if kind in ("words", "tokens") else "unknown unit"


def table_summary(items: pd.DataFrame) -> pd.DataFrame:
    """T1 (s5.5): rows needles x model x system; ``all``: the primary metric (``correct``,
    the ``scoring`` option's: exact match by default) over all cases, ``exact`` and
    ``containment`` beside it, then with the primary metric the paper's slices:
    ``<=64k <unit>`` / ``>64k <unit>`` per length unit of the items (L110 says "under 64k words", the five lengths 2k-64k; the v1 files count
    tokens, so a words and a tokens file never share a column), ``mid`` (depths 25/50/75,
    L125, nominal) and ``edge`` (0/100); ``cross`` = the mean over k."""
    units = (items["unit"].map(unit_kind) if "unit" in items.columns
             else pd.Series("unknown unit", index=items.index))
    kinds = sorted(set(units))

    def acc(g: pd.DataFrame) -> dict:
        lengths, positions, kind = g["length_value"], g["position"], units.loc[g.index]
        row = {"all": _pct(g["correct"]),
               "exact": _pct(g["strict"]) if "strict" in g else float("nan"),
               "containment": _pct(g["contains"]) if "contains" in g else float("nan")}
        for k in kinds:
            row[f"<=64k {k}"] = _pct(g.loc[(kind == k) & (lengths <= 64_000), "correct"])
            row[f">64k {k}"] = _pct(g.loc[(kind == k) & (lengths > 64_000), "correct"])
        row.update({"mid": _pct(g.loc[positions.isin(MID_POSITIONS), "correct"]),
                    "edge": _pct(g.loc[positions.isin((0, 100)), "correct"]), "n": len(g)})
        return row

    rows = {}
    for (n, model, system), g in items.groupby(["needles", "model", "system"]):
        rows[(n, model, system)] = acc(g)
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.names = ["needles", "model", "system"]
    for n, model in {(ix[0], ix[1]) for ix in table.index}:
        ks = [ix for ix in table.index
              if ix[:2] == (n, model) and str(ix[2]).startswith("cross@")]
        if ks:
            mean = table.loc[ks].drop(columns="n").mean(axis=0)
            name = _cross_mean_name([ix[2] for ix in ks])
            table.loc[(n, model, name), :] = [*mean.tolist(), int(table.loc[ks, "n"].sum())]
    table["n"] = table["n"].astype(int)
    return table.reindex(sorted(table.index,
                                key=lambda ix: (ix[0], ix[1], system_order(ix[2]))))


def table_by_length(items: pd.DataFrame) -> pd.DataFrame:
    """Fig 1 / 15 / 16: accuracy by context length."""
    return accuracy_table(items, "length")


def with_depth_bin(items: pd.DataFrame) -> pd.DataFrame:
    """``depth_bin``: the measured depth of the target needle (``depth``) as the nearest of
    0/25/50/75/100 %."""
    return items.assign(depth_bin=[depth_bin(d) for d in items["depth"]])


def table_by_depth(items: pd.DataFrame) -> pd.DataFrame:
    """Fig 2 / 17: accuracy by the measured depth of the target needle (rows needles x
    ``depth_bin``, the nearest 25 %), with ``measured`` (the mean measured depth, %) and
    ``nominal`` (the CSV positions of the rows in the bin) beside: on real data rows
    labelled 25/50/75 % can sit at 11/39/39 %."""
    frame = with_depth_bin(items).dropna(subset=["depth_bin"])
    table = accuracy_table(frame, "depth_bin")
    groups = frame.groupby(["needles", "depth_bin"])
    nominal = groups["position"].agg(lambda s: ", ".join(
        str(x) for x in sorted(set(s), key=lambda v: (not isinstance(v, int), str(v).zfill(3)))))
    table.insert(0, "measured", (groups["depth"].mean() * 100).reindex(table.index))
    table.insert(1, "nominal", nominal.reindex(table.index))
    table.index.names = ["needles", "depth (measured, %)"]
    return table


def table_by_k(items: pd.DataFrame) -> pd.DataFrame:
    """Fig 12 / 13: CROSS accuracy by cap size k (rows needles x k, columns model)."""
    cross = items[items["method"] == "cross"]
    table = cross.groupby(["needles", "k", "model"])["correct"].apply(_pct).unstack("model")
    table.columns.name = None
    table.index = table.index.set_levels(table.index.levels[1].astype(int), level=1)
    return table


def table_pairs(items: pd.DataFrame, *, system: str = "cross", needles: int | None = None
                ) -> pd.DataFrame:
    """Fig 11 / T5: query language (rows) x context language (columns) accuracy, with a
    ``mean`` row and column (unweighted means of the cells). ``system`` ``cross`` pools every
    k (= the mean over k at equal n); or ``baseline``, ``cross@10``, ..."""
    chosen = (items[items["method"] == "cross"] if system == "cross"
              else items[items["system"] == system])
    if needles is not None:
        chosen = chosen[chosen["needles"] == needles]
    matrix = chosen.groupby(["qlang", "clang"])["correct"].apply(_pct).unstack("clang")
    rows = [q for q in LANGS if q in matrix.index] + [q for q in matrix.index if q not in LANGS]
    cols = ([c for c in LANGS if c in matrix.columns]
            + [c for c in matrix.columns if c not in LANGS])
    matrix = matrix.reindex(index=rows, columns=cols)
    matrix["mean"] = matrix.mean(axis=1)
    matrix.loc["mean"] = matrix.mean(axis=0)
    matrix.index.name, matrix.columns.name = "query \\ context", None
    return matrix


def table_failures(items: pd.DataFrame, by: Sequence[str] = ("needles", "model", "system")
                   ) -> pd.DataFrame:
    """Fig 6 / 8 / 9 / 18 / 19: failure classes in % of all items (rows sum to 100)."""
    by = list(by)
    table = pd.crosstab([items[b] for b in by], items["failure_detail"],
                        normalize="index") * 100
    for c in FAILURE_DETAILS:
        if c not in table.columns:
            table[c] = 0.0
    table = table[list(FAILURE_DETAILS)]
    table["llm_failure"] = table["llm_unanswerable"] + table["llm_incorrect"]
    table.columns.name = None
    if "system" in by:
        table = table.reindex(sorted(table.index, key=lambda ix: tuple(
            system_order(v) if b == "system" else v for b, v in zip(by, ix))))
    return table


def table_hits(items: pd.DataFrame) -> pd.DataFrame:
    """LLM-free retrieval: % of CROSS items whose target (``hit@k``) and all labels
    (``all@k``) were in the cap, by needles x k."""
    cross = items[items["method"] == "cross"].astype({"k": int})
    return cross.groupby(["needles", "k"]).agg(
        **{"hit@k": ("target_in_cap", _pct), "all@k": ("all_in_cap", _pct),
           "n": ("target_in_cap", "size")})


def table_reduction(items: pd.DataFrame, *, column: str = "reduction_words") -> pd.DataFrame:
    """Fig 14: mean input reduction (%) of CROSS by context length x context language."""
    cross = items[items["method"] == "cross"].dropna(subset=[column])
    table = cross.groupby(["length", "clang"])[column].mean().unstack("clang") * 100
    table = table.reindex(index=length_order(table.index),
                          columns=[c for c in LANGS if c in table.columns] +
                          [c for c in table.columns if c not in LANGS])
    table.columns.name = None
    return table


def table_isolation(items: pd.DataFrame) -> pd.DataFrame:
    """Needles that ended up as a sentence of their own (%), per context language and
    splitter kind (``blind`` / ``oracle``): each context counted once (the CROSS items of
    its first setting and query language), over the needles a template found."""
    cross = items[items["method"] == "cross"]
    first = cross.drop_duplicates(subset=["item_id", "model"])
    first = first.drop_duplicates(subset=["item_id"])
    first = first.assign(splitter=first["oracle"].map({True: "oracle", False: "blind"}))
    g = first.groupby(["clang", "splitter"])[["needles_isolated", "needles_known"]].sum()
    g["isolated %"] = 100 * g["needles_isolated"] / g["needles_known"].where(
        g["needles_known"] > 0)
    g = g.rename(columns={"needles_isolated": "isolated", "needles_known": "needles"})
    return g[["needles", "isolated", "isolated %"]]


def tables(items: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Every table of the study (item scores from ``metrics.score_rows``) by name."""
    out = {"summary": table_summary(items), "by_length": table_by_length(items),
           "by_depth": table_by_depth(items)}
    if (items["method"] == "cross").any():
        out["by_k"] = table_by_k(items)
        out["hits"] = table_hits(items)
        if "needles_known" in items.columns:
            out["isolation"] = table_isolation(items)
        for n in sorted(items["needles"].unique()):
            out[f"pairs_{n}n"] = table_pairs(items, needles=int(n))
        if items["reduction_words"].notna().any():
            out["reduction"] = table_reduction(items)
    if (items["method"] == "baseline").any():
        for n in sorted(items["needles"].unique()):
            out[f"pairs_{n}n_baseline"] = table_pairs(items, system="baseline", needles=int(n))
    out["failures"] = table_failures(items)
    return out


TABLE_TITLES = {
    "summary": ("Accuracy (%): all (the primary metric, `scoring`), exact and containment; "
                "the primary metric by length per unit (<=64k / >64k), mid (25-75) / edge "
                "(0, 100) (T1; L108-127)"),
    "by_length": "Accuracy (%) by context length (Fig 1, 15, 16)",
    "by_depth": ("Accuracy (%) by measured needle depth, nearest 25 % (nominal positions "
                 "beside; Fig 2, 17)"),
    "by_k": "CROSS accuracy (%) by cap size k (Fig 12, 13)",
    "hits": "Target / all needles in the cap (%), LLM-free",
    "reduction": ("Mean input reduction (%) of CROSS, in the text layer's words (characters "
                  "for zh, ja, th, ...) (Fig 14)"),
    "failures": "Failure classes (% of all items; Fig 6, 8, 9)",
    "isolation": ("Needles that ended up as a sentence of their own (%), per context language "
                  "and splitter (blind: the text alone; oracle: cut out by template)"),
}
# The tables whose CROSS numbers carry no per-column label: their title says "oracle".
_CROSS_ONLY = ("by_k", "hits", "reduction")


def markdown_tables(items: pd.DataFrame) -> str:
    """Every table as markdown. With the oracle splitter every title of a table with CROSS
    numbers says so (the system columns say "(oracle)" themselves)."""
    oracle = bool("oracle" in items.columns and items["oracle"].fillna(False).astype(bool).any())
    parts = []
    if oracle:
        parts.append("**Oracle ablation**: CROSS ranked the sentences of the `oracle` splitter, "
                     "which cuts each needle out by its template (gold knowledge); these are "
                     "not the method's blind results.")
    for name, table in tables(items).items():
        title = TABLE_TITLES.get(name) or (
            f"Query x context accuracy (%), {name.split('_')[1]}"
            f"{', baseline' if name.endswith('baseline') else ', CROSS (all k)'} (Fig 11)")
        if oracle and (name in _CROSS_ONLY or (name.startswith("pairs_")
                                               and not name.endswith("baseline"))):
            title += " [oracle splitter]"
        parts.append(frame_table(table, digits=1, title=title))
    return "\n\n".join(parts) + "\n"
