"""`xling results RUN_ROOT`: a run root's results out, as one table and as TREC run files.

- `metrics_table` gathers the metrics rows of every finished evaluate cell, IR cells
  (`jobs/evaluate.py`: per system, metric and query, plus the mean rows with `query_id`
  empty, the oracle systems and the comparisons' `metric:ttest_p`, `:pri`, ...) and study
  cells (the study's rows), into one table with the cell id in front; columns one
  kind lacks are empty. `write_results` writes it as CSV, Parquet or a LaTeX table (the
  mean rows, systems by metric, for a paper's draft).
- `export_trec_runs` copies the TREC run of every finished retrieve and rerank cell under
  the names pyserini gives its runs (`run.<topics>.<run>.txt`, as
  `run.ciral-v1.0-ha-test-a.bm25-dt.txt`): `<topics>` is the topic set with the query and
  document languages (`test-a-en-ha`), so that every cell has a name of its own.

It reads only manifests and committed files, so it works on any run root, local or S3,
while nothing runs.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from xling.core.status import read_cell
from xling.core.store import RunStore

FORMATS = ("csv", "parquet", "latex")


def _finished(store: RunStore, stage: str) -> list[tuple[str, dict]]:
    out = []
    for cell in sorted(store.list_dirs(stage)):
        if cell.startswith((".", "_")):
            continue
        m = store.read_json_or_none(f"{stage}/{cell}/_manifest.json")
        if m:
            out.append((cell, m))
    return out


def metrics_table(store: RunStore, *, means_only: bool = False) -> pa.Table:
    """Every finished evaluate cell's metrics rows, the cell id first (see the module doc)."""
    tables = []
    for cell, _ in _finished(store, "evaluate"):
        t = read_cell(store, f"evaluate/{cell}")
        if "error" in t.column_names and t["error"].null_count == t.num_rows:
            t = t.drop_columns(["error"])
        if means_only and "query_id" in t.column_names:
            t = t.filter(pc.is_null(t["query_id"]))
        tables.append(t.add_column(0, "cell", pa.array([cell] * t.num_rows, pa.string())))
    if not tables:
        return pa.table({"cell": pa.array([], pa.string())})
    return pa.concat_tables(tables, promote_options="permissive")


def _latex_escape(text: str) -> str:
    return re.sub(r"([&%$#_{}])", r"\\\1", str(text)).replace("~", r"\textasciitilde{}") \
        .replace("^", r"\textasciicircum{}").replace("->", r"$\rightarrow$")


def latex_table(table: pa.Table, digits: int = 4) -> str:
    """The mean rows as a booktabs tabular: one row per (study, setting, lang, system), one
    column per metric (comparisons' rows left out: they are no system's score)."""
    rows = [r for r in table.to_pylist()
            if r.get("query_id") is None and r.get("setting") != "comparison"]
    keys = ["study", "setting", "lang", "system"]
    keys = [k for k in keys if any(r.get(k) is not None for r in rows)]
    if "system" not in keys and any(r.get("model") is not None for r in rows):
        keys.append("model")
    metrics: list[str] = []
    grid: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["metric"] not in metrics:
            metrics.append(r["metric"])
        grid.setdefault(tuple(r.get(k) for k in keys), {})[r["metric"]] = r["value"]

    def num(v):
        return "--" if v is None or (isinstance(v, float) and math.isnan(v)) else \
            f"{v:.{digits}f}"

    lines = [r"\begin{tabular}{" + "l" * len(keys) + "r" * len(metrics) + "}", r"\toprule",
             " & ".join(_latex_escape(h) for h in [*keys, *metrics]) + r" \\", r"\midrule"]
    for k, vals in grid.items():
        lines.append(" & ".join([*(_latex_escape(x if x is not None else "") for x in k),
                                 *(num(vals.get(m)) for m in metrics)]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_results(table: pa.Table, fmt: str, out: str | None) -> bytes | None:
    """The table as `fmt` into the file `out`, or returned (csv, latex) for stdout."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        if not out:
            raise ValueError("--format parquet needs -o FILE (Parquet is binary)")
        import pyarrow.parquet as pq

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out)
        return None
    if fmt == "csv":
        import pyarrow.csv as pcsv

        buf = io.BytesIO()
        pcsv.write_csv(table, buf)
        data = buf.getvalue()
    else:
        data = latex_table(table).encode()
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_bytes(data)
        return None
    return data


def pyserini_run_name(key: dict) -> str:
    """`run.<topics>.<run>.txt`, pyserini's naming of its runs, for a retrieve or rerank cell
    key: `{topics: test-a, qlang: en, doc_lang: ha, run: bm25-dt}` ->
    `run.test-a-en-ha.bm25-dt.txt`."""
    topics = "-".join(str(key[k]) for k in ("topics", "qlang", "doc_lang") if key.get(k)) \
        or "external"

    def safe(s: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.+-]+", "-", s).strip("-") or "x"

    return f"run.{safe(topics)}.{safe(str(key['run']))}.txt"


def export_trec_runs(store: RunStore, dest: str | Path) -> list[Path]:
    """Every finished retrieve and rerank cell's TREC run into `dest` under pyserini's names
    (its `run.trec` where the cell wrote one, else written from its hits)."""
    from xling.tasks.runs import hits_trec_bytes

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    out = []
    for stage in ("retrieve", "rerank"):
        for cell, m in _finished(store, stage):
            key = m.get("key") or {}
            if "run" not in key:
                continue
            name = pyserini_run_name(key)
            if name in written:
                raise ValueError(f"{stage}/{cell} and {written[name]} would both be {name}")
            written[name] = f"{stage}/{cell}"
            rel = f"{stage}/{cell}/{m.get('trec_run') or 'run.trec'}"
            if store.exists(rel):
                data = store.read_bytes(rel)
            else:
                data = hits_trec_bytes(read_cell(store, f"{stage}/{cell}"))
            (dest / name).write_bytes(data)
            out.append(dest / name)
    return out
