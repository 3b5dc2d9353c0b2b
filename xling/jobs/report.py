"""`report` stage and `xling status`: what is under a run root, and in what state.

`report` writes `{run_root}/report/summary.md` (a table of every cell with its rows, errors
and location) and prints it; `xling status` prints the same table straight from the
manifests and shard markers, so it also works on a run that is still going or was killed.
"""

from __future__ import annotations

from xling.core.runner import now, run_status
from xling.core.store import RunStore


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


def write_report(store: RunStore) -> str:
    rows = [r for r in run_status(store) if r["stage"] != "report"]
    done = [r for r in rows if r["state"] == "done"]
    lines = ["# xling run report", "", f"run root: {store.url()}", f"written: {now()}", "",
             f"{len(done)} of {len(rows)} cells done, "
             f"{sum(r['rows'] for r in done)} rows, {sum(r['errors'] for r in done)} error rows.",
             "", "```", status_table(rows), "```", "", "## Where", ""]
    for r in done:
        lines.append(f"- {r['stage']} / {r['cell']}: {store.url(r['stage'] + '/' + r['cell'])}/part-*.parquet")
    tables = [r for r in done if r["stage"] == "evaluate"]
    if tables:
        lines += ["", "## Results", ""]
    for r in tables:  # the evaluate stage's tables: the papers' tables for studies
        rel = f"evaluate/{r['cell']}/table.md"
        if store.exists(rel):
            lines += [store.read_bytes(rel).decode().rstrip(), ""]
    text = "\n".join(lines) + "\n"
    store.write_bytes("report/summary.md", text.encode())
    return text
