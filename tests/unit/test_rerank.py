"""Listwise and pairwise reranking control flow, with a scripted judge that always prefers
the more relevant passage, on the real CIRAL and MIRACL qrels and shuffled runs.

The judge is a fake engine on purpose: it tests the algorithms (windows, bubble sort,
lockstep batching, call counts, parsing), not a model. The rerank stage's integration test
with vLLM is in tests/e2e/test_llm_stages.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from helpers import ScriptedJudge
from xling.tasks import irmetrics
from xling.tasks.rerank import (Candidates, fit_listwise, listwise_prompt, listwise_rerank,
                                listwise_windows, n_listwise_calls, n_pairwise_calls_bound,
                                pairwise_prompt, pairwise_rerank, parse_choice,
                                parse_decoded_passage, parse_passage_token, parse_permutation)
from xling.tasks.runs import hits_table
from xling.tasks.topics import iter_qrels

QRELS = Path(__file__).resolve().parents[1] / "data/qrels"  # copies of ../shared/data/ir/qrels
FILES = ["qrels.ciral-v1.0-sw-test-a.tsv", "qrels.ciral-v1.0-ha-test-a.tsv",
         "qrels.miracl-v1.0-fi-dev.tsv"]


def load_qrels(name: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    with open(QRELS / name, "rb") as f:
        for row in iter_qrels(f):
            out.setdefault(row["query_id"], {})[row["doc_id"]] = row["relevance"]
    return out


def shuffled_run(qrels, depth=100, seed=0, limit=None) -> list[Candidates]:
    """Per query: its judged docs plus unjudged fillers up to `depth`, shuffled."""
    rng = random.Random(seed)
    out = []
    for qid in sorted(qrels)[:limit]:
        docs = list(qrels[qid])[:depth]
        docs += [f"filler-{qid}-{k}" for k in range(depth - len(docs))]
        rng.shuffle(docs)
        out.append(Candidates(qid, f"query {qid}", docs, [f"passage about {d}" for d in docs]))
    return out


def as_run(results, system):
    return hits_table({r.query_id: {d: float(len(r.doc_ids) - k) for k, d in enumerate(r.doc_ids)}
                       for r in results}, system=system)


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("method", ["listwise", "pairwise"])
def test_scripted_judge_reaches_the_oracle_ceiling(name, method):
    qrels = load_qrels(name)
    queries = shuffled_run(qrels, limit=60 if method == "pairwise" else None)
    judge = ScriptedJudge(qrels)
    if method == "listwise":
        results = listwise_rerank(queries, judge, window=20, step=10)
    else:
        results = pairwise_rerank(queries, judge, passes=10)
    for q, r in zip(queries, results):
        assert sorted(r.doc_ids) == sorted(q.doc_ids)  # a permutation: nothing lost or added
        n_rel = sum(qrels[q.query_id].get(d, 0) > 0 for d in q.doc_ids)
        top10 = [qrels[q.query_id].get(d, 0) for d in r.doc_ids[:10]]
        if n_rel <= 10:
            assert sum(x > 0 for x in top10) == n_rel, q.query_id
        else:
            assert all(x > 0 for x in top10), q.query_id
        assert r.malformed == r.unparseable == r.failed == 0
    # The metric equals the oracle's glass ceiling on every query with <= 10 relevant docs
    # (nDCG@10: the judge orders by grade, as the oracle does).
    before = as_run([type(r)(q.query_id, q.doc_ids) for q, r in zip(queries, results)], "bm25")
    oracle = irmetrics.evaluate(irmetrics.oracle_ceiling(before, qrels, depth=100), qrels,
                                ["ndcg_cut_10", "P_10"])
    got = irmetrics.evaluate(as_run(results, method), qrels, ["ndcg_cut_10", "P_10"])
    small = [q.query_id for q in queries
             if sum(qrels[q.query_id].get(d, 0) > 0 for d in q.doc_ids) <= 10]
    assert len(small) > 10
    for qid in small:
        assert got[qid]["ndcg_cut_10"] == pytest.approx(oracle[qid]["ndcg_cut_10"]), qid
    shuffled = irmetrics.evaluate(before, qrels, ["ndcg_cut_10"])
    assert irmetrics.mean(got, "ndcg_cut_10") > irmetrics.mean(shuffled, "ndcg_cut_10") + 0.2
    # Call counts: listwise = windows per query, exactly; PRP within 2 * sum_{i<k} (n-1-i).
    if method == "listwise":
        assert [r.calls for r in results] == [n_listwise_calls(100, 20, 10)] * len(queries) == [9] * len(queries)
        assert judge.calls == 9 * len(queries)
        assert judge.batches == [len(queries)] * 9  # lockstep: every call is a full batch
    else:
        bound = n_pairwise_calls_bound(100, 10)
        assert bound == 2 * sum(99 - i for i in range(10)) == 1890
        assert all(0 < r.calls <= bound for r in results)
        assert judge.calls == sum(r.calls for r in results)
        assert max(judge.batches) == 2 * len(queries)  # one comparison per query per step


def test_listwise_windows_and_lockstep_with_uneven_lists():
    assert listwise_windows(100, 20, 10) == [(80, 100), (70, 90), (60, 80), (50, 70), (40, 60),
                                             (30, 50), (20, 40), (10, 30), (0, 20)]
    # 25 docs: RankGPT's original loop would stop at (5, 25) and never rerank the top 5.
    assert listwise_windows(25, 20, 10) == [(5, 25), (0, 15)]
    assert listwise_windows(7, 20, 10) == [(0, 7)] and listwise_windows(1, 20, 10) == []
    for n in range(1, 130):
        assert len(listwise_windows(n, 20, 10)) == n_listwise_calls(n, 20, 10)
    qrels = {"a": {"d3": 1}, "b": {"d0": 1}}
    queries = [Candidates("a", "query a", [f"d{k}" for k in range(45)],
                          [f"passage about d{k}" for k in range(45)]),
               Candidates("b", "query b", ["d0", "d1"], ["passage about d0", "passage about d1"])]
    judge = ScriptedJudge(qrels)
    out = listwise_rerank(queries, judge)
    assert judge.batches == [2, 1, 1, 1] and [r.calls for r in out] == [4, 1]
    assert out[0].doc_ids[0] == "d3" and out[1].doc_ids == ["d0", "d1"]


def test_permutation_parsing_is_robust():
    assert parse_permutation("[2] > [1] > [3]", 3) == ([1, 0, 2], "ok")
    assert parse_permutation("[2] > [2] > [1]", 3) == ([1, 0, 2], "repaired")  # dup, missing
    assert parse_permutation("[3] > [9] > [1]", 3) == ([2, 0, 1], "repaired")  # out of range
    assert parse_permutation("2 > 3 > 1", 3) == ([1, 2, 0], "ok")  # no brackets at all
    assert parse_permutation("I cannot rank these.", 3) == ([0, 1, 2], "unparseable")
    assert parse_permutation(None, 2) == ([0, 1], "unparseable")
    assert parse_choice("Passage B") == "B" and parse_choice("**passage a** is better") == "A"
    assert parse_choice("B.") == "B" and parse_choice("Both") is None and parse_choice(None) is None


def test_malformed_and_failed_outputs_are_counted_and_harmless():
    docs = [f"d{k}" for k in range(30)]
    q = Candidates("q", "query q", docs, [f"passage about {d}" for d in docs])
    answers = iter(["garbage", "[3] > [3] > [1]"])
    out = listwise_rerank([q], lambda ps: [next(answers) for _ in ps])[0]
    assert (out.calls, out.unparseable, out.malformed) == (2, 1, 1)
    assert sorted(out.doc_ids) == sorted(docs) and out.doc_ids[:3] == ["d2", "d0", "d1"]
    out = listwise_rerank([q], lambda ps: [None] * len(ps))[0]
    assert out.failed == 2 and out.doc_ids == docs
    # PRP: a judge that always says "Passage A" (pure position bias) never swaps: both
    # orders must agree. One pass, then nothing changed, so it stops.
    out = pairwise_rerank([q], lambda ps: ["Passage A"] * len(ps), passes=10)[0]
    assert out.doc_ids == docs and out.calls == 2 * 29
    out = pairwise_rerank([q], lambda ps: ["no idea"] * len(ps), passes=3)[0]
    assert out.doc_ids == docs and out.unparseable == out.calls == 58


def test_prp_restores_the_first_stage_order_below_the_top_k():
    """llm-rankers (LLM-CLIR's PRP): the sorted top-k, then the rest in first-stage order."""
    docs = [f"d{k}" for k in range(12)]
    qrels = {"q": {"d11": 2, "d10": 1}}
    q = Candidates("q", "query q", docs, [f"passage about {d}" for d in docs])
    out = pairwise_rerank([q], ScriptedJudge(qrels), passes=2)[0]
    assert out.doc_ids == ["d11", "d10", *docs[:10]]
    bubbled = pairwise_rerank([q], ScriptedJudge(qrels), passes=2, restore_tail=False)[0]
    assert bubbled.doc_ids[:2] == ["d11", "d10"] and sorted(bubbled.doc_ids) == sorted(docs)
    # With the llm-rankers prompt and one-token answers (" Passage:" then "A"/"B"/junk).
    judge = ScriptedJudge(qrels)
    token = lambda ps: [judge.answer(p[-1]["content"]).split()[-1].lower() for p in ps]
    out = pairwise_rerank([q], token, passes=2, parse=parse_passage_token,
                          prompt=lambda a, b, c: pairwise_prompt(a, b, c, "llm_rankers"))[0]
    assert out.doc_ids == ["d11", "d10", *docs[:10]] and out.unparseable == 0
    assert parse_passage_token(" B") == "B" and parse_passage_token("x") is None
    # An encoder-decoder (llm-rankers' T5 branch): the decoder continues "Passage", and the
    # whole decoded answer must read "Passage A" / "Passage B" exactly.
    cont = lambda ps: [" " + judge.answer(p[-1]["content"]).split()[-1] for p in ps]
    out = pairwise_rerank([q], cont, passes=2, parse=parse_decoded_passage)[0]
    assert out.doc_ids == ["d11", "d10", *docs[:10]] and out.unparseable == 0
    assert [parse_decoded_passage(t) for t in (" A", " B", "A", " a", " A.", " AB", None)] == [
        "A", "B", None, None, None, None, None]


def test_listwise_shrinks_passages_to_fit_the_context():
    """rank_llm: a window longer than the context has every passage cut until it fits."""
    words = lambda p: sum(len(m["content"].split()) for m in p)  # 1 token = 1 word here
    cut = lambda texts, n: [" ".join(t.split()[:n]) for t in texts]
    passages = [" ".join(f"w{k}" for k in range(256))] * 20
    budget = 4096 - 120
    prompt, shrunk_to = fit_listwise("q", passages, n_tokens=words, budget=budget,
                                     truncate=cut, limit=256)
    assert words(listwise_prompt("q", passages)) > budget >= words(prompt)
    assert shrunk_to is not None and 150 < shrunk_to < 256
    assert words(listwise_prompt("q", cut(passages, shrunk_to + 1))) > budget  # no more cut than needed
    short, none = fit_listwise("q", passages[:2], n_tokens=words, budget=budget, truncate=cut,
                               limit=256)
    assert none is None and short == listwise_prompt("q", passages[:2])
    qrels = {"q": {"d3": 1}}
    q = Candidates("q", "query q", [f"d{k}" for k in range(20)],
                   [f"passage about d{k} " + "x " * 300 for k in range(20)])
    fit = lambda query, texts: fit_listwise(query, texts, n_tokens=words, budget=budget,
                                            truncate=cut, limit=400)
    judge = ScriptedJudge(qrels)
    out = listwise_rerank([q], lambda ps: [judge.answer(p[-1]["content"].replace(" x", ""))
                                           for p in ps], fit=fit)[0]
    assert out.shrunk == 1 and out.doc_ids[0] == "d3"


def test_prp_answers_with_the_papers_one_token_by_default(tmp_path):
    """LLM-CLIR's PRP (L105, L414: llm-rankers) continues the chat prompt by " Passage:" and
    generates one token: the default `prp_answer`, with max_tokens 1. Free generation is the
    named option `generate`; a backend that cannot continue a prompt is told to use it (a
    listwise run there is fine)."""
    from xling.config import load_config
    from xling.core.config import ConfigError
    from xling.jobs.rerank import RerankRun, rerank_cells

    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 1.0 x\n")
    (tmp_path / "t.tsv").write_text("q1\tquery\n")
    (tmp_path / "d.jsonl").write_text('{"docid": "d1", "text": "passage"}\n')
    src = (f"trec: '{tmp_path}/run.trec', topics: {{name: t, path: '{tmp_path}/t.tsv', "
           f"langs: [en]}}, corpus: {{name: d, format: jsonl, path: '{tmp_path}/d.jsonl', "
           "langs: [en]}")

    def cells(backend: str, runs: list[str]):
        model = ("{model: m, backend: openai, base_url: 'http://127.0.0.1:9', api_key_env: null}"
                 if backend == "openai" else "{model: tiny:llama_chat, backend: vllm}")
        (tmp_path / "c.yaml").write_text(
            f"name: c\nrun_root: {tmp_path}/run\nrerank:\n  model: {model}\n  runs:\n"
            + "".join(f"    - {{name: r{k}, {r}, {src}}}\n" for k, r in enumerate(runs)))
        return rerank_cells(load_config(tmp_path / "c.yaml"))

    assert RerankRun.model_fields["prp_answer"].default == "passage_token"
    [cell] = cells("vllm", ["method: pairwise"])
    assert cell.params["method"]["prp_answer"] == "passage_token"
    assert cell.params["sampling"]["max_tokens"] == 1
    [cell] = cells("vllm", ["method: pairwise, prp_answer: generate"])
    assert cell.params["sampling"]["max_tokens"] == 8
    with pytest.raises(ConfigError, match=r"set prp_answer: generate \(free generation\)"):
        cells("openai", ["method: pairwise"])
    assert len(cells("openai", ["method: pairwise, prp_answer: generate",
                                "method: listwise"])) == 2
