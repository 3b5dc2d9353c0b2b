"""One loaded BGE-M3 for the index, retrieve and narrow stages of a run (core/hosts.py,
actors/embedder.EmbedderHost): what a stage's pool gets from the host is what the embedder
loaded in its own process gives, with the stage's own per-call settings (lengths, outputs,
text column). The runner's use of it runs in tests/e2e/test_retrieve.py (index and retrieve
on one host, query and passage lengths apart)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

TEXTS = ["The Eiffel Tower is in Paris.It was built in 1889.",
         "東京は日本の首都です。人口は約1400万人です。",
         "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย",
         "नई दिल्ली भारत की राजधानी है। यह यमुना नदी के किनारे है।",
         "القاهرة عاصمة مصر وأكبر مدنها.",
         "", "Kiswahili ni lugha ya Afrika Mashariki. " * 20]


def _assert_same(got: pa.Table, want: pa.Table) -> None:
    assert got.column_names == want.column_names
    assert got["error"].to_pylist() == want["error"].to_pylist()
    for name in got.column_names:
        if name in ("dense", "colbert", "sparse_weights", "vector"):
            for a, b in zip(got[name].to_pylist(), want[name].to_pylist()):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_allclose(a, b, atol=1e-6)
        elif name != "error":
            assert got[name].to_pylist() == want[name].to_pylist(), name


def test_hosted_embedder_gives_what_a_local_one_gives(tiny_models, ray_local):
    import ray

    from xling.actors.embedder import HostedEmbedder, make_embedder
    from xling.core.config import Parallelism
    from xling.core.hosts import embedder_spec, start_hosts

    path = tiny_models["bge_m3"]
    spec = embedder_spec("tiny:bge_m3", path, Parallelism(), use_fp16=False, device="cpu")
    [host] = start_hosts(spec, 1, 1, 0)
    try:
        batch = pa.table({"contents": TEXTS, "doc_id": [f"d{i}" for i in range(len(TEXTS))]})
        # index's settings: passages under `contents`, all three outputs, a short length
        index = dict(max_length=16, batch_size=4, sparse=True, colbert=True,
                     text_column="contents", device="cpu")
        hosted = make_embedder(path, hosts=[host], **index)
        assert isinstance(hosted, HostedEmbedder)
        local = make_embedder(path, **index)
        _assert_same(hosted(batch), local(batch))
        assert hosted.fingerprint == local.fingerprint == {"max_length": 16, "fp16": False}
        assert hosted.dim == local.dim and hosted.info == local.info
        assert hosted.count_tokens(TEXTS) == local.count_tokens(TEXTS)
        # retrieve's settings on the same host: another length, dense only, `text`
        queries = pa.table({"text": TEXTS})
        q_hosted = make_embedder(path, hosts=[host], max_length=64, batch_size=2)
        q_local = make_embedder(path, max_length=64, batch_size=2, device="cpu")
        _assert_same(q_hosted(queries), q_local(queries))
        assert q_hosted.fingerprint["max_length"] == 64
        long = pa.table({"contents": [TEXTS[-1]]})
        assert not np.allclose(hosted(long)["dense"].to_pylist(),
                               make_embedder(path, hosts=[host], **{**index, "max_length": 64})(
                                   long)["dense"].to_pylist())  # the length is the call's
        # the retriever switches outputs on the hosted model, as on a local one
        both = q_hosted.with_outputs(sparse=True)
        _assert_same(both(queries), q_local.with_outputs(sparse=True)(queries))
        # a load setting is not a call's to change
        with pytest.raises(ray.exceptions.RayTaskError, match="change the loaded model"):
            q_hosted.with_settings(use_fp16=True)
        # narrow's pool (vectors, token counts, its cache's fingerprint check) on the host
        from xling.core.cells import CELL
        from xling.core.vectors import StoreEmbedder

        rows = pa.table({"text": TEXTS, CELL: pa.array([0] * len(TEXTS), pa.int64())})
        narrow = dict(store_uri=None, model=path, cache_model="tiny:bge_m3",
                      settings={"max_length": 64, "fp16": False}, spaces=["en"])
        settings = dict(kind="bge-m3", use_fp16=False, device="cpu", max_length=64,
                        batch_size=4)
        got = StoreEmbedder(**narrow, embedder={**settings, "hosts": [host]})(rows)
        want = StoreEmbedder(**narrow, embedder=settings)(rows)
        _assert_same(got, want)
        assert got["n_tokens"].to_pylist()[0] > 10 and got["error"].to_pylist()[5]
    finally:
        ray.kill(host)


def test_one_hosted_e5_embeds_passages_and_queries(tiny_models, ray_local):
    """E5 (actors/hf_embedders.py) on one host for index and retrieve: each stage's calls
    carry its role, and a role is a call's prefix ("passage: " / "query: "), not the load's."""
    import ray

    from xling.actors.embedder import make_embedder
    from xling.core.config import Parallelism
    from xling.core.hosts import embedder_spec, start_hosts

    path = tiny_models["e5"]
    spec = embedder_spec("tiny:e5", path, Parallelism(), use_fp16=False, device="cpu",
                         kind="e5")
    [host] = start_hosts(spec, 1, 1, 0)
    try:
        passages = pa.table({"contents": TEXTS})
        index = dict(kind="e5", max_length=16, batch_size=4, dense=True, sparse=False,
                     colbert=False, text_column="contents", role="passage")
        p_hosted = make_embedder(path, hosts=[host], **index)
        _assert_same(p_hosted(passages), make_embedder(path, device="cpu", **index)(passages))
        queries = pa.table({"text": TEXTS})
        retrieve = dict(kind="e5", max_length=64, batch_size=2, role="query")
        q_hosted = make_embedder(path, hosts=[host], **retrieve)
        _assert_same(q_hosted(queries), make_embedder(path, device="cpu", **retrieve)(queries))
        assert (p_hosted.fingerprint["role"], q_hosted.fingerprint["role"]) == ("passage",
                                                                               "query")
        as_passage = make_embedder(path, hosts=[host], **{**retrieve, "role": "passage"})
        assert not np.allclose(q_hosted(queries)["dense"].to_pylist()[0],
                               as_passage(queries)["dense"].to_pylist()[0])
    finally:
        ray.kill(host)
