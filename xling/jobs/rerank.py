"""`rerank` stage: LLM reranking of first-stage runs, listwise or pairwise (tasks/rerank.py).

One cell per rerank run x input cell: each retrieve cell of the run or fusion named by
`input` (same topics, query language and document language), or one cell for a TREC run
file. The input of a cell is one row per query: the query text and its top `depth`
candidates with their passage texts. `texts` chooses those texts independently of the
first stage (LLM-CLIR's OG / DT reranking, Figure 1): `og` the original documents, `dt` the
translate stage's translations into the query language, `index` (default) the texts of the
index the first stage searched; for a TREC file, `og`/`index` its `corpus:` and `dt` the
corpus's translations, looked up by doc id. PRP answers with one token after " Passage:"
by default (the paper's llm-rankers), or by free generation (`prp_answer: generate`). So BM25 over DT can be reranked on the original texts and a
dense run over the originals on the DT texts (LLM-CLIR Tables 2-7, rows "(OG)" / "(DT)").

    read   hits + queries + passage texts -> one row per query (driver-side join)
    map    LLMReranker actors: a batch of queries reranked in lockstep, every LLM call one
           batch over all of them; answers go through the generation cache (core/llm.py)
    write  hits rows (the new order, then the unreranked tail), per-query call counts;
           `run.trec` per cell

Why not `ray.data.llm`'s processor: its unit is one row -> one generation, while a query's
next window (or bubble-sort step) depends on the previous answer, so the algorithm must
hold control between calls (docs/design.md).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from xling.actors.llm import Sampling
from xling.core.config import NoHash, Strict, hashable
from xling.core.llm import (
    BATCHES_IN_FLIGHT,
    LLMSpec,
    SamplingSpec,
    StoreLLM,
    actor_env,
    check_model,
    engine_group,
    engine_params,
    engine_spec,
    num_gpus,
    sampling_of,
)
from xling.core.pools import actor_pool, pool_resources
from xling.core import upstream
from xling.core.config import ConfigError
from xling.core.engines import spec_classes
from xling.core.hosts import shared_hosts
from xling.core.cells import RID, Cell, StageFailed
from xling.core.status import part_files, read_cell
from xling.core.runs import RunStage, export_trec, searched_collections
from xling.core.sources import (CorpusSpec, TopicSpec, passage_texts, read_documents,
                                read_queries, read_translations, spec_files, topic_files,
                                translations_as_documents)
from xling.core.store import RunStore
from xling.tasks.rerank import (DECODER_PREFIX, PASSAGE_PREFIX, Candidates, fit_listwise,
                                listwise_rerank, pairwise_prompt, pairwise_rerank, parse_choice,
                                parse_decoded_passage, parse_passage_token)

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `rerank:` section


class RerankRun(Strict):
    """An LLM reranking of a first-stage run: the retrieve stage's run or fusion named by
    `input`, or a TREC run file (`trec`, with `topics` and `corpus` for the texts)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    model: str | None = Field(
        None, json_schema_extra={"hash": "if_set"},
        description="the rerank.models entry (its `name`, or its `model`) that reranks; "
                    "needed when rerank.models has several")
    input: str | None = Field(None, description="a retrieve.runs (native or imported with "
                                                "`trec:`) or retrieve.fusion name")
    trec: str | None = Field(None, description="a TREC run file made elsewhere")
    topics: TopicSpec | None = Field(None, description="with trec: the queries' file")
    corpus: CorpusSpec | None = Field(None, description="with trec: the documents' file")
    method: Literal["listwise", "pairwise"] = "listwise"
    depth: int = Field(100, ge=2, le=1000, description="first-stage hits reranked; the rest "
                                                       "keep their order below them")
    window: int = Field(20, ge=2, description="listwise window (RankGPT: 20)")
    step: int = Field(10, ge=1, description="listwise step (RankGPT: 10)")
    passes: int = Field(10, ge=1, description="pairwise bubble-sort passes = top-k sorted")
    doc_tokens: int = Field(128, ge=8, description="passages truncated to this many tokens "
                                                   "(LLM-CLIR: 64, 128 or 256)")
    texts: Literal["index", "og", "dt"] = Field(
        "index", description="passage texts shown to the LLM: og = original documents, dt = the "
        "translate stage's translations into the query language (LLM-CLIR's OG / DT "
        "reranking), index = those of the index the first stage searched (with `trec`: og "
        "and index = the `corpus:` documents, dt = their translations, looked up by id)")
    translations: str | None = Field(
        None, json_schema_extra={"hash": "if_set"},
        description="with trec and texts: dt: the translate.documents entry whose "
                    "translations into the query language are the passages (default: the "
                    "corpus's name)")
    fit: Literal["shrink", "engine"] = Field(
        "shrink", description="listwise: a window longer than the context has its passages "
        "cut further until it fits, as rank_llm does (vllm and ctranslate2: it needs the "
        "tokenizer); engine = leave it to model.too_long")
    prompt_style: Literal["figure", "llm_rankers"] = Field(
        "figure", description="pairwise prompt: LLM-CLIR Figure 4 verbatim, or llm-rankers' "
        "character-exact variant (quoted query and passages)")
    prp_answer: Literal["passage_token", "generate"] = Field(
        "passage_token", description="pairwise answers: passage_token (the default) = the "
        "paper's PRP in llm-rankers (llm-clir.txt L105, L414): the chat prompt continued by "
        "' Passage:' and one token, read as A or B (a backend that continues prompts: vLLM; "
        "ctranslate2's encoder-decoders continue the decoder's 'Passage' by two tokens, "
        "llm-rankers' T5 way); "
        "generate = free generation of up to 8 tokens, 'Passage A/B' found by a regex (any "
        "backend)")
    prp_constrain: bool = Field(False, description="with passage_token: allow only the tokens A "
                                                   "and B (vLLM allowed_token_ids; ctranslate2: "
                                                   "the better scored of the two); llm-rankers "
                                                   "does not")
    prp_tail: Literal["first_stage", "bubble"] = Field(
        "first_stage", description="pairwise: below the sorted top-`passes`, candidates keep "
        "their first-stage order (llm-rankers) or the order the bubble passes left them")

    @model_validator(mode="after")
    def _source(self) -> "RerankRun":
        if (self.input is None) == (self.trec is None):
            raise ValueError(f"rerank run '{self.name}': give exactly one of `input` (a retrieve "
                             "run) or `trec` (a run file)")
        if self.trec is not None and (self.topics is None or self.corpus is None):
            raise ValueError(f"rerank run '{self.name}': a `trec` input needs `topics:` and "
                             "`corpus:` for the query and passage texts")
        if self.translations is not None and (self.trec is None or self.texts != "dt"):
            raise ValueError(f"rerank run '{self.name}': `translations` names the DT texts of a "
                             "`trec` input with texts: dt; a retrieve run's DT texts are those "
                             "of the collections it searched")
        if self.step > self.window:
            raise ValueError(f"rerank run '{self.name}': step {self.step} > window {self.window} "
                             "would skip passages")
        return self


class RerankConfig(Strict):
    """`rerank`: listwise (RankGPT/RankZephyr) or pairwise (PRP) LLM reranking of runs, by
    one model (`model:`) or several (`models:`, each run naming its own)."""

    model: LLMSpec | None = Field(None, description="the one reranking model (or `models:`)")
    models: list[LLMSpec] | None = Field(
        None, description="several reranking models, each one engine loaded once for all its "
                          "runs; each run names its entry with `model:`")
    sampling: SamplingSpec | None = Field(
        None, description="default: greedy, max_tokens 8 (pairwise) or 6 x window (listwise)")
    runs: list[RerankRun] = Field(min_length=1)
    cache: bool = NoHash(True, description="reuse stored LLM answers with the same key")
    shards: int = NoHash(4, ge=1, le=100_000, description="query shards per cell")
    batch_queries: int = NoHash(64, ge=1, description="queries advancing in lockstep per "
                                                     "actor call (each LLM call batches them)")

    @model_validator(mode="after")
    def _models(self) -> "RerankConfig":
        if (self.model is None) == (self.models is None):
            raise ValueError("rerank: give `model:` (one reranker) or `models:` (a list), "
                             "not both and not neither")
        labels = [m.label for m in self.entries]
        dup = sorted({n for n in labels if labels.count(n) > 1})
        if dup:
            raise ValueError(f"rerank.models: {dup} repeat: give each entry its own `name:`")
        for i, run in enumerate(self.runs):
            if run.model is None and len(labels) > 1:
                raise ValueError(f"rerank.runs[{i}] ('{run.name}'): rerank.models has "
                                 f"{labels}: name the one that reranks with `model:`")
            if run.model is not None and run.model not in labels:
                raise ValueError(f"rerank.runs[{i}] ('{run.name}'): model '{run.model}' is not "
                                 f"a rerank model entry (known: {labels})")
        names = [r.name for r in self.runs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rerank.runs: names must be unique, {dup} repeat")
        return self

    @property
    def entries(self) -> list[LLMSpec]:
        """Every model entry, in the config's order (`model:` is a list of one)."""
        return [self.model] if self.model is not None else list(self.models)

    def model_of(self, run: RerankRun) -> LLMSpec:
        """The entry that reranks a run: the one it names, or the only one."""
        return next(m for m in self.entries if run.model in (None, m.label))

    def key_of(self, i: int) -> str:
        return "rerank.model" if self.model is not None else f"rerank.models[{i}]"


HITS = pa.schema([("query_id", pa.string()), ("doc_id", pa.string()), ("rank", pa.int64()),
                  ("score", pa.float64()), ("system", pa.string()), ("reranked", pa.bool_()),
                  ("llm_calls", pa.int64()), ("reused_pairs", pa.int64()),
                  ("malformed", pa.int64()), ("unparseable", pa.int64()),
                  ("failed_calls", pa.int64()), ("missing_texts", pa.int64()),
                  ("shrunk_windows", pa.int64()),
                  ("llm_error", pa.string()), ("error", pa.string())])


def default_sampling(run: RerankRun, spec) -> SamplingSpec:
    # "[12] > " is ~5 tokens; a listwise answer names `window` ids. PRP answers "Passage A",
    # or, continuing " Passage:", one token (llm-rankers' max_new_tokens=1); an
    # encoder-decoder continues its decoder's "Passage" by two (llm-rankers' T5: "A", </s>).
    if run.method == "listwise":
        return SamplingSpec(max_tokens=6 * run.window)
    if run.prp_answer == "passage_token":
        return SamplingSpec(max_tokens=2 if spec.ENCODER_DECODER else 1)
    return SamplingSpec(max_tokens=8)


def rerank_cells(cfg: XlingConfig) -> list[Cell]:
    rc = cfg.rerank
    runs = upstream.cells(cfg, "retrieve") if any(r.input for r in rc.runs) else []
    cells = []
    for run in rc.runs:
        spec = rc.model_of(run)
        sampling = sampling_of(spec, rc.sampling or default_sampling(run, spec)).as_dict()
        # The model is the params' `model` (so a one-model config keeps its cell hashes).
        method = {k: v for k, v in hashable(run).items() if k not in ("name", "input", "model")}
        params = {"method": method, "model": engine_params(spec), "sampling": sampling}
        if run.method == "pairwise" and run.prp_answer == "passage_token" \
                and not spec.CONTINUES_PROMPT:
            able = " or ".join(n for n, s in spec_classes().items() if s.CONTINUES_PROMPT)
            raise ConfigError(f"rerank run '{run.name}': prp_answer: passage_token (the default, "
                              f"the paper's one-token answer) continues the chat prompt by "
                              f"' Passage:', which needs backend: {able}; with backend "
                              f"{spec.backend} set prp_answer: generate (free generation)")
        if run.trec:
            dt = [c.dir for c in _trec_dt_cells(cfg, run)] if run.texts == "dt" else []
            cells.append(Cell("rerank", {"run": run.name}, {**params, "trec": run.trec},
                              inputs=[run.trec, *dt], n_shards=rc.shards))
            continue
        for up in runs:
            if up.key["run"] == run.input:
                inputs = [up.dir]
                if run.texts == "dt" and up.key["qlang"] != up.key["doc_lang"]:
                    inputs += [c.dir for c in _dt_cells(cfg, up, run.name)]
                cells.append(Cell("rerank", {**up.key, "run": run.name},
                                  {**params, "input": up.dir}, inputs=inputs,
                                  n_shards=rc.shards))
    return cells


def _dt_cells(cfg: XlingConfig, up: Cell, name: str) -> list[Cell]:
    """The translate cells that hold the DT texts of a retrieve cell's collections."""
    out = []
    for col in searched_collections(cfg, up):
        try:
            out.append(upstream.translation(cfg, "doc", col, up.key["doc_lang"],
                                            up.key["qlang"]))
        except StageFailed:
            raise ConfigError(
                f"rerank run '{name}': texts: dt reads the translate stage's translation of "
                f"'{col}' {up.key['doc_lang']}->{up.key['qlang']}, which the config does not "
                f"make: add {up.key['qlang']} to the targets of translate.documents '{col}'"
            ) from None
    return out


def _trec_dt_cells(cfg: XlingConfig, run: RerankRun) -> list[Cell]:
    """The translate cells holding the DT texts of a `trec` input's corpus: each corpus
    language translated into the query language, by the translate.documents entry
    `translations` (default: the corpus's name)."""
    source, qlang = run.translations or run.corpus.name, run.topics.langs[0]
    fix = (f"add translate.documents entry '{source}' (the corpus's documents) with targets "
           f"[{qlang}], or name the entry that has them in the run's `translations:`")
    if cfg.translate is None:
        raise ConfigError(f"rerank run '{run.name}': texts: dt reads the translate stage's "
                          f"translations of the corpus, and the config has no `translate:` "
                          f"section: {fix}")
    out = []
    for lang in run.corpus.langs:
        if lang == qlang:
            continue  # documents already in the query language are their own DT
        try:
            out.append(upstream.translation(cfg, "doc", source, lang, qlang))
        except StageFailed:
            raise ConfigError(f"rerank run '{run.name}': texts: dt needs the translation of "
                              f"'{source}' {lang}->{qlang}, which the config does not make: "
                              f"{fix}") from None
    return out


def _trec_texts(cfg: XlingConfig, run: RerankRun, store: RunStore) -> list:
    """The passages of a `trec` input as Ray Datasets of documents rows: the corpus (texts
    og / index), or for dt its translations into the query language, looked up by doc id
    (a corpus language that is the query language is read as it is)."""
    qlang = run.topics.langs[0]
    docs = [read_documents(run.corpus, l, spec_files(run.corpus, l, "rerank.corpus"))
            for l in run.corpus.langs if run.texts != "dt" or l == qlang]
    if run.texts == "dt":
        for dt in _trec_dt_cells(cfg, run):
            docs.append(read_translations(store, dt, f"rerank run '{run.name}' (texts: dt)")
                        .map_batches(translations_as_documents, batch_format="pyarrow"))
    return docs


class RerankStage(RunStage):
    name = "rerank"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        return rerank_cells(cfg)

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        for i, spec in enumerate(cfg.rerank.entries):
            check_model(spec, cfg.rerank.key_of(i))

    def group(self, cell: Cell) -> str:
        return engine_group(cell.params["model"])

    def pool_key(self, cell: Cell, cfg: XlingConfig) -> str:
        return ""  # map reads the run settings from cell params

    def resources(self, cells: list[Cell], cfg: XlingConfig) -> dict:
        spec = self.engine_of(cells, cfg)
        return pool_resources(spec.parallel, num_gpus(spec))

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        run = next(r for r in cfg.rerank.runs if r.name == cell.key["run"])
        store = RunStore(cfg.run_root)
        if run.trec:
            from xling.tasks.runs import read_trec_run

            with _open_text(run.trec) as f:
                hits = read_trec_run(f)
            lang = run.topics.langs[0]
            queries = read_queries(run.topics, lang, spec_files(run.topics, lang, "rerank.topics"))
            docs = _trec_texts(cfg, run, store)
        else:
            hits = read_cell(store, cell.params["input"],
                             columns=["query_id", "doc_id", "rank", "score", "error"])
            hits = hits.filter(pc.and_(pc.is_null(hits["error"]), pc.is_valid(hits["doc_id"])))
            queries, docs = _retrieve_sources(cfg, cell, run.texts)
        hits = hits.sort_by([("query_id", "ascending"), ("rank", "ascending")])
        texts = passage_texts(docs, set(hits["doc_id"].to_pylist()))
        qtext = {r["query_id"]: r["text"] for r in queries.take_all() if r.get("error") is None}
        rows: dict[str, dict] = {}
        for q in sorted(qtext):  # every query of the topics, hits or not
            rows[q] = {RID: q, "query_id": q, "query": qtext[q], "doc_ids": [], "texts": [],
                       "scores": [], "error": None}
        for q, d, s in zip(hits["query_id"].to_pylist(), hits["doc_id"].to_pylist(),
                           hits["score"].to_pylist()):
            r = rows.setdefault(q, {RID: q, "query_id": q, "query": None, "doc_ids": [],
                                    "texts": [], "scores": [], "error": None})
            r["doc_ids"].append(d)
            r["scores"].append(float(s))
            # A doc id the collection lacks is shown to the LLM as an empty passage (and so
            # sinks) rather than dropping the query from the run; counted in the manifest.
            r["texts"].append(texts.get(d, ""))
        for r in rows.values():
            r["missing"] = sum(d not in texts for d in r["doc_ids"][:run.depth])
            if r["query"] is None:
                r["error"] = "query text not found in the topics"
            elif not r["doc_ids"]:
                r["error"] = "the first-stage run has no hits for this query"
        if not rows:
            raise StageFailed(f"rerank {cell.id}: neither the topics nor the run have queries")
        return ray.data.from_items(list(rows.values()))

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        rc = cfg.rerank
        spec = self.engine_of(cells, cfg)
        # Per-cell settings come from the cell's params, so cells of a sweep's grid points
        # (say doc_tokens 64/128/256) share this pool: the model is loaded once. The cells of
        # one map share one model entry (their group is the model's engine).
        calls = [{**{k: c.params["method"][k] for k in ("method", "depth", "window", "step",
                                                       "passes", "doc_tokens", "fit",
                                                       "prompt_style", "prp_answer",
                                                       "prp_constrain", "prp_tail")},
                  "system": c.key["run"], "sampling": c.params["sampling"],
                  "options": spec.call_options(), "encoder_decoder": spec.ENCODER_DECODER}
                 for c in cells]
        p = spec.parallel
        hosts = shared_hosts(spec)
        if hosts:  # the engine lives in the run's hosts (core/hosts.py): the pool forwards
            import ray.data

            compute = ray.data.ActorPoolStrategy(size=len(hosts),
                                                 max_concurrent_calls_per_actor=BATCHES_IN_FLIGHT)
            resources = dict(num_cpus=0, num_gpus=0)
        else:
            where = rc.key_of(rc.entries.index(spec))
            compute = actor_pool(p, key=f"{where}.parallel", calls_per_actor=BATCHES_IN_FLIGHT)
            resources = dict(num_cpus=p.num_cpus, num_gpus=num_gpus(spec))
        return ds.map_batches(
            LLMReranker, batch_format="pyarrow", batch_size=rc.batch_queries,
            fn_constructor_kwargs=dict(store_uri=RunStore(cfg.run_root).uri,
                                       engine=engine_spec(spec), cache=rc.cache,
                                       env=actor_env(spec), cache_name=spec.model,
                                       calls=calls, hosts=hosts),
            compute=compute, **resources)

    def engines(self, cfg: XlingConfig) -> list:
        """The rerankers' engines, one per model entry a cell uses, shared with the run's
        other stages that load them."""
        used = {c.key["run"] for c in self.cells(cfg)}
        models = [cfg.rerank.model_of(r) for r in cfg.rerank.runs if r.name in used]
        return [m for m in cfg.rerank.entries if any(m is u for u in models)]

    def engine_of(self, cells: list[Cell], cfg: XlingConfig):
        """The model entry of a group's cells (a group is one model's engine)."""
        rc = cfg.rerank
        return rc.model_of(next(r for r in rc.runs if r.name == cells[0].key["run"]))

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        export_trec(store, cell)
        files = part_files(store, cell.dir)
        t = store.read_parquet(files).filter(pc.equal(pc.field("rank"), 1))
        totals = {k: int(pc.sum(t[k]).as_py() or 0) for k in
                  ("llm_calls", "reused_pairs", "malformed", "unparseable", "failed_calls",
                   "missing_texts", "shrunk_windows")}
        why = sorted({e for e in t["llm_error"].to_pylist() if e})
        if totals["failed_calls"]:
            print(f"[rerank] {cell.id}: {totals['failed_calls']} LLM calls failed, e.g. {why[0]}")
        return {"llm": {**totals, "queries": t.num_rows, "errors": why[:5]}, "trec": "run.trec"}


def _open_text(path: str):
    import io

    from xling.core.sources import _open

    with _open(path) as f:
        return io.StringIO(f.read().decode("utf-8"))


def _retrieve_sources(cfg: XlingConfig, cell: Cell, texts: str = "index"):
    """Queries and the passage texts: those of the index the input run searched (`index`;
    an imported run's: its collection's originals), the original documents (`og`), or their
    translations into the query language (`dt`)."""
    up = upstream.at(cfg, cell.params["input"])
    leaves = [upstream.at(cfg, d) for d in up.inputs] if "fusion" in up.params else [up]
    ts = next(t for t in cfg.retrieve.topics if t.name == up.key["topics"])
    ql, dl = up.key["qlang"], up.key["doc_lang"]
    queries = read_queries(ts, ql, topic_files(ts, ql, dl, "retrieve.topics"))
    if texts == "index":
        index_ids = {i for leaf in leaves for i in leaf.params.get("indexes", {}).values()}
        indexed = [upstream.cell(cfg, "index", i).key for i in sorted(index_ids)]
        docs = [upstream.documents(cfg, k["collection"], k["lang"], k["text_lang"])
                for k in indexed]
        imported = sorted({leaf.params["run"]["collection"].replace("{doc_lang}", dl)
                           for leaf in leaves if "trec" in leaf.params})
        docs += [upstream.documents(cfg, col, dl, dl) for col in imported]
    else:
        text_lang = dl if texts == "og" else ql
        docs = [upstream.documents(cfg, col, dl, text_lang)
                for col in searched_collections(cfg, up)]
    return queries, docs


class LLMReranker(StoreLLM):
    """Ray Data actor: query rows (with candidates) -> reranked hits rows."""

    def __init__(self, *, calls: list[dict], **kw):
        super().__init__(**kw)
        self.calls = calls

    async def __call__(self, batch: pa.Table) -> pa.Table:
        # The windows of one batch are asked in order, but batches run side by side, each on
        # its own thread (BATCHES_IN_FLIGHT), so the engine holds the requests of several.
        return await asyncio.to_thread(self._batch, batch)

    def _batch(self, batch: pa.Table) -> pa.Table:
        from xling.core.cells import CELL

        rows = batch.to_pylist()
        out = []
        for c in sorted({r[CELL] for r in rows}):
            group = [r for r in rows if r[CELL] == c]
            out += self._rerank(group, self.calls[c])
        return pa.Table.from_pylist(out, schema=HITS.append(pa.field(RID, pa.string()))
                                    .append(pa.field("_shard", pa.int64()))
                                    .append(pa.field(CELL, pa.int64())))

    def _rerank(self, rows: list[dict], call: dict) -> list[dict]:
        depth = call["depth"]
        good = [r for r in rows if r["error"] is None]
        engine = self.cached.engine
        cands = [Candidates(r["query_id"], r["query"], r["doc_ids"][:depth],
                            engine.truncate(r["texts"][:depth], call["doc_tokens"]))
                 for r in good]
        sampling = Sampling(**call["sampling"])
        options = dict(call["options"])
        token_answer = call["method"] == "pairwise" and call["prp_answer"] == "passage_token"
        seq2seq = call["encoder_decoder"]
        if token_answer:  # llm-rankers: " Passage:" after the chat template and one token;
            # a T5's decoder continues "Passage" by two
            options["prefix"] = DECODER_PREFIX if seq2seq else PASSAGE_PREFIX
            if call["prp_constrain"]:
                options["allowed"] = ["A", "B"]
        errors: list[str] = []

        def complete(prompts):
            done, _, _ = self.cached.complete(prompts, sampling, **options)
            errors.extend(c.error for c in done if c.error)
            return [c.text if c.error is None else None for c in done]

        if call["method"] == "listwise":
            fit = None
            if call["fit"] == "shrink" and hasattr(engine, "tokenize"):
                # A decoder's answer shares its context; an encoder-decoder's does not.
                budget = engine.max_model_len - (0 if seq2seq else sampling.max_tokens)

                def fit(query, passages):
                    return fit_listwise(query, passages, n_tokens=lambda p: len(engine.tokenize(p)),
                                        budget=budget, truncate=engine.truncate,
                                        limit=call["doc_tokens"])

            results = listwise_rerank(cands, complete, window=call["window"], step=call["step"],
                                      fit=fit)
        else:
            style = call["prompt_style"]
            results = pairwise_rerank(
                cands, complete, passes=call["passes"],
                prompt=lambda q, a, b: pairwise_prompt(q, a, b, style),
                parse=(parse_decoded_passage if seq2seq else parse_passage_token)
                if token_answer else parse_choice,
                restore_tail=call["prp_tail"] == "first_stage")
        by_query = {r.query_id: r for r in results}
        out = []
        for r in rows:
            base = {RID: r[RID], "_shard": r["_shard"], "_cell": r["_cell"],
                    "query_id": r["query_id"], "system": call["system"]}
            res = by_query.get(r["query_id"])
            if res is None:  # an input error: the first-stage order is kept, flagged
                out += [{**base, "doc_id": d, "rank": k + 1, "score": float(len(r["doc_ids"]) - k),
                         "reranked": False, "error": r["error"]}
                        for k, d in enumerate(r["doc_ids"])] or [
                    {**base, "doc_id": None, "rank": 1, "error": r["error"]}]
                continue
            order = res.doc_ids + r["doc_ids"][depth:]  # the tail keeps its first-stage order
            counts = {"llm_calls": res.calls, "reused_pairs": res.cached,
                      "malformed": res.malformed, "unparseable": res.unparseable,
                      "failed_calls": res.failed, "missing_texts": r["missing"],
                      "shrunk_windows": res.shrunk,
                      # why calls failed, once per batch (e.g. a window too long for the model)
                      "llm_error": errors[0] if res.failed and errors else None}
            for k, d in enumerate(order):
                out.append({**base, "doc_id": d, "rank": k + 1, "score": float(len(order) - k),
                            "reranked": k < depth, **(counts if k == 0 else {}), "error": None})
        return out

