"""`report` stage and `xling status`: what is under a run root, what it found, and how.

`report` writes `{run_root}/report/index.html` and `{run_root}/report/summary.md` (and prints
the markdown); `xling status` prints the status table straight from the manifests and shard
markers, so it also works on a run that is still going or was killed.

The report shows, in this order:

- **Results**, one section per study (a study's evaluate cell; for retrieval, a topic set's
  cells): the paper-shaped tables the evaluate cells wrote (`table.md`, and the LLM-CLIR
  tables in `evaluate/tables.md`), with confidence intervals, query counts, significance
  marks and published numbers where the tables have them. Retrieval cells get a summary
  table built from their metric rows: the mean of each metric with a 95% t-interval over
  queries, the query count, and `*` where a configured comparison's paired t-test has
  p < 0.05.
- **Plots**: the PNGs the studies drew (copied into `report/plots/`), and for
  retrieval (and studies that draw none) a bar chart of the main metric per system, drawn
  here with matplotlib on an Agg canvas (no pyplot state).
- **Cells** of the current config (done / partial / failed, rows, errors, location), and
  cells from **superseded configs** flagged apart: cells in the run root whose hash the
  current config no longer asks for. Their results are not shown.
- **Provenance**: the config's name and hash, the git sha, xling, Python and library
  versions, the models the config names with their revisions where known, and the code
  versions recorded in the cells' manifests.

Without a config (`write_report(store)`) every cell counts as current.
"""

from __future__ import annotations

import html
import io
import math
import re
from typing import TYPE_CHECKING, Any, Iterable

from xling.core.cells import now
from xling.core.status import run_status
from xling.core.store import RunStore
from xling.tasks.tables import fmt, pipe_table

if TYPE_CHECKING:
    from xling.config import XlingConfig


def status_table(rows: list[dict]) -> str:
    if not rows:
        return "(no cells yet)"
    head = ("stage", "cell", "state", "shards", "rows", "errors", "note")
    body = [(r["stage"], r["cell"], r["state"], f"{r['shards_done']}/{r['n_shards']}",
             str(r["rows"]), str(r["errors"]), (r.get("message") or "")[:80]) for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*b) for b in body)]).rstrip()


# ---------------------------------------------------------------------------------------
# which cells the current config asks for


def config_cells(cfgs: "Iterable[XlingConfig]",
                 registry: dict[str, type]) -> tuple[set[str], set[str]]:
    """(`stage/cell` dirs the configs ask for, stages whose cells could not be listed).

    Every stage of `registry` (the CLI's stage classes by name) with a section in a config
    lists its cells (`Stage.all_cells`: what `xling run` plans, and the fusions); a
    stage that cannot list them here (an input that is gone, a model not built on this
    machine) is returned apart, and its cells in the run root are neither current nor
    superseded but unknown."""
    dirs: set[str] = set()
    unknown: set[str] = set()
    for cfg in cfgs:
        for name, stage in registry.items():
            if getattr(cfg, name, None) is None:
                continue
            try:
                dirs.update(c.dir for c in stage().all_cells(cfg))
            except Exception:  # noqa: BLE001 - the report must not fail on a stale config
                unknown.add(name)
    return dirs, unknown


# ---------------------------------------------------------------------------------------
# markdown (the pipe tables and headings xling writes) to HTML


_NUM = re.compile(r"^[-+−]?\d[\d,]*(\.\d+)?( ?(%|\*+|†))?( ?[\[(].*[\])])?\*?$")


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    # *italic*, but never a significance mark: `0.512*` or `*` alone stay as they are
    out = re.sub(r"(?<![\w*])\*(?=[^\s*])([^*]+?)(?<=\S)\*(?![\w*])", r"<em>\1</em>", out)
    out = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)",
                 lambda m: f'<a href="{html.escape(m.group(2))}">{m.group(1)}</a>', out)
    return out


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]


_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


def markdown_to_html(md: str, *, demote: int = 0) -> str:
    """HTML for the markdown xling's tables use: ATX headings (shifted down by `demote`
    levels), GitHub pipe tables, fenced code, `-` lists, paragraphs, and **bold**, *italic*,
    `code` and [links](url) inline. A `*` that closes nothing (`0.512*`) is left as it is:
    tables use it for significance. Each table and its title (a heading or a bold line) is
    one block; blocks flow side by side where they fit (`.md` in the report's CSS)."""
    lines = md.splitlines()
    out: list[tuple[str, str]] = []  # (title | table | other, html)
    para: list[str] = []
    i = 0

    def flush() -> None:
        if para:
            title = len(para) == 1 and re.fullmatch(r"\*\*[^*]+\*\*:?", para[0])
            out.append(("title" if title else "other",
                        "<p>" + "<br>\n".join(_inline(p) for p in para) + "</p>"))
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append(("other", "<pre>" + html.escape("\n".join(lines[i + 1:j])) + "</pre>"))
            i = j + 1
            continue
        if m := re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", stripped):
            flush()
            level = min(6, len(m.group(1)) + demote)
            out.append(("title", f"<h{level}>{_inline(m.group(2))}</h{level}>"))
            i += 1
            continue
        if "|" in stripped and i + 1 < len(lines) and _SEP.match(lines[i + 1]) \
                and "-" in lines[i + 1]:
            flush()
            head = _cells(line)
            aligns = []
            for spec in _cells(lines[i + 1]):
                aligns.append("center" if spec.startswith(":") and spec.endswith(":") else
                              "right" if spec.endswith(":") else
                              "left" if spec.startswith(":") else "")
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append(_cells(lines[j]))
                j += 1
            out.append(("table", _html_table(head, rows, aligns)))
            i = j
            continue
        if re.match(r"^[-*]\s+", stripped) and not stripped.startswith("**"):
            flush()
            items = []
            while i < len(lines) and re.match(r"^\s*[-*]\s+", lines[i]) \
                    and not lines[i].strip().startswith("**"):
                items.append(_inline(re.sub(r"^\s*[-*]\s+", "", lines[i])))
                i += 1
            out.append(("other", "<ul>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>"))
            continue
        if not stripped:
            flush()
        else:
            para.append(stripped)
        i += 1
    flush()
    blocks, k = [], 0
    while k < len(out):
        kind, text = out[k]
        if kind == "title" and k + 1 < len(out) and out[k + 1][0] == "table":
            blocks.append(f'<div class="blk">{text}\n{out[k + 1][1]}</div>')
            k += 2
            continue
        blocks.append(f'<div class="blk">{text}</div>' if kind == "table" else
                      f'<div class="full">{text}</div>')
        k += 1
    return '<div class="md">\n' + "\n".join(blocks) + "\n</div>"


def _html_table(head: list[str], rows: list[list[str]], aligns: list[str] | None = None,
                *, raw: bool = False) -> str:
    """An HTML table; numeric-looking cells get class `num` (right-aligned, tabular)."""
    def cell(tag: str, text: str, k: int) -> str:
        cls = ' class="num"' if tag == "td" and _NUM.match(text.strip()) else ""
        align = aligns[k] if aligns and k < len(aligns) and aligns[k] else ""
        style = f' style="text-align:{align}"' if align else ""
        return f"<{tag}{cls}{style}>{text if raw else _inline(text)}</{tag}>"

    width = max([len(head), *(len(r) for r in rows)]) if rows else len(head)
    head = head + [""] * (width - len(head))
    parts = ["<table>", "<thead><tr>" + "".join(cell("th", h, k) for k, h in enumerate(head))
             + "</tr></thead>", "<tbody>"]
    for r in rows:
        r = r + [""] * (width - len(r))
        parts.append("<tr>" + "".join(cell("td", c, k) for k, c in enumerate(r)) + "</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    def esc(cells):
        return [str(c).replace("|", "\\|") for c in cells]

    return pipe_table(esc(head), [esc(r) for r in rows], empty=None)


# ---------------------------------------------------------------------------------------
# results: each study's tables and plots


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _t_interval(values: list[float], lo: float = 0.0,
                hi: float = 1.0) -> tuple[float | None, float | None]:
    """95% t-interval of the mean of per-query values (None for fewer than two), clipped to
    the measure's range (trec_eval measures lie in [0, 1])."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    n = len(vals)
    if n < 2:
        return None, None
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    from scipy.stats import t

    half = float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return max(lo, mean - half), min(hi, mean + half)


def _fmt(v: Any, digits: int = 4) -> str:
    return fmt(v, digits, dash="n/a")


def ir_summary(rows: list[dict]) -> dict:
    """From an IR evaluate cell's metric rows: per system, each metric's mean with a 95%
    t-interval over queries and the query count, and the systems a comparison found
    significantly different (p < 0.05) per metric, with the baseline."""
    metrics: list[str] = []
    means: dict[str, dict[str, dict]] = {}
    per_query: dict[tuple[str, str], list[float]] = {}
    sig: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.get("error") or not r.get("metric") or not r.get("model"):
            continue
        if r.get("setting") == "comparison":
            m, _, what = r["metric"].rpartition(":")
            if what == "ttest_p" and r.get("value") is not None and r["value"] < 0.05:
                baseline = r["model"].split(" vs ", 1)[-1]
                sig.setdefault((r.get("system") or r["model"], m), []).append(baseline)
            continue
        if r["metric"] not in metrics:
            metrics.append(r["metric"])
        if r.get("query_id") is None:
            means.setdefault(r["model"], {})[r["metric"]] = {"value": r.get("value"),
                                                             "n": r.get("n")}
        else:
            per_query.setdefault((r["model"], r["metric"]), []).append(r.get("value"))
    for system, ms in means.items():
        for m, d in ms.items():
            d["ci"] = _t_interval(per_query.get((system, m), []))
    return {"metrics": metrics, "means": means, "sig": sig}


def ir_summary_table(summary: dict) -> tuple[list[str], list[list[str]], list[str]]:
    head = ["system", "queries", *summary["metrics"]]
    body, notes = [], []
    for system, ms in summary["means"].items():
        n = max((d["n"] or 0 for d in ms.values()), default=0)
        row = [system, str(n)]
        for m in summary["metrics"]:
            d = ms.get(m)
            if d is None:
                row.append("")
                continue
            lo, hi = d["ci"]
            text = _fmt(d["value"]) + (f" [{_fmt(lo)}, {_fmt(hi)}]" if lo is not None else "")
            base = summary["sig"].get((system, m))
            if base:
                text += "*"
                notes.append(f"{system} vs {', '.join(base)} ({m})")
            row.append(text)
        body.append(row)
    return head, body, sorted(set(notes))


def plot_ir(cells: list[dict], metric: str) -> bytes | None:
    """Grouped bars: one group per language pair (cell), one bar per system (oracles left
    out), the mean of `metric` with its 95% interval as an error bar."""
    systems: list[str] = []
    for c in cells:
        systems += [s for s in c["summary"]["means"] if not s.endswith("+oracle")
                    and s not in systems]
    if not systems or not cells:
        return None
    fig = _figure(max(4.5, 0.9 * len(cells) * max(1, len(systems)) / 2 + 2.5), 3.4)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(systems)
    for k, s in enumerate(systems):
        xs, ys, lo, hi = [], [], [], []
        for j, c in enumerate(cells):
            d = c["summary"]["means"].get(s, {}).get(metric)
            if d is None or d["value"] is None:
                continue
            xs.append(j + (k - (len(systems) - 1) / 2) * width)
            ys.append(d["value"])
            a, b = d["ci"]
            lo.append(d["value"] - a if a is not None else 0.0)
            hi.append(b - d["value"] if b is not None else 0.0)
        ax.bar(xs, ys, width=width * 0.95, label=s, yerr=[lo, hi], capsize=2,
               error_kw={"elinewidth": 0.8})
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c["label"] for c in cells], fontsize=8)
    ax.set_ylabel(metric)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=min(4, len(systems)), loc="upper left", bbox_to_anchor=(0, -0.12))
    ax.set_title(f"{metric} per system (95% CI over queries)", fontsize=9)
    return _png(fig)


MAIN_STUDY_METRICS = ("accuracy", "accuracy:llm", "ndcg@10", "ndcg_cut_10", "score")


def plot_study(rows: list[dict], limit: int = 40) -> bytes | None:
    """Horizontal bars of a study's main metric, one per (setting, language, model) row,
    with its confidence interval where the study computed one."""
    names = [r["metric"] for r in rows]
    main = next((m for m in MAIN_STUDY_METRICS if m in names), names[0] if names else None)
    sel = [r for r in rows if r["metric"] == main and r["value"] is not None
           and not (isinstance(r["value"], float) and math.isnan(r["value"]))][:limit]
    if not sel:
        return None
    fig = _figure(7.0, 0.8 + 0.22 * len(sel))
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(len(sel)))[::-1]
    err = None
    if any(r.get("ci_low") is not None for r in sel):
        err = [[max(0.0, r["value"] - r["ci_low"]) if r.get("ci_low") is not None else 0.0
                for r in sel],
               [max(0.0, r["ci_high"] - r["value"]) if r.get("ci_high") is not None else 0.0
                for r in sel]]
    ax.barh(ys, [r["value"] for r in sel], xerr=err, capsize=2, color="#4a78b0",
            error_kw={"elinewidth": 0.8})
    ax.set_yticks(ys)
    ax.set_yticklabels([" / ".join(str(r.get(k)) for k in ("setting", "lang", "model")
                                   if r.get(k) is not None) for r in sel], fontsize=7)
    ax.set_xlabel(main)
    ax.set_title(f"{main}" + (" (95% CI)" if err else "") +
                 (f", first {limit} rows" if len(sel) == limit else ""), fontsize=9)
    return _png(fig)


def _metric_rows(store: RunStore, cell_dir: str, manifest: dict) -> list[dict]:
    files = [f"{cell_dir}/{f}" for f in manifest.get("files") or ["part-00000.parquet"]]
    try:
        return store.read_parquet(files).to_pylist()
    except (OSError, ValueError):
        return []


def collect_results(store: RunStore, evaluate: list[dict]) -> list[dict]:
    """The report's study sections from the current, finished evaluate cells."""
    studies: dict[str, dict] = {}
    for r in evaluate:
        d = f"evaluate/{r['cell']}"
        manifest = store.read_json_or_none(f"{d}/_manifest.json") or {}
        key = manifest.get("key") or {}
        # the manifest names the cell's table and plots (paths in the cell dir); cells
        # written before it did have `table.md` / `_table.md` and their figures beside them
        table = next((store.read_bytes(f"{d}/{name}").decode()
                      for name in ([manifest["table"]] if manifest.get("table") else
                                   ["_table.md", "table.md"])
                      if store.exists(f"{d}/{name}")), "")
        plots = manifest.get("plots")
        if plots is None:
            plots = [p[len(d) + 1:] for p in store.list(d) if p.endswith((".png", ".svg"))]
        cell = {"cell": r["cell"], "dir": d, "manifest": manifest, "table": table,
                "plots": sorted(plots), "rows": _metric_rows(store, d, manifest)}
        if "study" in key:
            name = f"study: {key['study']}"
            cell["kind"] = "study"
        else:
            name = "retrieval"  # every topic set: one LLM-CLIR-style study
            cell["kind"] = "ir"
            cell["label"] = (f"{key.get('topics', r['cell'].split('.')[0])} "
                             f"{key.get('qlang', '?')}→{key.get('doc_lang', '?')}")
            cell["summary"] = ir_summary(cell["rows"])
        studies.setdefault(name, {"name": name, "cells": []})["cells"].append(cell)
    return list(studies.values())


# ---------------------------------------------------------------------------------------
# provenance


def provenance_block(store: RunStore, cfgs: list, current_done: list[dict]) -> dict:
    from xling.core.config import hashable, stable_hash
    from xling.core.provenance import model_provenance, provenance

    here = provenance()
    configs = [{"name": c.name, "hash": stable_hash(hashable(c))} for c in cfgs]
    models: list[dict] = []
    seen = set()
    for c in cfgs:
        for m in model_provenance(c.model_dump(mode="json")):
            if m["model"] not in seen:
                seen.add(m["model"])
                models.append(m)
    versions: dict[str, int] = {}
    for r in current_done:
        m = store.read_json_or_none(f"{r['stage']}/{r['cell']}/_manifest.json") or {}
        p = m.get("provenance") or {}
        v = m.get("code_version", "?")
        if p.get("libraries"):
            v += " (" + ", ".join(f"{k} {x}" for k, x in p["libraries"].items()
                                  if k in ("torch", "ray", "vllm") and x) + ")"
        versions[v] = versions.get(v, 0) + 1
    return {"configs": configs, "here": here, "models": models, "cell_versions": versions}


def _provenance_md(p: dict) -> list[str]:
    h = p["here"]
    lines = ["## Provenance", ""]
    for c in p["configs"]:
        lines.append(f"- config: {c['name']} (hash {c['hash']})")
    lines += [f"- git: {h['git_sha'] or 'not a git checkout'}"
              + (" (uncommitted changes)" if h["git_dirty"] else ""),
              f"- xling {h['xling']}, Python {h['python']} ({h['platform']})",
              "- libraries: " + ", ".join(f"{k} {v}" for k, v in h["libraries"].items() if v)]
    for m in p["models"]:
        lines.append(f"- model {m['model']} ({m['keys']}): {m['revision']}")
    for v, n in p["cell_versions"].items():
        lines.append(f"- {n} cell(s) written by {v}")
    return lines


def _provenance_html(p: dict) -> str:
    h = p["here"]
    rows = [[f"config {c['name']}", f"hash {c['hash']}"] for c in p["configs"]]
    rows += [["git sha", (h["git_sha"] or "not a git checkout")
              + (" (uncommitted changes)" if h["git_dirty"] else "")],
             ["xling", str(h["xling"])], ["Python", f"{h['python']} ({h['platform']})"]]
    rows += [[k, v or "not installed"] for k, v in h["libraries"].items()]
    out = ['<h2 id="provenance">Provenance</h2>', '<div class="prov">',
           _html_table(["what", "value"], rows)]
    if p["models"]:
        out += ["<h3>Models</h3>", _html_table(
            ["model", "config keys", "revision"],
            [[m["model"], m["keys"], m["revision"]] for m in p["models"]])]
    if p["cell_versions"]:
        out += ["<h3>Code versions recorded in the cells' manifests</h3>", _html_table(
            ["code version", "cells"], [[v, str(n)] for v, n in p["cell_versions"].items()])]
    out.append("</div>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# the report


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2430;
background:#f6f7f9;line-height:1.4}
main{max-width:1200px;margin:0 auto;padding:1.5rem 2rem 4rem}
header{background:#1d2f4a;color:#fff;padding:1.2rem 2rem}
header h1{margin:0 0 .3rem;font-size:1.5rem}header p{margin:.1rem 0;opacity:.85;font-size:.9rem}
nav{margin-top:.5rem}nav a{color:#cfe0ff;margin-right:1rem;font-size:.9rem}
section.study{background:#fff;border:1px solid #dde2ea;border-radius:8px;padding:1rem 1.4rem;
margin:1.2rem 0}
h2{border-bottom:2px solid #dde2ea;padding-bottom:.2rem}h3,h4,h5,h6{margin:1.1rem 0 .4rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.85rem;background:#fff}
th,td{border:1px solid #d5dae3;padding:.25rem .55rem;text-align:left;vertical-align:top}
th{background:#eef1f6}tbody tr:nth-child(even){background:#fafbfd}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.scroll{overflow-x:auto}.md{display:flex;flex-wrap:wrap;align-items:flex-start;
column-gap:1.8rem}.md>.full{flex-basis:100%}.md>.blk{max-width:100%;overflow-x:auto}
.md p{margin:.5rem 0}.figs{display:flex;flex-wrap:wrap;align-items:flex-start;gap:1rem}
figure{margin:0;flex:0 1 auto;max-width:calc(50% - .5rem)}
figure img{max-width:100%;height:auto;border:1px solid #e3e6ec;background:#fff}
figcaption{font-size:.8rem;color:#556}.note{font-size:.85rem;color:#556}
.superseded td{color:#8a5a00}.state-failed{color:#b00020;font-weight:600}
.state-partial{color:#8a5a00}.flag{background:#fff3cd;border:1px solid #f0d78c;
border-radius:6px;padding:.6rem 1rem}details{margin:.4rem 0 1rem}summary{cursor:pointer}
pre{background:#f0f2f5;padding:.6rem;overflow-x:auto}
"""

# Sets data-images-ok on <body> once every image has loaded (the tests read it headless).
_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images", ok + "/" + imgs.length);
  document.body.setAttribute("data-images-ok", ok === imgs.length ? "true" : "false");
});
"""


def _anchor(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-").lower()


def _plot_rel(owner: str, name: str) -> str:
    return f"plots/{_anchor(owner)}/{name}"


def _figures(store: RunStore, studies: list[dict]) -> None:
    """Each study's figures, into report/plots/: the PNG/SVG files its evaluate cells drew
    (copied), and the report's own bar charts (retrieval, and studies that drew none)."""
    store.delete_tree("report/plots")
    for s in studies:
        s["figures"] = []
        ir = [c for c in s["cells"] if c["kind"] == "ir"]
        metric = next((m for c in ir for m in c["summary"]["metrics"]), None)
        png = plot_ir(ir, metric) if metric else None
        if png:
            rel = _plot_rel(s["name"], f"{_anchor(metric)}.png")
            store.write_bytes(f"report/{rel}", png)
            s["figures"].append((rel, f"{metric} per system (95% CI over queries)"))
        for c in s["cells"]:
            if c["kind"] != "study":
                continue
            for name in c["plots"]:
                if store.exists(f"{c['dir']}/{name}"):
                    base = name.rsplit("/", 1)[-1]
                    rel = _plot_rel(c["cell"], base)
                    store.write_bytes(f"report/{rel}", store.read_bytes(f"{c['dir']}/{name}"))
                    s["figures"].append((rel, base))
            if not c["plots"]:
                png = plot_study(c["rows"])
                if png:
                    rel = _plot_rel(c["cell"], "main_metric.png")
                    store.write_bytes(f"report/{rel}", png)
                    s["figures"].append((rel, "main metric per setting, language and model"))


def _stage_summary(rows: list[dict]) -> list[list[str]]:
    by: dict[str, dict] = {}
    for r in rows:
        d = by.setdefault(r["stage"], {"cells": 0, "done": 0, "partial": 0, "failed": 0,
                                       "pending": 0, "rows": 0, "errors": 0})
        d["cells"] += 1
        d[r["state"]] = d.get(r["state"], 0) + 1
        d["rows"] += r["rows"]
        d["errors"] += r["errors"]
    return [[st, *(str(d[k]) for k in ("cells", "done", "partial", "failed", "rows", "errors"))]
            for st, d in by.items()]


def write_report(store: RunStore, cfgs: "XlingConfig | list[XlingConfig] | None" = None,
                 registry: dict[str, type] | None = None, *,
                 current: set[str] | None = None) -> str:
    """Write report/index.html and report/summary.md; return the markdown.

    `cfgs` (the config, or a sweep's configs) goes into the provenance block and, with
    `registry` (the stage classes by name, `xling.pipeline.stage_registry()`), decides which
    cells are current; `current` (a set of `stage/cell` dirs) does so directly. Otherwise
    every cell is current."""
    if cfgs is not None and not isinstance(cfgs, list):
        cfgs = [cfgs]
    cfgs = cfgs or []
    unknown: set[str] = set()
    if current is None and cfgs and registry:
        current, unknown = config_cells(cfgs, registry)
    rows = [r for r in run_status(store) if r["stage"] != "report"]
    old = [r for r in rows if current is not None and r["stage"] not in unknown
           and f"{r['stage']}/{r['cell']}" not in current]
    old_ids = {id(r) for r in old}
    rows = [r for r in rows if id(r) not in old_ids]
    # cells the config asks for that are not in the run root at all (not started yet)
    missing = sorted(current - {f"{r['stage']}/{r['cell']}" for r in rows}) if current else []
    done = [r for r in rows if r["state"] == "done"]
    studies = collect_results(store, [r for r in done if r["stage"] == "evaluate"])
    pair_tables = ""
    if any(s["name"] == "retrieval" for s in studies) and store.exists("evaluate/tables.md"):
        pair_tables = store.read_bytes("evaluate/tables.md").decode()
    _figures(store, studies)
    prov = provenance_block(store, cfgs, done)
    runs = sorted(store.list_dirs("_runs"))
    plans = [r for r in runs if store.exists(f"_runs/{r}/plan.json")]
    info = {"plan": f"_runs/{plans[-1]}/plan.json" if plans else None,
            "written": now(), "done": len(done), "cells": len(rows),
            "rows": sum(r["rows"] for r in done), "errors": sum(r["errors"] for r in done),
            "old": len(old), "missing": missing,
            "configs": list(dict.fromkeys(c.name for c in cfgs))}
    text = _markdown(store, info, studies, pair_tables, rows, done, old, prov)
    page = _html(store, info, studies, pair_tables, rows, old, prov)
    store.write_bytes("report/index.html", page.encode())
    store.write_bytes("report/summary.md", text.encode())
    return text


def _markdown(store, info, studies, pair_tables, rows, done, old, prov) -> str:
    lines = ["# xling run report", "", f"run root: {store.url()}", f"written: {info['written']}",
             f"HTML report: {store.url('report/index.html')}",
             *([f"the last run's plan (cells, inputs, engines): {store.url(info['plan'])}"]
               if info["plan"] else []), "",
             f"{info['done']} of {info['cells']} cells done, {info['rows']} rows, "
             f"{info['errors']} error rows"
             + (f"; {info['old']} cells from superseded configs (not shown)." if old else ".")]
    if info["missing"]:
        lines += ["", f"{len(info['missing'])} cell(s) of the current config not started yet: "
                  + ", ".join(info["missing"][:20])
                  + (" ..." if len(info["missing"]) > 20 else "")]
    if studies:
        lines += ["", "## Results", ""]
    for s in studies:
        lines += [f"### {s['name']}", ""]
        if s["name"] == "retrieval" and pair_tables:
            lines += [pair_tables.rstrip(), ""]
        for c in s["cells"]:
            if c["table"]:
                lines += [c["table"].rstrip(), ""]
            if c["kind"] == "ir" and c["summary"]["means"]:
                head, body, notes = ir_summary_table(c["summary"])
                lines += [f"{c['label']}: means with 95% CI over queries; * p < 0.05 "
                          "(paired t-test)" + (": " + "; ".join(notes) if notes else ""), "",
                          _md_table(head, body), ""]
        for rel, caption in s["figures"]:
            lines.append(f"![{caption}]({rel})")
        if s["figures"]:
            lines.append("")
    if lines[-1]:
        lines.append("")
    lines += ["## Cells", "", "```", status_table(rows), "```", "", "## Where", ""]
    for r in done:
        lines.append(f"- {r['stage']} / {r['cell']}: "
                     f"{store.url(r['stage'] + '/' + r['cell'])}/part-*.parquet")
    if old:
        lines += ["", "## Superseded cells", "",
                  "Cells in the run root whose settings the current config no longer asks for "
                  "(an earlier config); their results are not in this report.", "", "```",
                  status_table(old), "```"]
    lines += ["", *_provenance_md(prov)]
    return "\n".join(lines) + "\n"


def _cells_html(rs: list[dict], cls: str = "") -> str:
    head = ["stage", "cell", "state", "shards", "rows", "errors", "note"]
    parts = ["<table>", "<thead><tr>" + "".join(f"<th>{h}</th>" for h in head)
             + "</tr></thead><tbody>"]
    for r in rs:
        vals = [html.escape(r["stage"]), html.escape(r["cell"]),
                f'<span class="state-{r["state"]}">{r["state"]}</span>',
                f"{r['shards_done']}/{r['n_shards']}", str(r["rows"]), str(r["errors"]),
                html.escape((r.get("message") or "")[:120])]
        parts.append((f'<tr class="{cls}">' if cls else "<tr>") + "".join(
            f'<td{" class=num" if k in (3, 4, 5) else ""}>{v}</td>'
            for k, v in enumerate(vals)) + "</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


def _html(store, info, studies, pair_tables, rows, old, prov) -> str:
    title = "xling report" + (f": {', '.join(info['configs'])}" if info["configs"] else "")
    body = [f"<header><h1>{html.escape(title)}</h1>",
            f"<p>run root: {html.escape(store.url())} · written {html.escape(info['written'])}"
            + (f' · <a href="../{html.escape(info["plan"])}">the last run\'s plan</a>'
               if info["plan"] else "") + "</p>",
            f"<p>{info['done']} of {info['cells']} cells done, {info['rows']} rows, "
            f"{info['errors']} error rows"
            + (f' · <a href="#superseded"><strong>{info["old"]} cells from superseded '
               "configs</strong></a>" if old else "") + "</p>",
            "<nav>" + "".join(f'<a href="#{_anchor(s["name"])}">{html.escape(s["name"])}</a>'
                              for s in studies)
            + '<a href="#cells">cells</a><a href="#provenance">provenance</a></nav></header>',
            "<main>"]
    if studies:
        body.append('<h2 id="results">Results</h2>')
    else:
        body.append('<p class="note">No finished evaluate cells of the current config yet: '
                    "no results to show.</p>")
    for s in studies:
        body.append(f'<section class="study" id="{_anchor(s["name"])}">'
                    f"<h2>{html.escape(s['name'])}</h2>")
        if s["name"] == "retrieval" and pair_tables:
            body.append('<h3>Language pairs (LLM-CLIR tables)</h3><div class="scroll">'
                        + markdown_to_html(pair_tables, demote=1) + "</div>")
        for c in s["cells"]:
            if c["kind"] == "ir":
                body.append(f"<h3>{html.escape(c['label'])}</h3>")
                if c["summary"]["means"]:
                    head, rows_, notes = ir_summary_table(c["summary"])
                    body.append('<p class="note">Means with 95% CI over queries, query counts; '
                                "* p &lt; 0.05, paired t-test"
                                + (": " + html.escape("; ".join(notes)) if notes else
                                   " (no significant difference)") + "</p>")
                    body.append('<div class="scroll">' + _html_table(head, rows_) + "</div>")
            if c["table"]:
                body.append('<div class="scroll">' + markdown_to_html(
                    c["table"], demote=2 if c["kind"] == "study" else 1) + "</div>")
            if c["kind"] == "study" and c["rows"]:
                shown = c["rows"][:2000]
                cols = [k for k in ("setting", "lang", "model", "metric", "value", "ci_low",
                                    "ci_high", "n") if k in shown[0]]
                body.append(f"<details><summary>All {len(c['rows'])} metric rows (value, 95% "
                            "CI, n)" + (", first 2000" if len(c["rows"]) > 2000 else "")
                            + '</summary><div class="scroll">' + _html_table(
                                cols, [[_fmt(r[k]) for k in cols] for r in shown])
                            + "</div></details>")
        if s["figures"]:
            body.append('<h3>Plots</h3><div class="figs">' + "".join(
                f'<figure><a href="{html.escape(rel)}"><img src="{html.escape(rel)}" '
                f'alt="{html.escape(cap)}"></a>'
                f"<figcaption>{html.escape(cap)}</figcaption></figure>"
                for rel, cap in s["figures"]) + "</div>")
        body.append("</section>")
    body.append('<h2 id="cells">Cells</h2>')
    body.append(_html_table(["stage", "cells", "done", "partial", "failed", "rows", "errors"],
                            _stage_summary(rows)))
    if info["missing"]:
        body.append(f'<p class="flag">{len(info["missing"])} cell(s) of the current config are '
                    "not in the run root yet: " + html.escape(", ".join(info["missing"][:50]))
                    + (" ..." if len(info["missing"]) > 50 else "") + "</p>")
    unfinished = any(r["state"] != "done" for r in rows)
    body.append(f"<details{' open' if unfinished else ''}><summary>Every cell "
                f"({len(rows)})</summary><div class=\"scroll\">{_cells_html(rows)}</div>"
                "</details>")
    if old:
        body.append('<h3 id="superseded">Cells from superseded configs</h3>'
                    f'<p class="flag">{len(old)} cell(s) in this run root were written for '
                    "settings the current config no longer asks for (an earlier version of the "
                    "config). They are kept, but their results are not in this report.</p>"
                    '<div class="scroll">' + _cells_html(old, "superseded") + "</div>")
    body.append(_provenance_html(prov))
    body.append("</main>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script>{_SCRIPT}</script></head>\n<body>\n" + "\n".join(body)
            + "\n</body></html>\n")
