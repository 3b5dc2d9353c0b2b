"""`nuggets` stage: nugget and citation-support evaluation of a study's answers, the way TREC
RAG 2024/2025 (castorini's nuggetizer) and RAGTIME (Auto-ARGUE) score them.

Two kinds of cells, in the stage's folder:

    create  one cell per (study, language, judge LLM): one row per topic, its nuggets
            created over windows of the topic's judged documents and labelled vital/okay
            (tasks/nuggets.py). Its id depends on the topics and the judge, never on the
            systems: every system's answers reuse it.
    assign  one cell per generate cell (a system's answers in one language), made after
            the create cells (`after_run`): one row per answer, each nugget's support by the
            answer, and, when asked, TREC 2024 support (Full/Partial/No) and ARGUE's
            attestation of each cited document.

    read   create: the study's topics (a `Cited` study); assign: the generations, the
           committed nuggets of their language and the topics' documents
    map    NuggetWorker actors (core/llm.StoreLLM): each row runs the nuggetizer's calls
           in order, each through the run store's LLM cache, so a killed cell's rerun
           replays the calls it made and asks only the rest
    write  the runner commits rows shard by shard

The scores (tasks/nugget_scores.py) are computed by the evaluate stage's study cell
(`nugget_results`), beside the study's own metrics.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from xling.actors.llm import Sampling
from xling.core.cells import CELL, RID, Cell
from xling.core.config import ConfigError, NoHash, Strict
from xling.core.llm import (LLMSpec, LLMStage, SamplingSpec, StoreLLM, check_model,
                            engine_params, llm_pool, sampling_of)
from xling.core.status import part_files, read_rows
from xling.core.store import RunStore
from xling.jobs.study import (retrieval_cells, retrieved_documents, study_generations,
                              study_of)
from xling.studies.base import Cited, Retrieving, StudyInputs
from xling.studies.registry import get_study
from xling.tasks import nuggets as nz

if TYPE_CHECKING:
    from xling.config import XlingConfig


class NuggetsConfig(Strict):
    """`nuggets`: nugget evaluation of the study's answers (TREC RAG's AutoNuggetizer) and,
    with `support`, citation checks (TREC 2024 support, RAGTIME's attestation). Defaults
    are castorini/nuggetizer's."""

    judge: LLMSpec = Field(description="the LLM that creates, scores and assigns nuggets "
                                       "(the tracks used GPT-4o)")
    sampling: SamplingSpec = SamplingSpec(temperature=0.0, max_tokens=4096)
    window: int = Field(10, ge=1, description="documents / nuggets per call")
    max_nuggets: int = Field(30, ge=1, description="the list is cut to this after each "
                                                   "creation window (the prompt always says 30)")
    max_tries: int = Field(nz.MAX_TRIALS, ge=1, description="calls per window until a reply "
                                                            "parses (then an error row)")
    grades: Literal[2, 3] = Field(3, description="3: support/partial_support/not_support")
    compat: Literal["nuggetizer", "paper"] = Field(
        "nuggetizer", description="paper: keep the first 20 nuggets, vital first")
    min_judgment: int | None = Field(
        1, description="documents whose human label is at least this make the nuggets "
                       "(None: every document the answers were given)")
    support: list[Literal["trec24", "argue"]] = Field(
        default_factory=list, description="citation checks: trec24 (Full/Partial/No per "
                                          "sentence and citation), argue (attestation)")
    max_citations: int = Field(3, ge=1, description="citations judged per sentence (SUP24)")
    cache: bool = NoHash(True, description="reuse stored completions with the same key")
    shards: int = NoHash(1, ge=1, le=100_000, description="deterministic shards per cell")

    def knobs(self) -> dict:
        return asdict(nz.Knobs(window=self.window, max_nuggets=self.max_nuggets,
                               max_tries=self.max_tries, grades=self.grades,
                               compat=self.compat, max_citations=self.max_citations))


NUGGET_ROWS = pa.schema([
    ("item_id", pa.string()), ("study", pa.string()), ("setting", pa.string()),
    ("lang", pa.string()), ("system", pa.string()), ("step", pa.string()),
    ("query", pa.string()), ("nuggets", pa.string()), ("sentences", pa.string()),
    ("support", pa.string()), ("attest", pa.string()), ("n_calls", pa.int64()),
    ("n_cached", pa.int64()), ("trace", pa.string()), ("error", pa.string())])


def cited_study(cfg: XlingConfig) -> Cited:
    study = get_study(cfg.study.task)
    if not isinstance(study, Cited):
        raise ConfigError(f"nuggets: study '{cfg.study.task}' has no documents to make "
                          "nuggets from (no Cited capability); remove the `nuggets:` section")
    return study


class NuggetStage(LLMStage):
    """The create cells; `after_run` runs the assign cells (AssignStage). The answers it
    judges are the study's generations; it reaches the study through the Study interface
    (a `Cited` study, and a `Retrieving` one's documents)."""

    name = "nuggets"
    label_key = "judge"
    after_label = "nugget assignments"

    def generation_cells(self, cfg: XlingConfig) -> list[Cell]:
        return study_generations(cfg)

    def topic_inputs(self, cfg: XlingConfig, lang: str) -> StudyInputs:
        """What the study's topics are built from beside its own files: a `Retrieving`
        study's documents."""
        study = study_of(cfg)
        if not isinstance(study, Retrieving):
            return StudyInputs()
        return StudyInputs(retrieved=retrieved_documents(
            cfg, study.retrieval(cfg.study.options)))

    def topic_input_dirs(self, cfg: XlingConfig) -> list[str]:
        """The cells `topic_inputs` reads (the plan's edges)."""
        study = study_of(cfg)
        if not isinstance(study, Retrieving):
            return []
        return [c.dir for c in retrieval_cells(cfg, study.retrieval(cfg.study.options))]

    def assign_stage(self) -> "AssignStage":
        stage = AssignStage()
        stage.parent = self
        return stage

    def entries(self, cfg: XlingConfig) -> list:
        return [cfg.nuggets.judge]

    def _params(self, cfg: XlingConfig, step: str) -> dict:
        nc = cfg.nuggets
        return {"step": step, "model": engine_params(nc.judge),
                "sampling": sampling_of(nc.judge, nc.sampling).as_dict(), "knobs": nc.knobs()}

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        study = cited_study(cfg)
        opts = cfg.study.options
        params = {**self._params(cfg, "create"), "topics": study.nugget_options(opts),
                  "min_judgment": cfg.nuggets.min_judgment}
        return [Cell("nuggets", {"study": cfg.study.task, "lang": lang, "step": "create",
                                 "judge": cfg.nuggets.judge.label}, params,
                     inputs=[*study.input_files(opts), *self.topic_input_dirs(cfg)],
                     n_shards=cfg.nuggets.shards)
                for lang in dict.fromkeys(c.key["lang"] for c in self.generation_cells(cfg))]

    def all_cells(self, cfg: XlingConfig) -> list[Cell]:
        return [*self.cells(cfg), *self.assign_stage().cells(cfg)]

    def after_run(self, cfg: XlingConfig, runner) -> None:
        runner.run(self.assign_stage(), cfg)

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        check_model(cfg.nuggets.judge, "nuggets.judge")

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        study = cited_study(cfg)
        rows = []
        for t in study.nugget_topics(cfg.study.options, cell.key["lang"],
                                     self.topic_inputs(cfg, cell.key["lang"])):
            docs = [d["text"] for d in t["documents"] if _kept(d, cell.params["min_judgment"])]
            error = t.get("error") or (None if docs else "no judged document to make "
                                       "nuggets from")
            rows.append(_row(t["topic_id"], cell, step="create", query=t["query"],
                             payload={"documents": docs}, error=error))
        return ray.data.from_arrow(_table(rows))

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        spec = cfg.nuggets.judge
        pool, actor = llm_pool(spec, cfg.run_root, cache=cfg.nuggets.cache,
                               key="nuggets.judge.parallel")
        return ds.map_batches(
            NuggetWorker, batch_format="pyarrow", **pool,
            fn_constructor_kwargs=dict(
                **actor, options=spec.call_options(),
                calls=[{"sampling": c.params["sampling"], "knobs": c.params["knobs"],
                        "support": c.params.get("support", [])} for c in cells]))

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        t = store.read_parquet(part_files(store, cell.dir),
                               columns=["nuggets", "n_calls", "n_cached", "error"])
        n = [len(json.loads(x)) for x in t["nuggets"].to_pylist() if x]
        return {"nuggets": {"rows": t.num_rows, "nuggets": sum(n),
                            "errors": int(pc.sum(pc.is_valid(t["error"])).as_py() or 0),
                            "calls": int(pc.sum(t["n_calls"]).as_py() or 0),
                            "asked": int(pc.sum(t["n_calls"]).as_py() or 0)
                            - int(pc.sum(t["n_cached"]).as_py() or 0)}}


class AssignStage(NuggetStage):
    """The assign cells: one per generate cell of the study (made by `assign_stage`, which
    gives it the create stage's generation cells)."""

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        created = {c.key["lang"]: c for c in self.parent.cells(cfg)}
        out = []
        for g in self.generation_cells(cfg):
            nug = created[g.key["lang"]]
            params = {**self._params(cfg, "assign"), "nuggets": nug.dir, "generation": g.dir,
                      "support": list(cfg.nuggets.support)}
            out.append(Cell("nuggets", {"study": cfg.study.task, "setting": g.key["setting"],
                                        "lang": g.key["lang"], "system": g.key["model"],
                                        "step": "assign", "judge": cfg.nuggets.judge.label},
                            params, inputs=[g.dir, nug.dir], n_shards=cfg.nuggets.shards))
        return out

    parent: NuggetStage

    def generation_cells(self, cfg: XlingConfig) -> list[Cell]:
        return self.parent.generation_cells(cfg)

    def all_cells(self, cfg: XlingConfig) -> list[Cell]:
        return self.cells(cfg)

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        """The counts, and the answers as a RAGTIME run file (`run.ragtime.jsonl`, one line
        per topic), checked as the track's validator checks it."""
        from xling.tasks.ragruns import check_ragtime, ragtime_line

        out = super().finalize(cell, cfg, store)
        t = store.read_parquet(part_files(store, cell.dir), columns=["item_id", "sentences"])
        lines = [json.dumps(ragtime_line("xling", cell.key["system"], r["item_id"],
                                         json.loads(r["sentences"])), ensure_ascii=False)
                 for r in sorted(t.to_pylist(), key=lambda r: r["item_id"]) if r["sentences"]]
        store.write_bytes(f"{cell.dir}/run.ragtime.jsonl", "".join(
            f"{line}\n" for line in lines).encode())
        errors = check_ragtime(lines)
        out["ragtime_run"] = {"file": "run.ragtime.jsonl", "topics": len(lines),
                              "valid": not errors, "errors": errors[:5]}
        return out

    def after_run(self, cfg: XlingConfig, runner) -> None:
        return None

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        study = cited_study(cfg)
        opts = cfg.study.options
        store = RunStore(cfg.run_root)
        topics = {t["topic_id"]: t for t in study.nugget_topics(
            opts, cell.key["lang"], self.parent.topic_inputs(cfg, cell.key["lang"]))}
        made = {r["item_id"]: r for r in read_rows(store, [cell.params["nuggets"]],
                                                   ["item_id", "nuggets", "error"],
                                                   f"nuggets cell {cell.id}")}
        gens = read_rows(store, [cell.params["generation"]],
                         ["item_id", "setting", "lang", "model", "parsed", "output",
                          "error"],
                         f"nuggets cell {cell.id}")
        rows = []
        for g in gens:
            tid, topic, nug = str(g["item_id"]), topics.get(str(g["item_id"])), \
                made.get(str(g["item_id"]))
            error = (f"generation failed: {g['error']}" if g["error"] and not g["output"]
                     else "no such topic" if topic is None
                     else f"no nuggets: {nug['error']}" if nug is None or nug["error"]
                     else None)
            sents = study.cited_answer(opts, g) if error is None else []
            cited = {c for s in sents for c in s["citations"]}
            docs = {d["docid"]: {"title": d.get("title"), "text": d["text"],
                                 "judgment": d.get("judgment")}
                    for d in (topic or {}).get("documents", []) if d["docid"] in cited}
            rows.append(_row(tid, cell, step="assign", query=topic["query"] if topic else None,
                             payload={"nuggets": json.loads(nug["nuggets"]) if not error else [],
                                      "sentences": sents, "docs": docs}, error=error))
        return ray.data.from_arrow(_table(rows))


def _kept(doc: dict, min_judgment: int | None) -> bool:
    """NZ's relevance filter (cli/adapters.py, spec D3): a document without a label is
    kept; one with a label needs at least `min_judgment`."""
    j = doc.get("judgment")
    return min_judgment is None or j is None or j >= min_judgment


def _row(item_id: str, cell: Cell, *, step: str, query: str | None, payload: dict,
         error: str | None) -> dict:
    return {"item_id": item_id, "study": cell.key["study"], "setting": cell.key.get("setting"),
            "lang": cell.key["lang"], "system": cell.key.get("system"), "step": step,
            "query": query, "payload": json.dumps(payload, ensure_ascii=False), "error": error,
            RID: item_id}


def _table(rows: list[dict]) -> pa.Table:
    schema = pa.schema([(n, pa.string()) for n in ("item_id", "study", "setting", "lang",
                                                     "system", "step", "query", "payload",
                                                     "error", RID)])
    return pa.Table.from_pylist(rows, schema=schema)


class NuggetWorker(StoreLLM):
    """Ray Data actor: topic rows (create) or answer rows (assign) -> NUGGET_ROWS. The rows
    of a batch run at once (their calls share the engine's batching); within a row the
    calls run in the nuggetizer's order."""

    def __init__(self, *, calls: list[dict], options: dict, **kw):
        super().__init__(**kw)
        self.calls, self.options = calls, options

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        out = await asyncio.gather(*(self._row(r) for r in rows))
        schema = NUGGET_ROWS.append(pa.field(RID, pa.string())).append(
            pa.field("_shard", pa.int64())).append(pa.field(CELL, pa.int64()))
        return pa.Table.from_pylist(out, schema=schema)

    def _ask(self, sampling: Sampling):
        async def ask(chat, attempt, temperature):
            s = sampling if temperature is None else replace(
                sampling, temperature=temperature, seed=attempt or sampling.seed)
            done, cached, _ = await self.cached.acomplete([chat], s, **self.options)
            return nz.Reply(done[0].text, done[0].error, cached[0])
        return ask

    async def _row(self, r: dict) -> dict:
        call = self.calls[r[CELL]]
        knobs = nz.Knobs(**call["knobs"])
        ask = self._ask(Sampling(**call["sampling"]))
        payload = json.loads(r["payload"])
        trace = nz.Trace()
        out = {k: r[k] for k in ("item_id", "study", "setting", "lang", "system", "step",
                                 "query", "error", RID, "_shard", CELL)}
        out.update(nuggets=None, sentences=None, support=None, attest=None)
        if r["error"] is None:
            try:
                if r["step"] == "create":
                    texts = await nz.create(ask, r["query"], payload["documents"], knobs, trace)
                    out["nuggets"] = await nz.score(ask, r["query"], texts, knobs, trace)
                else:
                    sents = payload["sentences"]
                    answer = " ".join(s["text"] for s in sents)  # NZ: citations left out
                    out["nuggets"], out["error"] = await nz.assign(
                        ask, r["query"], answer, payload["nuggets"], knobs, trace)
                    out["sentences"] = sents
                    for kind, key in (("trec24", "support"), ("argue", "attest")):
                        if kind in call["support"]:
                            out[key] = await nz.support(ask, sents, payload["docs"], knobs,
                                                        trace, argue=kind == "argue")
            except nz.Failed as e:
                out["error"] = str(e)
        for key in ("nuggets", "sentences", "support", "attest"):
            if out[key] is not None:
                out[key] = json.dumps(out[key], ensure_ascii=False)
        out.update(n_calls=len(trace.calls), n_cached=sum(c["cached"] for c in trace.calls),
                   trace=json.dumps(trace.calls, ensure_ascii=False))
        return out
