"""`index.dense.embedder`: a config names its bi-encoder by registry key (actors/embedder.py's
EMBEDDERS); index and retrieve load it through the same engine spec, unchanged otherwise."""

import textwrap

import pytest

from xling.config import load_config
from xling.core.config import ConfigError

CONFIG = """
name: t
index:
  collections: [{name: c, path: {root}/x.jsonl, langs: [fi]}]
  engines: [dense]
  dense: {model: intfloat/multilingual-e5-large}
retrieve:
  topics: [{name: q, path: {root}/q.tsv, langs: [en], doc_langs: [fi]}]
  runs: [{name: d, engine: dense, collection: c}]
"""


def _load(tmp_path, *overrides):
    (tmp_path / "x.jsonl").write_text('{"id": "d1", "contents": "Helsinki"}\n')
    (tmp_path / "q.tsv").write_text("1\tWhere is Helsinki?\n")
    p = tmp_path / "cfg.yaml"
    p.write_text(textwrap.dedent(CONFIG).replace("{root}", str(tmp_path)))
    return load_config(p, list(overrides))


def test_the_embedder_is_named_by_its_registry_key(tmp_path):
    from xling.jobs.index import IndexStage
    from xling.jobs.retrieve import RetrieveStage

    default = _load(tmp_path)
    e5 = _load(tmp_path, "index.dense.embedder=e5")
    [spec] = IndexStage().engines(e5)
    assert spec.load["kind"] == "e5" and spec.load["model"] == "intfloat/multilingual-e5-large"
    from xling.core.hosts import host_key

    # one engine: index and retrieve share it (the same host key)
    assert [host_key(s) for s in RetrieveStage().engines(e5)] == [host_key(spec)]
    assert IndexStage().engines(default)[0].load["kind"] == "bge-m3"
    # Unset, the index cells keep the ids they had before the key existed; set, they change.
    ids = {name: [c.id for c in IndexStage().cells(cfg)] for name, cfg in
           (("default", default), ("e5", e5),
            ("m3", _load(tmp_path, "index.dense.embedder=bge-m3")))}
    assert ids["default"] != ids["e5"] and ids["default"] != ids["m3"]


def test_unknown_embedder_and_missing_outputs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError,
                       match="unknown embedder 'gte'.*bge-m3, e5, repllama, mgte, nv-embed"):
        _load(tmp_path, "index.dense.embedder=gte")
    with pytest.raises(ConfigError, match="embedder repllama has no colbert output"):
        _load(tmp_path, "index.dense.embedder=repllama", "index.dense.colbert=true")
    assert _load(tmp_path, "index.dense.sparse=true").index.dense.kind == "bge-m3"
