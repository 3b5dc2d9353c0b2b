"""LLM-CLIR's cross combinations (Figure 1; Tables 2-7 rows "(OG)" / "(DT)"): a rerank run
chooses its passage texts independently of the first stage. BM25 over the DT index is
reranked on the original (Finnish) passages, dense hits over the originals on the DT
(English) texts. The first-stage hits and the DT translations are written into the store
as committed cells, so only the rerank stage's read runs (one local Ray), and the scripted
judge of tests/helpers.py reranks what was read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pytest

from helpers import ScriptedJudge
from xling.core.store import RunStore
from xling.tasks.rerank import Candidates, listwise_rerank

ROOT = Path(__file__).resolve().parents[2]
FI = ROOT / "data/demo/mrtydi/fi.jsonl.gz"

CONFIG = """
name: cross
run_root: {root}
translate:
  model: tiny:nllb_ct2
  documents:
    - {{name: mrtydi, format: mrtydi, path: '{demo}/mrtydi/{{lang}}.jsonl.gz', langs: [fi], targets: [en]}}
index:
  engines: [bm25, dense]
  collections:
    - {{name: mrtydi, format: mrtydi, path: '{demo}/mrtydi/{{lang}}.jsonl.gz', langs: [fi], translated: [en]}}
retrieve:
  topics:
    - {{name: t, path: '{tmp}/topics.tsv', langs: [en], doc_langs: [fi]}}
  runs:
    - {{name: bm25-dt, engine: bm25, collection: mrtydi, mode: dt}}
    - {{name: m3-og, engine: dense, collection: mrtydi, mode: og}}
rerank:
  model: {{model: m, backend: openai, base_url: 'http://127.0.0.1:9', api_key_env: null}}
  runs:
    - {{name: bm25-dt-og, input: bm25-dt, method: listwise, texts: og}}
    - {{name: m3-dt, input: m3-og, method: listwise, texts: dt}}
    - {{name: bm25-dt-index, input: bm25-dt, method: listwise}}
"""


def commit(store: RunStore, cell_dir: str, rows: list[dict]) -> None:
    store.write_parquet(f"{cell_dir}/part-00000.parquet", pa.Table.from_pylist(rows))
    store.write_json(f"{cell_dir}/_manifest.json", {"files": ["part-00000.parquet"]})


def test_rerank_texts_og_and_dt_cross_the_first_stage(tmp_path, ray_local):
    from xling.config import load_config
    from xling.jobs.rerank import RerankStage, rerank_cells
    from xling.jobs.retrieve import run_cells
    from xling.core.upstream import translation as translate_cell

    (tmp_path / "topics.tsv").write_text("q1\tcapital of the Netherlands\n")
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(CONFIG.format(root=tmp_path / "run", demo=ROOT / "data/demo", tmp=tmp_path))
    cfg = load_config(cfg_file)
    store = RunStore(cfg.run_root)
    docs = [json.loads(line) for line in gzip.open(FI, "rt")]
    ids = [d["docid"] for d in docs]
    english = {d["docid"]: f"passage about {d['docid']} in English" for d in docs}
    dt = translate_cell(cfg, "doc", "mrtydi", "fi", "en")
    commit(store, dt.dir, [{"id": i, "src_lang": "fi", "tgt_lang": "en", "title": None,
                            "text": english[i], "error": None} for i in ids])
    for c in run_cells(cfg):  # the same hits for both first stages, last doc first
        commit(store, c.dir, [{"query_id": "q1", "doc_id": d, "rank": k + 1,
                               "score": float(len(ids) - k), "error": None}
                              for k, d in enumerate(reversed(ids))])
    cells = {c.key["run"]: c for c in rerank_cells(cfg)}
    assert dt.dir in cells["m3-dt"].inputs and dt.dir not in cells["bm25-dt-og"].inputs
    read = {name: RerankStage().read(c, cfg).take_all()[0] for name, c in cells.items()}
    original = {d["docid"]: f"{d['title']}\n{d['text']}" for d in docs}
    for name, want in (("bm25-dt-og", original), ("m3-dt", english), ("bm25-dt-index", english)):
        row = read[name]
        assert row["doc_ids"] == list(reversed(ids)) and row["missing"] == 0, name
        assert row["texts"] == [want[d] for d in row["doc_ids"]], name
    assert "Alankomaiden" in read["bm25-dt-og"]["texts"][-1]  # Finnish, not the DT index's
    # Rerank what was read: the judge finds doc ids only in the texts it is shown.
    qrels = {"q1": {ids[0]: 1}}
    for name in ("bm25-dt-og", "m3-dt"):
        row = read[name]
        shown = [f"passage about {d}" if name == "bm25-dt-og" else t.removesuffix(" in English")
                 for d, t in zip(row["doc_ids"], row["texts"])]
        out = listwise_rerank([Candidates("q1", "query q1", row["doc_ids"], shown)],
                              ScriptedJudge(qrels))[0]
        assert out.doc_ids[0] == ids[0]
    with pytest.raises(Exception, match="texts: dt reads the translate stage"):
        bad = cfg_file.read_text().replace("targets: [en]", "targets: [de]").replace(
            "translated: [en]", "translated: []").replace("{name: bm25-dt, engine: bm25, "
            "collection: mrtydi, mode: dt}", "{name: bm25-dt, engine: bm25, collection: mrtydi, "
            "mode: og}").replace("langs: [fi], translated: []", "langs: [fi]")
        cfg_file.write_text(bad)
        rerank_cells(load_config(cfg_file))


def test_a_trec_first_stage_reranked_on_the_dt_texts(tmp_path, ray_local):
    """A first stage made elsewhere (NV-Embed-v2's TREC runs in LLM-CLIR) reranked on the
    translate stage's DT texts: its doc ids are looked up in the translated collection (the
    translate.documents entry of the corpus's name, or `translations:`); an id without a
    translation is a counted missing text; without the translations, a config error."""
    from xling.config import load_config
    from xling.core.config import ConfigError
    from xling.jobs.rerank import RerankStage, rerank_cells
    from xling.core.upstream import translation as translate_cell

    (tmp_path / "topics.tsv").write_text("q1\tcapital of the Netherlands\n")
    docs = [json.loads(line) for line in gzip.open(FI, "rt")]
    ids = [d["docid"] for d in docs]
    (tmp_path / "run.trec").write_text("".join(f"q1 Q0 {d} {k + 1} {100 - k} nv-embed-v2\n"
                                               for k, d in enumerate(ids + ["not-translated"])))
    trec_run = (f"{{name: nv-dt, trec: '{tmp_path}/run.trec', method: listwise, texts: dt, "
                f"topics: {{name: t, path: '{tmp_path}/topics.tsv', langs: [en]}}, "
                f"corpus: {{name: mrtydi, format: mrtydi, "
                f"path: '{ROOT}/data/demo/mrtydi/{{lang}}.jsonl.gz', langs: [fi]}}}}")
    text = CONFIG.format(root=tmp_path / "run", demo=ROOT / "data/demo", tmp=tmp_path)
    text = text.split("index:")[0] + (
        "rerank:\n  model: {model: m, backend: openai, base_url: 'http://127.0.0.1:9', "
        f"api_key_env: null}}\n  runs:\n    - {trec_run}\n")
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(text)
    cfg = load_config(cfg_file)
    store = RunStore(cfg.run_root)
    english = {d: f"passage about {d} in English" for d in ids}
    dt = translate_cell(cfg, "doc", "mrtydi", "fi", "en")
    commit(store, dt.dir, [{"id": i, "src_lang": "fi", "tgt_lang": "en", "title": None,
                            "text": english[i], "error": None} for i in ids])
    [cell] = rerank_cells(cfg)
    assert dt.dir in cell.inputs
    row = RerankStage().read(cell, cfg).take_all()[0]
    assert row["doc_ids"] == ids + ["not-translated"] and row["missing"] == 1
    assert row["texts"] == [english[d] for d in ids] + [""]
    # The translations are named by the corpus's name; another name, or none: config errors.
    renamed = text.replace("corpus: {name: mrtydi", "corpus: {name: nv-corpus")
    cfg_file.write_text(renamed)
    with pytest.raises(ConfigError, match="add translate.documents entry 'nv-corpus'"):
        rerank_cells(load_config(cfg_file))
    cfg_file.write_text(renamed.replace("texts: dt,", "texts: dt, translations: mrtydi,"))
    [cell] = rerank_cells(load_config(cfg_file))
    assert dt.dir in cell.inputs
    cfg_file.write_text(text.replace("targets: [en]", "targets: [de]"))
    with pytest.raises(ConfigError, match=r"translation of 'mrtydi' fi->en, which the config "
                                          r"does not make"):
        rerank_cells(load_config(cfg_file))
