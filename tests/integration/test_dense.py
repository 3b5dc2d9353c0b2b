"""BGE-M3 embeddings (actors/embedder.py), exact sharded dense/hybrid search (dense_search.py).

Texts: a few dozen sentences in several languages written here (always), and the real Mr.TyDi
sample passages of ../shared (every passage, plus the first sentence of each long one as a
document of its own) when present. They are embedded once with the tiny BGE-M3 (dense, sparse
and ColBERT) through `M3Embedder` (the `Embedder` that `make_embedder` builds), then:

- the embedder's columns are BGEM3FlagModel.encode()'s outputs, in Arrow form;
- dense: the embeddings split into 1, 3 and 7 uneven shards, each searched with FAISS and the
  per-shard lists merged, give exactly the flat search over all of them (ids in order, scores),
  for k = 5, k larger than any shard and k larger than the collection; also with duplicate
  vectors under other ids placed so that tied scores straddle the k boundary, within a shard
  and across shards, and on integer vectors where most scores tie;
- hybrid (weights 1 / 0.3 / 1): sharded top-k == single top-k, and one pair's score is what
  BGEM3FlagModel.compute_score / compute_lexical_matching_score / colbert_score give;
- empty, whitespace and null texts become error rows with null vectors; the other rows are
  unaffected; an input error is kept.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from xling.actors.dense_search import (colbert_score, hybrid_scores, hybrid_topk,  # noqa: E402
                                       lexical_score, merge_topk, rank_topk, search_shard)

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_dense")

ROOT = Path(__file__).resolve().parents[2]
SHARED_DOCS = ROOT.parent / "shared" / "data" / "ir" / "sample-docs" / "mrtydi-1.1"
WEIGHTS = {"dense": 1.0, "sparse": 0.3, "colbert": 1.0}  # BordIRLines' BGE-M3 hybrid
SHARDINGS = (1, 3, 7)

BUILTIN_DOCS = [
    "The river flows through the old city and into the northern sea.",
    "Amsterdam is the capital of the Netherlands, famous for its canals.",
    "The train to Berlin leaves from platform seven every hour.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "Astronomers study stars, planets and galaxies with large telescopes.",
    "Anarchism is a political philosophy sceptical of authority.",
    "The Bengali language is spoken by more than two hundred million people.",
    "Jimmy Carter was the thirty-ninth president of the United States.",
    "Der Fluss fließt durch die Altstadt und mündet in die Nordsee.",
    "Der Zug nach Berlin fährt jede Stunde von Gleis sieben ab.",
    "Wasser kocht auf Meereshöhe bei hundert Grad Celsius.",
    "Amsterdam on Alankomaiden pääkaupunki ja sen suurin kaupunki.",
    "Juna Helsinkiin lähtee asemalta joka tunti.",
    "Tähtitiede tutkii tähtiä, planeettoja ja galakseja.",
    "Le fleuve traverse la vieille ville avant de rejoindre la mer.",
    "Le train pour Paris part du quai numéro sept.",
    "El agua hierve a cien grados en el nivel del mar.",
    "Los astrónomos observan las estrellas con telescopios.",
    "Река течёт через старый город и впадает в море.",
    "Литва — государство в Северной Европе на берегу Балтийского моря.",
    "Поезд в Москву отправляется каждый час.",
    "水は海面で摂氏百度で沸騰する。",
    "アンパサンドは「and」を表す記号である。",
    "東京行きの電車は毎時間出発します。",
    "水在海平面一百摄氏度时沸腾。",
    "天文学家用望远镜研究恒星和星系。",
    "الماء مركب كيميائي يتكون من الهيدروجين والأكسجين.",
    "يغادر القطار إلى القاهرة كل ساعة.",
    "Maji huchemka kwa nyuzi joto mia moja.",
    "Akiolojia ni elimu ya mabaki ya kale ya binadamu.",
    "Treni ya kwenda Nairobi huondoka kila saa.",
    "지미 카터는 미국의 제39대 대통령이었다.",
    "기차는 매시간 서울역에서 출발합니다.",
    "ดาราศาสตร์เป็นวิชาที่ศึกษาดวงดาวและกาแล็กซี",
    "గుంటూరు జిల్లా ఆంధ్రప్రదేశ్ రాష్ట్రంలో ఉంది.",
    "Asam deoksiribonukleat menyimpan informasi genetik.",
]
BUILTIN_QUERIES = [
    "Where does the river go?", "train every hour", "Wann fährt der Zug?", "boiling water",
    "capital of the Netherlands", "telescopes and galaxies", "президент США", "水の沸点",
    "ماء", "akiolojia", "대통령", "DNA genetic information",
]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?。！？।])\s*", text) if s.strip()]


def _mrtydi() -> tuple[list[str], list[str], list[str]]:
    """Passages (+ the first sentence of each long one) and queries (titles, sentence starts)."""
    ids, texts, queries = [], [], []
    for path in sorted(SHARED_DOCS.glob("*/corpus.jsonl.gz")):
        lang = path.parent.name
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            passages = [json.loads(line) for line in fh]
        for p in passages:
            ids.append(f"{lang}:{p['docid']}")
            texts.append(p["text"])
            sents = _sentences(p["text"])
            if len(p["text"]) > 400 and len(sents) > 1:
                ids.append(f"{lang}:{p['docid']}.s0")
                texts.append(sents[0])
        queries += sorted({p["title"] for p in passages})
        queries.append(" ".join(_sentences(passages[1]["text"])[-1].split()[:6]))
    return ids, texts, queries


def _table(ids: list[str], texts: list[str | None], **extra) -> pa.Table:
    return pa.table({"doc_id": pa.array(ids, pa.string()), "text": pa.array(texts, pa.string()),
                     **extra})


def _arrays(t: pa.Table) -> dict:
    """Embedding table (error-free rows) -> numpy arrays, as a retriever would load a shard."""
    dim = t.schema.field("dense").type.list_size
    return {
        "ids": t["doc_id"].to_pylist(),
        "dense": t["dense"].combine_chunks().flatten().to_numpy().reshape(-1, dim),
        "sparse": [dict(zip(a, w)) for a, w in zip(t["sparse_ids"].to_pylist(),
                                                   t["sparse_weights"].to_pylist())],
        "colbert": [np.asarray(v, np.float32).reshape(n, -1)
                    for v, n in zip(t["colbert"].to_pylist(), t["colbert_len"].to_pylist())],
    }


def _cuts(n: int, shards: int, seed: int) -> list[tuple[int, int]]:
    """`shards` non-empty, uneven [start, end) ranges covering 0..n."""
    rng = np.random.default_rng(seed)
    inner = np.sort(rng.choice(np.arange(1, n), size=shards - 1, replace=False))
    bounds = [0, *inner.tolist(), n]
    return list(zip(bounds, bounds[1:]))


def _exact(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """exact[j, r] = x[j] . q[r] in float64, each row reduced on its own, as the product's
    re-score does. A BLAS GEMM (`x @ q.T`) is not a reference for ties: its kernels may
    round identical rows differently by position (seen: the last row of a matrix)."""
    x64, q64 = np.asarray(x, dtype=np.float64), np.asarray(q, dtype=np.float64).reshape(-1, x.shape[1])
    return np.array([[math.fsum(row * qr) for qr in q64] for row in x64])


def _reference(scores: np.ndarray, ids: list[str], k: int) -> list[str]:
    """The ranking rule spelled out: score descending, then doc id ascending."""
    return [ids[j] for j in sorted(range(len(ids)), key=lambda j: (-scores[j], ids[j]))[:k]]


def corpus_schema(embedder) -> pa.Schema:
    return pa.schema([("doc_id", pa.string()), ("text", pa.string()),
                      ("dense", pa.list_(pa.float32(), embedder.info["dim"])),
                      ("sparse_ids", pa.list_(pa.int32())),
                      ("sparse_weights", pa.list_(pa.float32())),
                      ("colbert", pa.list_(pa.float32())), ("colbert_len", pa.int32()),
                      ("error", pa.string())])


def _sharded_search(q, ids, dense, k, shards, seed=0):
    parts = [search_shard(q, ids[a:b], dense[a:b], k) for a, b in _cuts(len(ids), shards, seed)]
    return merge_topk(parts, k)


# ------------------------------------------------------------------------------------------
# Fixtures: one embedder (dense + sparse + ColBERT), each corpus embedded once


@pytest.fixture(scope="module")
def embedder(tiny_models):
    from xling.actors.embedder import M3Embedder

    return M3Embedder(tiny_models["bge_m3"], max_length=512, batch_size=16, dense=True,
                      sparse=True, colbert=True)


@pytest.fixture(scope="module", params=["builtin", "mrtydi"])
def corpus(request, embedder):
    if request.param == "builtin":
        ids = [f"b{i:02d}" for i in range(len(BUILTIN_DOCS))]
        texts, queries = BUILTIN_DOCS, BUILTIN_QUERIES
    else:
        if not SHARED_DOCS.is_dir():
            pytest.skip(f"{SHARED_DOCS} not found (a clone without ../shared)")
        ids, texts, queries = _mrtydi()
        assert len(ids) >= 60 and len(queries) >= 20
    docs = embedder(_table(ids, texts))
    qs = embedder(_table([f"q{i}" for i in range(len(queries))], queries))
    assert docs["error"].null_count == len(ids) and qs["error"].null_count == len(queries)
    return {"name": request.param, "texts": texts, "queries": queries, "table": docs,
            "docs": _arrays(docs), "q": _arrays(qs)}


# ------------------------------------------------------------------------------------------
# Embedder


def test_embedder_columns_are_flagembedding_outputs(embedder, corpus):
    t, docs = corpus["table"], corpus["docs"]
    dim = embedder.info["dim"]
    assert embedder.info["device"] == "cpu" and embedder.info["dtype"] == "float32"
    assert t.column_names == ["doc_id", "text", "dense", "sparse_ids", "sparse_weights",
                              "colbert", "colbert_len", "error"]
    assert t.schema.field("dense").type == pa.list_(pa.float32(), dim)
    assert t.schema.field("sparse_ids").type == pa.list_(pa.int32())
    assert t.schema.field("sparse_weights").type == pa.list_(pa.float32())
    assert t.schema.field("colbert").type == pa.list_(pa.float32())
    assert t.schema.field("colbert_len").type == pa.int32()
    assert t.schema.field("error").type == pa.string()
    np.testing.assert_allclose(np.linalg.norm(docs["dense"], axis=1), 1.0, rtol=1e-5)

    ref = embedder.model.encode(list(corpus["texts"]), batch_size=16, max_length=512,
                                return_dense=True, return_sparse=True, return_colbert_vecs=True)
    np.testing.assert_allclose(docs["dense"], ref["dense_vecs"], atol=1e-6)
    for ours, theirs in zip(docs["sparse"], ref["lexical_weights"], strict=True):
        assert sorted(ours) == sorted(int(k) for k in theirs)
        for tok, w in ours.items():
            assert w == pytest.approx(float(theirs[str(tok)]), abs=1e-6)
    for ours, theirs, text in zip(docs["colbert"], ref["colbert_vecs"], corpus["texts"]):
        n_tokens = len(embedder.model.tokenizer(text, truncation=True, max_length=512)["input_ids"])
        assert ours.shape == theirs.shape == (n_tokens - 1, embedder.info["colbert_dim"])
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_no_flagembedding_progress_bars(embedder, capfd):
    # From 256 texts a call, FlagEmbedding draws bars that Ray would forward from every actor.
    out = embedder(_table([f"t{i}" for i in range(300)], [f"text {i}" for i in range(300)]))
    assert out["error"].null_count == 300
    captured = capfd.readouterr()
    assert "Inference Embeddings" not in captured.err + captured.out
    assert "pre tokenize" not in captured.err + captured.out


def test_empty_texts_are_error_rows(embedder):
    texts = ["Water boils at one hundred degrees.", "", "  \n\t ", None,
             "Der Zug fährt jede Stunde.", "Amsterdam is a city.", "水は沸騰する。"]
    errors = [None, None, None, None, None, "upstream: translation failed", None]
    batch = _table([f"d{i}" for i in range(len(texts))], texts,
                   error=pa.array(errors, pa.string()), lang=pa.array(["x"] * len(texts)))
    out = embedder(batch)
    # Input columns first, in place (error keeps its position), then the new ones.
    assert out.column_names[:4] == ["doc_id", "text", "error", "lang"]
    assert out.num_rows == len(texts)
    assert out["doc_id"].to_pylist() == batch["doc_id"].to_pylist()
    assert out["text"].to_pylist() == texts
    assert out["error"].to_pylist() == [None, "empty text", "empty text", "empty text", None,
                                        "upstream: translation failed", None]
    bad = [1, 2, 3, 5]
    for col in ("dense", "sparse_ids", "sparse_weights", "colbert", "colbert_len"):
        assert [i for i, v in enumerate(out[col].to_pylist()) if v is None] == bad, col

    good = [0, 4, 6]
    alone = embedder(_table([f"d{i}" for i in good], [texts[i] for i in good]))
    for col in ("dense", "sparse_weights", "colbert"):
        got = [out[col][i].as_py() for i in good]
        for a, b in zip(got, alone[col].to_pylist()):
            np.testing.assert_allclose(a, b, atol=1e-5)
    assert [out["sparse_ids"][i].as_py() for i in good] == alone["sparse_ids"].to_pylist()
    assert [out["colbert_len"][i].as_py() for i in good] == alone["colbert_len"].to_pylist()

    # Nothing to embed at all, and no rows at all: the model is not called, the schema holds.
    for t in (_table(["a", "b"], [None, " "]), _table([], [])):
        res = embedder(t)
        assert res.column_names == ["doc_id", "text", "dense", "sparse_ids", "sparse_weights",
                                    "colbert", "colbert_len", "error"]
        assert res.schema == corpus_schema(embedder)
        assert res["dense"].null_count == t.num_rows


def test_failing_row_is_isolated(embedder, monkeypatch):
    real = embedder.model.encode

    def encode(texts, **kw):
        if any("POISON" in t for t in texts):
            raise RuntimeError("cannot embed this")
        return real(texts, **kw)

    monkeypatch.setattr(embedder.model, "encode", encode)
    out = embedder(_table(["a", "b", "c"], ["Fine text.", "POISON text", "Also fine."]))
    assert out["error"].to_pylist() == [None, "embedding failed: RuntimeError: cannot embed this",
                                        None]
    assert out["dense"].null_count == 1 and out["dense"][1].as_py() is None

    # A model error: FlagEmbedding retries it as out-of-memory with smaller batches down to an
    # empty one and fails on that with an unrelated AttributeError; the row says the cause.
    monkeypatch.undo()

    def forward(*args, **kwargs):
        raise RuntimeError("device-side assert triggered")

    monkeypatch.setattr(embedder.model.model, "forward", forward)
    out = embedder(_table(["a", "b"], ["Fine text.", "Also fine."]))
    assert out["error"].to_pylist() == ["embedding failed: RuntimeError: device-side assert "
                                        "triggered"] * 2


def test_outputs_and_fp16_setting(embedder, tiny_models):
    import torch

    dense_only = embedder.with_outputs(sparse=False, colbert=False)
    assert dense_only.model is embedder.model  # no second load
    out = dense_only(_table(["a"], ["Hello world."]))
    assert out.column_names == ["doc_id", "text", "dense", "error"]
    np.testing.assert_allclose(out["dense"][0].as_py(),
                               embedder(_table(["a"], ["Hello world."]))["dense"][0].as_py(),
                               atol=1e-6)
    if torch.cuda.is_available():
        pytest.skip("the fp16 fallback is for machines without CUDA")
    from xling.actors.embedder import make_embedder

    m = make_embedder(tiny_models["bge_m3"], use_fp16=True)
    assert m.info["device"] == "cpu" and m.info["dtype"] == "float32"
    assert m.info["use_fp16"] is False and "use_fp16 ignored" in m.info["note"]
    assert m.info["dim"] == embedder.info["dim"] and m.info["max_length"] == 512
    # the fingerprint keys vector caches by what was asked for, as the narrow stage's
    # settings do: the same config finds the same cache on a CPU and on a GPU
    assert m.fingerprint == {"max_length": 512, "fp16": True}


def test_bge_m3_is_an_embedder_built_in_one_place(embedder, tiny_models):
    from xling.actors.embedder import (EMBEDDERS, Embedder, M3Embedder, MultiVector,
                                       make_embedder)

    assert set(EMBEDDERS) == {"bge-m3", "e5", "mgte", "repllama", "nv-embed"}
    assert isinstance(embedder, Embedder) and isinstance(embedder, MultiVector)
    assert embedder.dim == embedder.info["dim"]
    assert embedder.fingerprint == {"max_length": 512, "fp16": False}
    texts = ["Hello world.", "Der Zug fährt jede Stunde von Gleis sieben ab. " * 200]
    want = [len(i) for i in embedder.model.tokenizer(texts, add_special_tokens=True,
                                                     truncation=False)["input_ids"]]
    assert embedder.count_tokens(texts) == want and want[1] > 512  # never truncated
    built = make_embedder(tiny_models["bge_m3"], kind="bge-m3", max_length=64, batch_size=4)
    assert type(built) is M3Embedder and built.fingerprint == {"max_length": 64, "fp16": False}
    with pytest.raises(ValueError, match="unknown embedder 'gte'; use one of: bge-m3, e5"):
        make_embedder(tiny_models["bge_m3"], kind="gte")


def test_store_embedder_embeds_each_text_once_and_caches_it(embedder, tiny_models, tmp_path):
    """narrow's pool (core/vectors.StoreEmbedder): every vector is the embedder's own, each
    distinct text of a cache space is embedded once, and a new actor on the same store
    embeds nothing and returns the same vectors, bit for bit."""
    from xling.core.cells import CELL
    from xling.core.store import RunStore
    from xling.core.vectors import StoreEmbedder, cache_dir, load_vectors, text_key

    texts = ["The Eiffel Tower is in Paris.It was built in 1889.", "東京は日本の首都です。",
             "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย", "The Eiffel Tower is in Paris.It was built in 1889.",
             "   ", None, "नई दिल्ली भारत की राजधानी है।", "القاهرة عاصمة مصر.",
             "東京は日本の首都です。", "Kiswahili ni lugha ya Afrika Mashariki. " * 60]
    cells = [0, 0, 0, 0, 0, 0, 1, 0, 1, 1]  # the same Japanese text in two spaces
    prior = [None] * 7 + ["translation failed", None, None]
    rows = pa.table({"text": pa.array(texts, pa.string()), CELL: pa.array(cells, pa.int64()),
                     "error": pa.array(prior, pa.string()), "keep": list(range(10))})
    settings = {"max_length": 512, "fp16": False}
    kw = dict(store_uri=str(tmp_path), model=tiny_models["bge_m3"], cache_model="tiny:bge_m3",
              settings=settings, spaces=["en", "xx"],
              embedder=dict(max_length=512, batch_size=16, device="cpu"))
    actor = StoreEmbedder(**kw)
    got = actor(rows)
    assert got.column_names == [CELL, "keep", "vector", "n_tokens", "cached", "error"]
    assert got["keep"].to_pylist() == list(range(10))
    assert got.schema.field("vector").type == pa.list_(pa.float32())
    errors = got["error"].to_pylist()
    assert errors == [None] * 4 + ["empty text", "empty text", None, "translation failed",
                                   None, None]
    ok = [i for i, e in enumerate(errors) if e is None]
    direct = embedder.with_outputs(sparse=False, colbert=False)(
        pa.table({"text": [texts[i] for i in ok]}))["dense"].to_pylist()
    vectors = got["vector"].to_pylist()
    assert [i for i, v in enumerate(vectors) if v is None] == [4, 5, 7]
    for i, want in zip(ok, direct):
        np.testing.assert_allclose(vectors[i], want, atol=1e-6)
    assert vectors[0] == vectors[3]  # one embedding for both copies
    n_tokens = got["n_tokens"].to_pylist()
    lengths = [len(x) for x in embedder.model.tokenizer([texts[i] for i in ok],
                                                       truncation=False)["input_ids"]]
    assert [n_tokens[i] for i in ok] == lengths and lengths[-1] > 512  # counted untruncated
    assert got["cached"].to_pylist() == [False] * 10
    assert actor.embedded == 6  # 0 (and 3), 1, 2 in "en"; 6, 8, 9 in "xx"

    store = RunStore(str(tmp_path))
    for space, idx in (("en", [0, 1, 2]), ("xx", [6, 8, 9])):
        cache = load_vectors(store, cache_dir("tiny:bge_m3", settings, space))
        assert sorted(cache) == sorted(text_key(texts[i]) for i in idx)
        for i in idx:
            vec, n = cache[text_key(texts[i])]
            assert vec.dtype == np.float32 and vec.tolist() == vectors[i] and n == n_tokens[i]

    again = StoreEmbedder(**kw)(rows)
    assert again["vector"].to_pylist() == vectors and again["n_tokens"].to_pylist() == n_tokens
    assert again["cached"].to_pylist() == [e is None for e in errors]
    assert again["error"].to_pylist() == errors


def test_vector_columns_round_trip_with_null_rows():
    from xling.core.vectors import vector_lists, vector_matrix

    matrix = np.arange(12, dtype=np.float32).reshape(4, 3)
    valid = np.array([True, False, True, True])
    column = vector_lists(matrix, valid)
    assert column.to_pylist() == [[0, 1, 2], None, [6, 7, 8], [9, 10, 11]]
    assert column.value_lengths().to_pylist() == [3, None, 3, 3]  # a null row holds nothing
    back = vector_matrix(pa.chunked_array([column[:2], column[2:]]), 3)
    np.testing.assert_array_equal(back, np.where(valid[:, None], matrix, 0))
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), 3,
                                              mask=pa.array(~valid))
    np.testing.assert_array_equal(vector_matrix(fixed, 3), back)
    np.testing.assert_array_equal(vector_matrix(column.filter(pa.array(valid))), matrix[valid])
    assert vector_matrix(vector_lists(matrix[:0], valid[:0]), 3).shape == (0, 3)


# ------------------------------------------------------------------------------------------
# Dense: sharded == single


def _ks(n: int, shards: int) -> list[int]:
    biggest = max(b - a for a, b in _cuts(n, shards, 0))
    return [5, biggest + 1, n + 3]


@pytest.mark.parametrize("shards", SHARDINGS)
def test_dense_sharded_equals_flat_search(corpus, shards):
    import faiss

    ids, dense, q = corpus["docs"]["ids"], corpus["docs"]["dense"], corpus["q"]["dense"]
    n = len(ids)
    flat = faiss.IndexFlatIP(dense.shape[1])
    flat.add(dense)
    for k in _ks(n, shards):
        scores, found = search_shard(q, ids, dense, k)
        assert scores.shape == found.shape == (len(q), min(k, n))
        merged_s, merged_i = _sharded_search(q, ids, dense, k, shards)
        assert merged_i.tolist() == found.tolist()
        np.testing.assert_array_equal(merged_s, scores)  # the same per-pair computation
        exact = _exact(dense, q)
        for r in range(len(q)):
            assert found[r].tolist() == _reference(exact[:, r], ids, k)
        # A plain FAISS flat search over everything: the same scores to float32 rounding, and
        # the same documents rank by rank except where two scores are within that rounding.
        # (The tiny model's vectors are nearly parallel, cosines ~0.99997, so such near-ties
        # are common here: FAISS's own order of them depends on its float32 arithmetic.)
        f_s, f_i = flat.search(q, min(k, n))
        np.testing.assert_allclose(scores, f_s, atol=1e-6)
        pos = {d: j for j, d in enumerate(ids)}
        for r in range(len(q)):
            ours = exact[[pos[d] for d in found[r]], r]
            np.testing.assert_allclose(exact[f_i[r], r], ours, atol=1e-6)


@pytest.mark.parametrize("placement", ["spread", "same_shard", "tail"])
@pytest.mark.parametrize("shards", SHARDINGS)
def test_dense_ties_at_the_k_boundary(corpus, shards, placement):
    ids, dense, q = list(corpus["docs"]["ids"]), corpus["docs"]["dense"], corpus["q"]["dense"]
    k = 5
    order = _reference(_exact(dense, q[:1])[:, 0], ids, len(ids))
    kth, top = ids.index(order[k - 3]), ids.index(order[0])
    # Copies of the best document (which pushes the others down one rank) and of the one
    # ranked k-2, under ids sorting before and after it: that tie group then fills ranks
    # k-1 .. k+3, and only its first two by id make the cut.
    copies = [("!a-" + ids[kth], kth), ("!b-" + ids[kth], kth), (ids[kth] + "~a", kth),
              (ids[kth] + "~b", kth), (ids[top] + "~dup", top)]
    new_ids, new_vecs = list(ids), list(dense)
    for j, (cid, src) in enumerate(copies):
        if placement == "spread":  # the copies land in different shards
            pos = (j * len(new_ids)) // len(copies)
        elif placement == "same_shard":  # right after the original: one shard, around k
            pos = new_ids.index(ids[src]) + 1
        else:  # the matrix's last rows, which BLAS kernels often handle on their own path
            pos = len(new_ids)
        new_ids.insert(pos, cid)
        new_vecs.insert(pos, dense[src])
    vecs = np.stack(new_vecs)
    scores, found = search_shard(q, new_ids, vecs, k)
    exact = _exact(vecs, q)
    full = sorted(exact[:, 0], reverse=True)
    assert full[k - 1] == full[k]  # the tie really straddles the boundary
    assert found[0].tolist() == _reference(exact[:, 0], new_ids, k)
    tied = [i for i in found[0] if i.startswith("!") or i.endswith(("~a", "~b"))]
    assert tied == ["!a-" + ids[kth], "!b-" + ids[kth]]  # the copies sorting first get in
    at = found[0].tolist().index
    assert scores[0][at(tied[0])] == scores[0][at(tied[1])]  # exactly equal: a real tie
    if placement == "same_shard":  # the tie group is contiguous: mostly in one shard
        group = sorted(new_ids.index(c) for c in [ids[kth], *(c for c, s in copies if s == kth)])
        assert group == list(range(group[0], group[0] + 5))
    for kk in (k, 1, 2, k + 3, len(new_ids)):
        s1, i1 = search_shard(q, new_ids, vecs, kk)
        for seed in range(3):
            parts = [search_shard(q, new_ids[a:b], vecs[a:b], kk)
                     for a, b in _cuts(len(new_ids), shards, seed)]
            ms, mi = merge_topk(parts, kk)
            assert mi.tolist() == i1.tolist()
            np.testing.assert_array_equal(ms, s1)
        for r in range(len(q)):
            assert i1[r].tolist() == _reference(exact[:, r], new_ids, kk)


def test_dense_many_ties_integer_vectors():
    # Vectors in {-1, 0, 1}^4: scores are small integers, so most of them tie; exact
    # candidates must extend well past k + extra.
    rng = np.random.default_rng(7)
    for trial in range(12):
        nd, nq = int(rng.integers(20, 400)), int(rng.integers(1, 25))
        x = rng.integers(-1, 2, size=(nd, 4)).astype(np.float32)
        q = rng.integers(-1, 2, size=(nq, 4)).astype(np.float32)
        ids = [f"d{j:04d}" for j in rng.permutation(nd)]
        exact = _exact(x, q)
        for k in (1, 5, 37, nd + 1):
            s, i = search_shard(q, ids, x, k, extra=2)
            for r in range(nq):
                assert i[r].tolist() == _reference(exact[:, r], ids, k)
            for shards in SHARDINGS:
                ms, mi = _sharded_search(q, ids, x, k, shards, seed=trial)
                assert mi.tolist() == i.tolist() and np.array_equal(ms, s)


def test_search_edge_cases():
    x = np.eye(3, dtype=np.float32)
    s, i = search_shard(np.ones((2, 3), np.float32), ["c", "a", "b"], x, 2)
    assert i.tolist() == [["a", "b"], ["a", "b"]] and s.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    s, i = search_shard(np.ones((2, 3), np.float32), [], np.zeros((0, 3), np.float32), 5)
    assert s.shape == i.shape == (2, 0)
    s, i = search_shard(np.ones((2, 3), np.float32), ["a", "b", "c"], x, 0)
    assert s.shape == (2, 0)
    ms, mi = merge_topk([(np.zeros((2, 0)), np.empty((2, 0), object)),
                         search_shard(np.ones((2, 3), np.float32), ["z"], x[:1], 4)], 4)
    assert mi.tolist() == [["z"], ["z"]]
    with pytest.raises(ValueError, match="non-finite"):
        search_shard(np.ones((1, 3), np.float32), ["a", "b", "c"], x * np.nan, 1)
    assert rank_topk(np.array([1.0, 2.0, 2.0, 0.5]), ["d", "c", "b", "a"], 3).tolist() == [2, 1, 0]


# ------------------------------------------------------------------------------------------
# Hybrid


@pytest.mark.parametrize("shards", SHARDINGS)
def test_hybrid_sharded_equals_single(corpus, shards):
    docs, q = corpus["docs"], corpus["q"]
    n = len(docs["ids"])
    cuts = _cuts(n, shards, 1)
    for r in range(len(q["ids"])):
        one = {"dense": q["dense"][r], "sparse": q["sparse"][r], "colbert": q["colbert"][r]}
        full = hybrid_scores(one, docs, WEIGHTS)
        for k in _ks(n, shards):
            s1, i1 = hybrid_topk(one, docs, WEIGHTS, k)
            assert i1[0].tolist() == _reference(full, docs["ids"], k)
            parts = [hybrid_topk(one, {key: v[a:b] for key, v in docs.items()}, WEIGHTS, k)
                     for a, b in cuts]
            ms, mi = merge_topk(parts, k)
            assert mi.tolist() == i1.tolist()
            np.testing.assert_array_equal(ms, s1)
    # Dense weight only: the hybrid path scores exactly like the FAISS path.
    one = {"dense": q["dense"][0]}
    s_h, i_h = hybrid_topk(one, docs, {"dense": 1.0}, 10)
    s_d, i_d = search_shard(q["dense"][:1], docs["ids"], docs["dense"], 10)
    assert i_h.tolist() == i_d.tolist() and np.array_equal(s_h, s_d)


def test_hybrid_score_is_bge_m3s(embedder, corpus):
    model = embedder.model
    texts, queries = corpus["texts"], corpus["queries"]
    pairs = [(queries[0], texts[0]), (queries[1], texts[3]), (queries[-1], texts[-1])]
    for qt, dt in pairs:
        q = _arrays(embedder(_table(["q"], [qt])))
        d = _arrays(embedder(_table(["d"], [dt])))
        one = {"dense": q["dense"][0], "sparse": q["sparse"][0], "colbert": q["colbert"][0]}
        parts = {name: hybrid_scores(one, d, {name: 1.0})[0]
                 for name in ("dense", "sparse", "colbert")}
        hybrid = hybrid_scores(one, d, WEIGHTS)[0]
        assert hybrid == pytest.approx(sum(WEIGHTS[p] * parts[p] for p in parts), abs=1e-12)
        # One pair per call: in a batch FlagEmbedding pads the passages with zero ColBERT
        # vectors, which count in its max (a score below 0 for a token becomes 0).
        ref = model.compute_score((qt, dt), max_query_length=512, max_passage_length=512,
                                  weights_for_different_modes=[WEIGHTS["dense"],
                                                               WEIGHTS["sparse"],
                                                               WEIGHTS["colbert"]])
        for name in ("dense", "sparse", "colbert"):
            assert parts[name] == pytest.approx(ref[name], abs=1e-5), name
        # compute_score's "colbert+sparse+dense" is the weighted mean: our sum / sum(weights).
        assert hybrid / sum(WEIGHTS.values()) == pytest.approx(ref["colbert+sparse+dense"],
                                                               abs=1e-5)
        enc = model.encode([qt, dt], return_dense=True, return_sparse=True,
                           return_colbert_vecs=True)
        lw_q, lw_d = enc["lexical_weights"]
        assert parts["sparse"] == pytest.approx(
            float(model.compute_lexical_matching_score(lw_q, lw_d)), abs=1e-5)
        assert lexical_score(lw_q, lw_d) == pytest.approx(parts["sparse"], abs=1e-5)  # str keys
        c_q, c_d = enc["colbert_vecs"]
        assert parts["colbert"] == pytest.approx(float(model.colbert_score(c_q, c_d)), abs=1e-5)
        assert colbert_score(c_q, c_d) == pytest.approx(parts["colbert"], abs=1e-5)


# ------------------------------------------------------------------------------------------
# The retriever actor: a batch of queries gives what each query gives alone


@pytest.mark.parametrize("merge", ["score", "interleave"])
def test_retriever_batch_equals_one_query_at_a_time(tiny_models, corpus, merge):
    from xling.actors.dense_retriever import DenseRetriever

    t = corpus["table"]
    half = t.num_rows // 2
    # two index locations (partitions), each in 3 uneven shards
    locations = {"A": t.slice(0, half), "B": t.slice(half)}

    def load(location):
        part = locations[location]
        return [part.slice(a, b - a) for a, b in _cuts(part.num_rows, 3, seed=1)]

    retriever = DenseRetriever(embedder={"model": tiny_models["bge_m3"], "max_length": 512,
                                         "batch_size": 16}, load=load, k=5, merge=merge)
    qs = corpus["queries"][:6]
    orders = [["A", "B"], ["B", "A"], ["A"], ["B"], ["A", "B"], []]
    hyb = [0.0, 0.3, 0.0, 0.0, 0.3, 0.0]  # dense-only and hybrid queries mixed in one batch
    batch = pa.table({
        "query_id": [f"q{i}" for i in range(len(qs))], "text": qs,
        "partitions": orders, "partition_langs": [[p.lower() for p in o] for o in orders],
        "w_dense": [1.0] * len(qs), "w_sparse": hyb, "w_colbert": [w and 1.0 for w in hyb],
        "error": pa.nulls(len(qs), pa.string())})
    together = retriever(batch).to_pylist()
    alone = [r for i in range(len(qs)) for r in retriever(batch.slice(i, 1)).to_pylist()]
    # The query embeddings themselves move in the last float32 bits with the batch they
    # are encoded in (padding); ranks, ids and partitions must not.
    def key(rows):
        return [(r["query_id"], r["rank"], r["doc_id"], r["doc_lang"], r["error"]) for r in rows]

    assert key(together) == key(alone)
    scores = [(a["score"], b["score"]) for a, b in zip(together, alone) if a["doc_id"]]
    assert [a for a, _ in scores] == pytest.approx([b for _, b in scores], rel=1e-5)
    by_q = {}
    for r in together:
        by_q.setdefault(r["query_id"], []).append(r)
    assert [r["doc_lang"] for r in by_q["q0"]][:2] != [None, None]
    assert by_q["q5"][0]["error"] and "no partition" in by_q["q5"][0]["error"]
    if merge == "interleave":  # round-robin follows each query's own partition order
        assert [r["doc_lang"] for r in by_q["q0"]][:2] == ["a", "b"]
        assert [r["doc_lang"] for r in by_q["q1"]][:2] == ["b", "a"]
