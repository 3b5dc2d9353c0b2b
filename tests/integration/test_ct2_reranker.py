"""Aya-101, LLM-CLIR's pairwise reranker (an mT5), through backend ctranslate2
(core/engines/ctranslate2.py), on the tiny mT5 that `xling models tiny` builds (tiny:aya_hf,
converted: tiny:aya_ct2), against its reference implementation, transformers'
MT5ForConditionalGeneration: the same greedy answers, with and without llm-rankers' decoder
prefix "Passage" (PairwiseLlmRanker's T5 branch, which LLM-CLIR's PRP ran, llm-clir.txt
L414), and the same log-probabilities. Then the rerank stage's actor reranks with it
in-process, and its order is the one llm-rankers' reading of the reference's answers gives.

The passages are real text in several scripts (tests/data/text/real.json, each with its
source; tests/data/topics: CIRAL's English topics).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_ct2_reranker")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = json.loads((DATA / "text/real.json").read_text("utf-8"))["texts"]
TOPICS = [line.split("\t")[1].strip() for line in
          (DATA / "topics/topics.ciral-v1.0-ha-test-a.tsv").read_text("utf-8").splitlines()[:4]]
PASSAGES = [REAL["am_news"]["text"][:300], REAL["th_astronomy"]["text"][:200],
            REAL["te_guntur"]["text"][:200], *[REAL["borderlines"]["text"][k]
                                              for k in ("ar", "bn", "az", "bs")]]


@pytest.fixture(scope="module")
def reference(tiny_models):
    from transformers import AutoTokenizer, MT5ForConditionalGeneration

    path = tiny_models["aya_hf"]
    return AutoTokenizer.from_pretrained(path), MT5ForConditionalGeneration.from_pretrained(path)


@pytest.fixture(scope="module")
def engine(tiny_models):
    from xling.core.engines import make_engine
    from xling.core.llm import engine_spec, parse_llm_spec

    spec = parse_llm_spec({"backend": "ctranslate2", "model": tiny_models["aya_ct2"]})
    return make_engine({**engine_spec(spec), "hang_timeout_s": None})


def prp_prompts() -> list[str]:
    from xling.tasks.rerank import pairwise_prompt

    out = []
    for i, query in enumerate(TOPICS):
        a, b = PASSAGES[i], PASSAGES[(i + 3) % len(PASSAGES)]
        out += [pairwise_prompt(query, a, b)[0]["content"],
                pairwise_prompt(query, b, a)[0]["content"]]
    return out


def hf_generate(reference, prompts: list[str], max_new_tokens: int,
                prefix: str = "") -> list[str]:
    """llm-rankers' T5 compare: the prompts padded, the decoder started from "<pad>" +
    prefix, greedy, the whole output decoded without special tokens."""
    import torch

    tok, model = reference
    enc = tok(prompts, padding="longest", return_tensors="pt")
    kwargs = {}
    if prefix:
        start = tok.encode(f"<pad> {prefix}", add_special_tokens=False, return_tensors="pt")
        kwargs["decoder_input_ids"] = start.repeat(len(prompts), 1)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                             **kwargs)
    return tok.batch_decode(out, skip_special_tokens=True)


def test_greedy_answers_equal_transformers(engine, reference):
    from xling.actors.llm import Sampling
    from xling.tasks.rerank import DECODER_PREFIX, parse_decoded_passage

    prompts = prp_prompts()
    # Free generation: the same text, token for token.
    got = engine.complete(prompts, Sampling(max_tokens=12))
    assert [c.error for c in got] == [None] * len(prompts)
    assert [c.text for c in got] == hf_generate(reference, prompts, 12)
    # PRP as llm-rankers asks a T5: decoder "<pad> Passage", two more tokens, the whole
    # output read as "Passage A" / "Passage B".
    want = hf_generate(reference, prompts, 2, prefix=DECODER_PREFIX)
    got = engine.complete(prompts, Sampling(max_tokens=2), prefix=DECODER_PREFIX)
    assert [DECODER_PREFIX + c.text for c in got] == want
    assert [parse_decoded_passage(c.text) for c in got] == [
        {"Passage A": "A", "Passage B": "B"}.get(w) for w in want]
    assert all(w in ("Passage A", "Passage B") for w in want)  # the tiny model answers PRP
    assert {c.finish_reason for c in got} == {"stop"} and {c.n_output_tokens for c in got} == {1}


def test_log_probabilities_equal_transformers(engine, reference):
    """The converted model's scores are the checkpoint's: mT5's output layer is untied and
    unscaled (transformers 5 calls every mT5 tied, and CTranslate2 would then scale it)."""
    import torch

    tok, model = reference
    prompts, answers = prp_prompts()[:4], ["Passage A", "Passage B", "Passage B", "Passage A"]
    enc = tok(prompts, padding="longest", return_tensors="pt")
    labels = tok(answers, padding="longest", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(**enc, labels=labels).logits
    want = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    sources = [engine.tokenize(p) for p in prompts]
    targets = [tok.convert_ids_to_tokens(tok.encode(a, add_special_tokens=False)) for a in answers]
    scored = engine.translator.score_batch(sources, targets)
    for k, s in enumerate(scored):
        n = len(targets[k]) + 1  # CTranslate2 scores the end token too
        assert s.log_probs == pytest.approx(want[k, :n].tolist(), abs=1e-4)


def test_prompt_forms_lengths_and_sampling(engine, reference):
    import torch

    from xling.actors.llm import Sampling
    from xling.tasks.rerank import DECODER_PREFIX, listwise_prompt

    greedy = Sampling(max_tokens=6)
    # A chat is its messages' contents joined by blank lines (mT5 has no chat template).
    chat = listwise_prompt(TOPICS[0], PASSAGES[:3])
    joined = "\n\n".join(m["content"] for m in chat)
    [a, b] = engine.complete([chat, joined], greedy)
    assert a.text == b.text and a.n_prompt_tokens == b.n_prompt_tokens
    # Bad prompts are error rows, the others are answered.
    long = " ".join(PASSAGES) * 3
    n = len(engine.tokenize(long))
    assert n > engine.max_model_len == 1024
    refused, empty, ok = engine.complete([long, " ", TOPICS[1]], greedy)
    assert "prompt too long" in refused.error and refused.n_prompt_tokens == n
    assert empty.error == "empty prompt" and ok.error is None and ok.text
    [cut] = engine.complete([long], greedy, too_long="truncate")
    assert cut.error is None and cut.truncated_from == n and cut.n_prompt_tokens == 1024
    [regex] = engine.complete([TOPICS[0]], Sampling(regex="A|B"))
    assert "regex" in regex.error
    # allowed: of "A" and "B", the one the model scores higher after the prefix.
    tok, model = reference
    prompts = prp_prompts()[:4]
    got = engine.complete(prompts, Sampling(max_tokens=1), prefix=DECODER_PREFIX,
                          allowed=["A", "B"])
    enc = tok(prompts, padding="longest", return_tensors="pt")
    start = tok.encode(f"<pad> {DECODER_PREFIX}", add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        last = model(**enc, decoder_input_ids=start.repeat(len(prompts), 1)).logits[:, -1]
    ids = tok.convert_tokens_to_ids(["▁A", "▁B"])
    assert [c.text for c in got] == [" B" if row[ids[1]] > row[ids[0]] else " A" for row in last]
    # Sampling: CTranslate2 cannot seed a request, so only an unseeded sample is drawn.
    seeded, = engine.complete(prompts[:1], Sampling(max_tokens=8, temperature=1.5, seed=7))
    assert "cannot seed a sample per request" in seeded.error
    hot = engine.complete(prompts, Sampling(max_tokens=8, temperature=1.5, seed=None))
    assert all(c.error is None and c.n_output_tokens >= 1 for c in hot)
    # Stop strings end the answer where they first appear.
    [free] = engine.complete([prompts[0]], Sampling(max_tokens=12))
    stop = free.text[3:6]
    [stopped] = engine.complete([prompts[0]], Sampling(max_tokens=12, stop=[stop]))
    assert stopped.text == free.text[:free.text.index(stop)] and stopped.finish_reason == "stop"


def reference_complete(reference):
    """llm-rankers' PairwiseLlmRanker.compare for a T5, on the reference model: each
    prompt's decoded output ("Passage A" / "Passage B")."""
    from xling.tasks.rerank import DECODER_PREFIX

    return lambda prompts: hf_generate(reference, [p[0]["content"] for p in prompts], 2,
                                       prefix=DECODER_PREFIX)


def test_the_rerank_actor_reranks_as_llm_rankers_would(tmp_path, tiny_models, reference):
    """The rerank stage's actor (jobs/rerank.LLMReranker), in-process, with the
    ctranslate2 entry: PRP over two queries' candidates gives the order, calls and counts
    that pairwise_rerank gives when the reference answers and llm-rankers reads them (the
    tiny model answers "Passage B" to every pair, so the order is the first stage's; the
    swaps are tests/unit/test_rerank.py's); a rerun answers from the generation cache.
    Listwise windows too long for the encoder are shrunk to fit (rank_llm's fit)."""
    from xling.core.llm import engine_spec, parse_llm_spec
    from xling.jobs.rerank import LLMReranker
    from xling.tasks.rerank import Candidates, pairwise_rerank

    spec = parse_llm_spec({"backend": "ctranslate2", "model": tiny_models["aya_ct2"],
                           "max_model_len": 640})
    queries = {f"q{i}": (TOPICS[i], [f"d{(i + k) % len(PASSAGES)}" for k in range(6)])
               for i in range(2)}
    texts = {f"d{k}": p for k, p in enumerate(PASSAGES)}
    rows = [{"_rid": q, "_shard": 0, "_cell": c, "query_id": q, "query": text,
             "doc_ids": docs, "texts": [texts[d] for d in docs], "missing": 0, "error": None}
            for c in (0, 1) for q, (text, docs) in queries.items()]
    call = {"depth": 5, "window": 4, "step": 2, "passes": 3, "doc_tokens": 60, "fit": "shrink",
            "prompt_style": "figure", "prp_answer": "passage_token", "prp_constrain": False,
            "prp_tail": "first_stage", "options": spec.call_options(),
            "encoder_decoder": spec.ENCODER_DECODER}
    calls = [{**call, "method": "pairwise", "system": "aya-prp",
              "sampling": {"temperature": 0.0, "max_tokens": 2}},
             {**call, "method": "listwise", "system": "aya-list",
              "sampling": {"temperature": 0.0, "max_tokens": 240}}]
    actor = LLMReranker(store_uri=str(tmp_path / "run"), engine=engine_spec(spec), cache=True,
                        env={}, cache_name=spec.model, calls=calls)
    out = actor._batch(pa.Table.from_pylist(rows)).to_pylist()

    def ranking(system, q):
        hits = sorted((r for r in out if r["system"] == system and r["query_id"] == q),
                      key=lambda r: r["rank"])
        return [r["doc_id"] for r in hits], hits[0]

    cands = [Candidates(q, text, docs[:5], actor.cached.engine.truncate(
        [texts[d] for d in docs[:5]], 60)) for q, (text, docs) in queries.items()]
    want = pairwise_rerank(cands, reference_complete(reference), passes=3,
                           parse=lambda t: {"Passage A": "A", "Passage B": "B"}.get(t))
    for res, (q, (_, docs)) in zip(want, queries.items()):
        order, top = ranking("aya-prp", q)
        assert order == res.doc_ids + docs[5:]
        assert top["llm_calls"] == res.calls > 0 and top["unparseable"] == 0
        assert top["failed_calls"] == 0 and top["llm_error"] is None
        order, top = ranking("aya-list", q)  # the tiny model names no passage: kept, counted
        assert order == docs and top["llm_calls"] == 2 and top["unparseable"] == 2
        assert top["failed_calls"] == 0
    # Windows longer than the encoder takes had their passages cut until they fitted.
    assert sum(ranking("aya-list", q)[1]["shrunk_windows"] for q in queries) >= 1
    # Every answer is now in the run store's generation cache: a new actor asks nothing.
    again = LLMReranker(store_uri=str(tmp_path / "run"), engine=engine_spec(spec), cache=True,
                        env={}, cache_name=spec.model, calls=calls)
    before = len(again.cached.known)
    assert again._batch(pa.Table.from_pylist(rows)).to_pylist() == out
    assert len(again.cached.known) == before > 0


def test_config_entry_conversion_and_defaults(tmp_path, monkeypatch, tiny_models):
    """A Transformers checkpoint is converted once into $XLING_CACHE/models/ct2/ before Ray
    starts; another backend's key or a missing directory is a config error; a pairwise run
    reads two tokens after the decoder prefix by default."""
    import pydantic

    from xling.config import load_config
    from xling.core.config import ConfigError
    from xling.core.engines.ctranslate2 import converted_dir
    from xling.core.llm import parse_llm_spec
    from xling.core.models import is_ct2_dir
    from xling.jobs.rerank import rerank_cells

    monkeypatch.setenv("XLING_CACHE", str(tmp_path / "cache"))
    spec = parse_llm_spec({"backend": "ctranslate2", "model": tiny_models["aya_hf"],
                           "quantization": "int8"})
    out = converted_dir(tiny_models["aya_hf"], "int8")
    assert str(out).startswith(str(tmp_path / "cache" / "models" / "ct2")) and not out.exists()
    said: list[str] = []
    spec.check("rerank.models[0]", said.append)
    assert is_ct2_dir(str(out)) and (out / "tokenizer.json").is_file()
    assert spec.engine_args()["model"] == str(out) and "converting" in said[0]
    spec.check("rerank.models[0]", said.append)  # converted once
    assert len(said) == 2
    with pytest.raises(pydantic.ValidationError, match="dtype is for backend vllm"):
        parse_llm_spec({"backend": "ctranslate2", "model": "x", "dtype": "float16"})
    with pytest.raises(ConfigError, match="does not exist"):
        parse_llm_spec({"backend": "ctranslate2", "model": "/no/such/aya"}).check("m")
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 2.0 bm25\nq1 Q0 d2 2 1.0 bm25\n")
    (tmp_path / "topics.tsv").write_text("q1\tquery\n")
    (tmp_path / "docs.jsonl").write_text('{"id": "d1", "contents": "a"}\n')
    (tmp_path / "c.yaml").write_text(f"""
name: aya
run_root: {tmp_path / "root"}
rerank:
  models:
    - {{name: aya-101, backend: ctranslate2, model: {tiny_models["aya_ct2"]}}}
  runs:
    - {{name: aya-prp, trec: {tmp_path / "run.trec"}, method: pairwise,
       topics: {{name: t, path: {tmp_path / "topics.tsv"}, langs: [en]}},
       corpus: {{name: c, format: jsonl, path: {tmp_path / "docs.jsonl"}, langs: [en]}}}}
""")
    [cell] = rerank_cells(load_config(tmp_path / "c.yaml"))
    assert cell.params["sampling"]["max_tokens"] == 2
    assert cell.params["model"]["backend"] == "ctranslate2"
