"""Topics, qrels and hub datasets by name (`irds:`, `pyserini:`, `hf:`), offline.

Each library reads its own cache, which the test fills beforehand with files from
tests/data or files it writes in the published layout: ir_datasets' IR_DATASETS_HOME,
Anserini's ~/.cache/pyserini/topics-and-qrels (under the JVM's user.home) and the
Hugging Face hub cache (HF_HUB_OFFLINE=1). Nothing is mocked: `xling validate` runs in a
subprocess, so each library starts with the test's environment.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from xling.tasks.topics import iter_neuclir_topics, iter_qrels, iter_tsv_topics

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_named_data")

DATA = Path(__file__).resolve().parents[1] / "data"
SHA = "0123456789abcdef0123456789abcdef01234567"

# NeuCLIR 2022's topic layout (https://trec.nist.gov/data/neuclir/2022/topics.0720.utf8.jsonl):
# the English original and, per language, a human and a machine translation.
NEUCLIR = [
    {"topic_id": "101", "fa": ("انتخابات شورای شهر", "نتایج انتخابات شورای شهر تهران"),
     "ru": ("выборы в городской совет", "результаты выборов")},
    {"topic_id": "102", "fa": ("قیمت نفت", "تاثیر تحریم ها بر قیمت نفت"),
     "ru": ("цены на нефть", "влияние санкций")},
    {"topic_id": "103", "fa": ("گردشگری فضایی", "پرواز گردشگران به فضا"),
     "ru": ("космический туризм", "полёты туристов в космос")},
]
ENGLISH = {"101": ("city council election", "Results of the Tehran city council election"),
           "102": ("oil prices", "Effect of sanctions on oil prices"),
           "103": ("space tourism", "Tourist flights to space")}
ISO3 = {"fa": "fas", "ru": "rus"}


def neuclir_topics_jsonl() -> str:
    lines = []
    for t in NEUCLIR:
        qid = t["topic_id"]
        topics = [{"lang": "eng", "source": "original", "topic_title": ENGLISH[qid][0],
                   "topic_description": ENGLISH[qid][1], "topic_narrative": "n"}]
        for lang in ("fa", "ru"):
            if lang in t:
                title, desc = t[lang]
                topics.append({"lang": ISO3[lang], "source": "human translation",
                               "topic_title": title, "topic_description": desc,
                               "topic_narrative": "n"})
                topics.append({"lang": ISO3[lang], "source": "machine translation",
                               "topic_title": f"MT {title}", "topic_description": f"MT {desc}",
                               "topic_narrative": "n"})
        lines.append(json.dumps({"topic_id": qid, "topics": topics,
                                 "narratives": {}, "languages_with_qrels": ["fas", "rus"]},
                                ensure_ascii=False))
    return "\n".join(lines) + "\n"


# 2022-qrels.all: the iteration column is the document language.
NEUCLIR_QRELS = ("101 fas fa-doc-1 3\n101 fas fa-doc-2 0\n102 fas fa-doc-3 1\n"
                 "101 rus ru-doc-1 3\n103 rus ru-doc-2 1\n")


def _run_validate(tmp_path: Path, config: str, env: dict) -> subprocess.CompletedProcess:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(textwrap.dedent(config))
    return subprocess.run([sys.executable, "-m", "xling.cli", "validate", "-c", str(cfg)],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=300)


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """Library caches filled as each library lays them out, and the env that points at them."""
    root = tmp_path_factory.mktemp("caches")
    irds = root / "ir_datasets"
    (irds / "neuclir" / "trec-2022").mkdir(parents=True)
    (irds / "neuclir" / "trec-2022" / "topics.jsonl").write_text(neuclir_topics_jsonl(),
                                                                 encoding="utf-8")
    (irds / "neuclir" / "trec-2022" / "qrels").write_text(NEUCLIR_QRELS)
    (irds / "miracl" / "v1.0" / "fi" / "dev").mkdir(parents=True)
    shutil.copy(DATA / "topics" / "topics.miracl-v1.0-fi-dev.tsv",
                irds / "miracl" / "v1.0" / "fi" / "dev" / "topics.tsv")
    shutil.copy(DATA / "qrels" / "qrels.miracl-v1.0-fi-dev.tsv",
                irds / "miracl" / "v1.0" / "fi" / "dev" / "qrels.tsv")
    home = root / "home"
    anserini = home / ".cache" / "pyserini" / "topics-and-qrels"
    anserini.mkdir(parents=True)
    shutil.copy(DATA / "topics" / "topics.ciral-v1.0-ha-test-a.tsv", anserini)
    shutil.copy(DATA / "qrels" / "qrels.ciral-v1.0-ha-test-a.tsv", anserini)
    hub = root / "hf"
    repo = hub / "datasets--AmazonScience--XRAG"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SHA)
    (repo / "snapshots" / SHA).mkdir(parents=True)
    shutil.copy(DATA / "xrag" / "xrag.test.jsonl", repo / "snapshots" / SHA)
    (repo / "snapshots" / SHA / "README.md").write_text("XRAG\n")
    docs = root / "docs-fa.jsonl"
    docs.write_text('{"id": "fa-doc-1", "title": "t", "text": "x"}\n')
    env = {"IR_DATASETS_HOME": str(irds), "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1",
           "JAVA_TOOL_OPTIONS": f"-Duser.home={home}", "HOME": str(home)}
    return {"root": root, "env": env, "hub": hub, "docs": docs}


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_neuclir_topic_jsonl_reader_follows_ir_datasets_field_names():
    raw = neuclir_topics_jsonl().encode()
    rows = list(iter_neuclir_topics(io.BytesIO(raw), lang="fa"))  # default: ht_title
    by = {r["query_id"]: r for r in rows}
    assert by["101"]["text"] == "انتخابات شورای شهر" and by["101"]["error"] is None
    assert by["101"]["desc"] == "نتایج انتخابات شورای شهر تهران"
    no_fa = json.dumps({"topic_id": "104", "topics": [
        {"lang": "eng", "source": "original", "topic_title": "x", "topic_description": "y"}]})
    row, = iter_neuclir_topics(io.BytesIO(no_fa.encode()), lang="fa")
    assert row["text"] is None and "no ht version in fas" in row["error"]
    mt = {r["query_id"]: r["text"] for r in iter_neuclir_topics(
        io.BytesIO(raw), lang="ru", fields=("mt_title", "mt_description"))}
    assert mt["103"] == "MT космический туризм MT полёты туристов в космос"
    en = {r["query_id"]: r["text"] for r in iter_neuclir_topics(io.BytesIO(raw), lang="en")}
    assert en == {q: t for q, (t, _) in ENGLISH.items()}
    with pytest.raises(ValueError, match="English original"):
        list(iter_neuclir_topics(io.BytesIO(raw), lang="fa", fields=("title",)))
    bad = list(iter_neuclir_topics(io.BytesIO(b'{"topic_id": 1}\nnot json\n'), lang="fa"))
    assert [r["error"] is not None for r in bad] == [True, True]


def test_irds_and_pyserini_names_become_run_store_files(tmp_path, caches):
    run_root = tmp_path / "run"
    config = f"""
    name: named
    run_root: {run_root}
    index:
      engines: [bm25]
      collections:
        - {{name: nc, format: neuclir, path: "{caches['docs'].parent}/docs-{{lang}}.jsonl",
           langs: [fa]}}
        - {{name: mir, format: neuclir, path: "{caches['docs'].parent}/docs-fa.jsonl",
           langs: [fi, ha]}}
    retrieve:
      topics:
        - {{name: neuclir-ht, path: "irds:neuclir/1/{{lang}}/trec-2022", fields: [ht_title],
           langs: [fa], doc_langs: [fa], qrels: "irds:neuclir/1/{{doc_lang}}/trec-2022"}}
        - {{name: miracl, path: "irds:miracl/{{lang}}/dev", langs: [fi], doc_langs: [fi],
           qrels: "irds:miracl/{{lang}}/dev"}}
        - {{name: ciral, path: "pyserini:ciral-v1.0-{{doc_lang}}-test-a", langs: [en],
           doc_langs: [ha], qrels: "pyserini:ciral-v1.0-{{doc_lang}}-test-a"}}
      runs:
        - {{name: bm25-nc, engine: bm25, collection: nc, mode: og, topics: [neuclir-ht]}}
    """
    p = _run_validate(tmp_path, config, caches["env"])
    assert p.returncode == 0, p.stderr[-3000:]
    data = run_root / "_data"

    # ir_datasets keeps only the topics with fa judgments (101, 102), as its ht_title.
    nc = _read(data / "topics/irds/neuclir/1/fa/trec-2022/ht_title.tsv")
    assert nc == "101\tانتخابات شورای شهر\n102\tقیمت نفت\n"
    assert _read(data / "qrels/irds/neuclir/1/fa/trec-2022/qrels.txt") == (
        "101 Q0 fa-doc-1 3\n101 Q0 fa-doc-2 0\n102 Q0 fa-doc-3 1\n")
    # xling's own reader of the same JSONL agrees with ir_datasets on those topics.
    ours = {r["query_id"]: r["text"] for r in iter_neuclir_topics(
        io.BytesIO(neuclir_topics_jsonl().encode()), lang="fa", fields=("ht_title",))}
    assert {q: t for q, t in (line.split("\t") for line in nc.splitlines())} == {
        q: ours[q] for q in ("101", "102")}

    # Real MIRACL fi dev and CIRAL ha test-a files come back as they went in.
    for got, shipped in [
            (data / "topics/irds/miracl/fi/dev/default.tsv", "topics/topics.miracl-v1.0-fi-dev.tsv"),
            (data / "topics/pyserini/ciral-v1.0-ha-test-a/default.tsv",
             "topics/topics.ciral-v1.0-ha-test-a.tsv")]:
        want = [(r["query_id"], r["text"]) for r in iter_tsv_topics(
            io.BytesIO((DATA / shipped).read_bytes()), lang="x")]
        have = [(r["query_id"], r["text"]) for r in iter_tsv_topics(
            io.BytesIO(got.read_bytes()), lang="x")]
        assert sorted(have) == sorted(want) and len(want) > 50
    for got, shipped in [(data / "qrels/irds/miracl/fi/dev/qrels.txt",
                          "qrels/qrels.miracl-v1.0-fi-dev.tsv"),
                         (data / "qrels/pyserini/ciral-v1.0-ha-test-a/qrels.txt",
                          "qrels/qrels.ciral-v1.0-ha-test-a.tsv")]:
        assert list(iter_qrels(io.BytesIO(got.read_bytes()))) == list(
            iter_qrels(io.BytesIO((DATA / shipped).read_bytes())))

    # The validated config points at the store's files, so every stage reads plain TSV.
    resolved = yaml.safe_load(p.stdout.split("\n[")[0])  # the config, before the cell lines
    nc_spec, _, ciral_spec = resolved["retrieve"]["topics"]
    assert nc_spec["path"] == f"{data}/topics/irds/neuclir/1/{{lang}}/trec-2022/ht_title.tsv"
    assert ciral_spec["qrels"] == f"{data}/qrels/pyserini/ciral-v1.0-{{doc_lang}}-test-a/qrels.txt"
    assert nc_spec["format"] == "tsv"


def test_named_data_errors_name_the_fix(tmp_path, caches):
    base = f"""
    name: bad
    run_root: {tmp_path / 'run'}
    translate:
      model: tiny:nllb_ct2
      topics:
        - {{name: t, path: "PATH", langs: [fa], targets: [en] FIELDS}}
    """
    cases = [
        ("irds:neuclir/1/fa/trec-2023x", "", "is not an ir_datasets id (https://ir-datasets.com); "
         "close: neuclir/1/fa/trec-2023"),
        ("irds:neuclir/1/fa/trec-2022", ", fields: [ht_titel]",
         "['ht_titel'] are not fields of irds:neuclir/1/fa/trec-2022's queries"),
        ("irds:neuclir/1/zh/trec-2022", "", "IR_DATASETS_HOME"),  # not in the cache, offline
        ("pyserini:ciral-v1.0-ha-tst-a", "", "close: ciral-v1.0-ha-test-a"),
        ("pyserini:ciral-v1.0-so-test-a", "", "~/.cache/pyserini/topics-and-qrels"),
    ]
    for path, fields, message in cases:
        p = _run_validate(tmp_path, base.replace("PATH", path).replace(" FIELDS", fields),
                          caches["env"])
        assert p.returncode == 2, (path, p.stdout[-500:], p.stderr[-2000:])
        assert message in p.stderr, (path, p.stderr[-2000:])
        assert "Traceback" not in p.stderr


def test_hub_dataset_is_fetched_once_into_the_run_store(tmp_path, caches):
    run_root = tmp_path / "run"
    config = f"""
    name: hub
    run_root: {run_root}
    translate:
      model: tiny:nllb_ct2
      documents:
        - {{name: xrag, format: xrag, path: "hf:AmazonScience/XRAG/xrag.test.jsonl",
           langs: [de], targets: [en]}}
    study:
      task: xrag
      options:
        data: hf:AmazonScience/XRAG/xrag.test.jsonl
        langs: [de]
    """
    hub = tmp_path / "hf"
    shutil.copytree(caches["hub"], hub)
    env = {**caches["env"], "HF_HUB_CACHE": str(hub)}
    p = _run_validate(tmp_path, config, env)
    assert p.returncode == 0, p.stderr[-3000:]
    stored = run_root / "_data/hf/AmazonScience/XRAG/main"
    marker = json.loads(_read(stored / "_FETCHED.json"))
    assert marker["revision"] == SHA and marker["files"] == ["xrag.test.jsonl"]
    assert (stored / "xrag.test.jsonl").read_bytes() == (DATA / "xrag/xrag.test.jsonl").read_bytes()
    assert not (stored / "README.md").exists()  # only the named file was fetched
    resolved = yaml.safe_load(p.stdout.split("\n[")[0])
    assert resolved["study"]["options"]["data"] == f"{stored}/xrag.test.jsonl"
    # the corpus, for the workers
    assert resolved["translate"]["documents"][0]["path"] == f"{stored}/xrag.test.jsonl"

    # Fetched once: without the hub cache, the run store's copy serves the next run.
    shutil.rmtree(hub)
    p = _run_validate(tmp_path, config, env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert yaml.safe_load(p.stdout.split("\n[")[0])["study"]["options"]["data"] == \
        f"{stored}/xrag.test.jsonl"

    # A dataset that is neither in the store nor in the cache: one line with the fix.
    p = _run_validate(tmp_path, config.replace("AmazonScience/XRAG", "nobody/none"), env)
    assert p.returncode == 2 and "cannot fetch hf:nobody/none" in p.stderr
    assert "hf download nobody/none --repo-type dataset" in p.stderr


def test_neuclir_topic_files_read_through_the_topic_source(tmp_path):
    """`format: neuclir` in a topic spec: the same reader the stages' Ray read tasks call."""
    import pyarrow as pa

    from xling.core.sources import QUERIES, TopicSpec, _read_topic_files

    path = tmp_path / "topics.0720.utf8.jsonl"
    path.write_text(neuclir_topics_jsonl(), encoding="utf-8")
    spec = TopicSpec(name="nc", langs=["ru"], format="neuclir", path=str(path),
                     fields=["mt_title"])
    blocks = list(_read_topic_files(pa.table({"path": [str(path)]}), spec=spec.model_dump(),
                                    lang="ru"))
    rows = pa.concat_tables(blocks).to_pylist()
    assert blocks[0].schema == QUERIES
    assert [(r["query_id"], r["text"], r["source"]) for r in rows] == [
        ("101", "MT выборы в городской совет", "nc"), ("102", "MT цены на нефть", "nc"),
        ("103", "MT космический туризм", "nc")]
    assert TopicSpec(**spec.model_dump()).fields == ["mt_title"]  # a dumped config reloads
    with pytest.raises(ValueError, match="not neuclir topic fields"):
        TopicSpec(name="nc", langs=["ru"], format="neuclir", path=str(path), fields=["desc"])
