"""`features` stage: model-scored features of a study's generations -> scored rows.

One cell per (setting, language, scorer) of the scorers the study asks for
(`Featured.scorers`, xling/studies/base.py). A cell reads every model's generations of its (setting, language),
so a scorer that compares answers (the overlap features use the reference model's answer)
sees them all, and the study turns them into the scorer's inputs (`feature_inputs`):

    read   generations of every model -> input rows (premise/hypothesis pairs, query/passage
           pairs, texts, pointwise LLM prompts, or outputs with their labels)
    map    the scorer's actor pool: NLI classifier (actors/nli.py), cross-encoder
           (actors/cross_encoder.py), language id (actors/langid.py), an LLM through the
           generate machinery (cached like every generation), or the lexical metrics
    write  scored rows, committed shard by shard; the evaluate stage reduces them to one
           value per (lang, query, model, feature) with the study's formulas

Scores are stored raw (probabilities, logits, the judge's text), never reduced here, so a
formula option of the study (rounding, parse rules) changes no stored row.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from xling.core.config import ConfigError, NoHash, Parallelism, Strict, hashable
from xling.core.llm import LLMSpec, SamplingSpec, check_model, engine_params, generate_pool
from xling.core.models import resolve_model
from xling.core.pools import LIGHT_CPUS, actor_pool, pool_resources
from xling.core.cells import CELL, RID, Cell, Stage
from xling.core.status import part_files, read_rows
from xling.core.store import RunStore
from xling.jobs.study import study_generations, study_of
from xling.studies.base import Featured, StudyOptions
from xling.studies.registry import get_study

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `features:` section


class ScorerModel(Strict):
    """A small scoring model held by an actor pool."""

    model: str = Field(description="hub id, local path or tiny:<name>")
    batch_size: int = NoHash(32, ge=1, description="pairs per forward pass")
    max_length: int = Field(512, ge=8, description="tokens per (premise, hypothesis) pair")
    device: str = NoHash("auto", description="auto, cpu or cuda")
    # Pairs a call: each call is sorted by length and (FlagReranker) runs its first forward
    # batch twice, so calls of many forward batches cost less per pair. One thread, tiny
    # models: the cross-encoder took 14.6 s for 2,048 pairs in calls of 64 (Parallelism's
    # generic default), 8.1 s in calls of 256 and 6.4 s in calls of 1,024; NLI 49.0, 42.5
    # and 40.1 s for 1,024 pairs. benchmarks/features.py (2 CPUs, one actor): calls of 2,048
    # against 1,024 took the cross-encoder from 0.84 to 0.94 of bare FlagReranker's rate
    # (8,000 pairs; whole run 0.72 -> 0.79), NLI from 0.99 to 1.00 (2,000 pairs).
    parallel: Parallelism = NoHash(Parallelism(batch_size=2048))


class FeaturesConfig(Strict):
    """`features`: the models behind a study's model-scored features (MIRAGE-Bench §3)."""

    nli: ScorerModel = ScorerModel(
        model="MoritzLaurer/mDeBERTa-v3-base-xnli-multilingual-nli-2mil7")
    reranker: ScorerModel = ScorerModel(model="BAAI/bge-reranker-v2-m3")
    llm: LLMSpec | None = Field(None, description="the pointwise judge of the LLM features "
                                                  "(the paper: Llama-3-8B-Instruct)")
    sampling: SamplingSpec = SamplingSpec(temperature=0.1, max_tokens=512)
    cache: bool = NoHash(True, description="reuse stored LLM scores with the same key")
    shards: int = NoHash(4, ge=1, le=100_000, description="deterministic shards per cell")


FEATURE_ROWS = pa.schema([
    ("input_id", pa.string()), ("item_id", pa.string()), ("study", pa.string()),
    ("setting", pa.string()), ("lang", pa.string()), ("model", pa.string()),
    ("scorer", pa.string()), ("kind", pa.string()), ("scores", pa.string()),
    ("output", pa.string()), ("cached", pa.bool_()), ("error", pa.string())])
# each scorer's input columns (strings), beside input_id, item_id, model
INPUTS = {"lexical": ("output", "label", "qrels"), "langid": ("text",),
          "nli": ("docid", "premise", "hypothesis"), "reranker": ("query", "passage"),
          "llm": ("kind", "prompt")}
_EXTRA = (RID, "_shard", CELL)


class FeaturesStage(Stage):
    """Scores the study's generations with the study's scorers (a `Featured` study), through
    the Study interface."""

    name = "features"
    id_column = "input_id"

    def generation_cells(self, cfg: XlingConfig) -> list[Cell]:
        return study_generations(cfg)

    def study(self, cfg: XlingConfig) -> Featured:
        study = study_of(cfg)
        if not isinstance(study, Featured):
            raise ConfigError(f"features: study '{cfg.study.task}' scores no features; remove "
                              "the `features:` section")
        return study

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        study, opts, fc = self.study(cfg), cfg.study.options, cfg.features
        gens: dict[tuple[str, str], list[Cell]] = {}
        for g in self.generation_cells(cfg):
            gens.setdefault((g.key["setting"], g.key["lang"]), []).append(g)
        cells = []
        for (setting, lang), gs in gens.items():
            dirs = sorted(g.dir for g in gs)
            for scorer in study.scorers(opts):
                params = {"generations": dirs, "options": opts.as_options(), "scorer": scorer}
                if scorer in ("nli", "reranker"):
                    params["model"] = hashable(getattr(fc, scorer))
                elif scorer == "llm":
                    params["model"] = engine_params(fc.llm)
                    params["sampling"] = (fc.llm.sampling or fc.sampling).model_dump(mode="json")
                cells.append(Cell("features", {"study": cfg.study.task, "setting": setting,
                                               "lang": lang, "scorer": scorer}, params,
                                  inputs=dirs, n_shards=fc.shards))
        return cells

    def group(self, cell: Cell) -> str:
        return cell.key["scorer"]

    def pool_key(self, cell: Cell, cfg: XlingConfig) -> str:
        return ""  # map reads cell params and the scorer's model entry only

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        needed = {c.key["scorer"] for c in self.cells(cfg)}
        for s in ("nli", "reranker"):
            if s in needed:
                resolve_model(getattr(cfg.features, s).model, key=f"features.{s}.model")
        if "llm" in needed:
            if cfg.features.llm is None:
                raise_config(f"study '{cfg.study.task}' asks for LLM-scored features "
                             f"{self.study(cfg).llm_feature_names(cfg.study.options)}: set "
                             "features.llm (the "
                             "pointwise judge), or drop them from study.options.features")
            check_model(cfg.features.llm, "features.llm")

    def engines(self, cfg: XlingConfig) -> list:
        if cfg.features is None or cfg.features.llm is None:
            return []
        if all(c.key["scorer"] != "llm" for c in self.cells(cfg)):
            return []
        return [cfg.features.llm]

    def engine_of(self, cells: list[Cell], cfg: XlingConfig):
        return cfg.features.llm if cells[0].key["scorer"] == "llm" else None

    def resources(self, cells: list[Cell], cfg: XlingConfig) -> dict:
        scorer = cells[0].key["scorer"]
        if scorer in ("nli", "reranker"):
            return pool_resources(getattr(cfg.features, scorer).parallel)
        if scorer == "llm":
            return pool_resources(cfg.features.llm.parallel)
        return {"CPU": 1.0}

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        gens = read_rows(RunStore(cfg.run_root), cell.params["generations"],
                         ["item_id", "study", "setting", "lang", "model", "output", "error"],
                         f"features cell {cell.id}")
        scorer, lang = cell.key["scorer"], cell.key["lang"]
        study = self.study(cfg)
        rows = study.feature_inputs(study.options_of(cell.params), scorer, lang, gens)
        cols = ("input_id", "item_id", "model", *INPUTS[scorer])
        table = pa.table({c: pa.array([r.get(c) for r in rows], pa.string()) for c in cols})
        n = table.num_rows
        for c, v in (("study", cell.key["study"]), ("setting", cell.key["setting"]),
                     ("lang", lang), ("scorer", scorer)):
            table = table.append_column(c, pa.array([v] * n, pa.string()))
        table = table.append_column("error", pa.array([r.get("error") for r in rows],
                                                       pa.string()))
        return ray.data.from_arrow(table.append_column(RID, table["input_id"]))

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        scorer = cells[0].key["scorer"]
        fc = cfg.features
        if scorer == "lexical":
            return ds.map_batches(_lexical, batch_format="pyarrow", fn_kwargs={
                "study": cfg.study.task,
                "options": [self.study(cfg).options_of(c.params) for c in cells]})
        if scorer == "llm":
            spec = fc.llm
            ds = ds.map_batches(_as_prompts, batch_format="pyarrow", num_cpus=LIGHT_CPUS)
            ds = generate_pool(ds, cfg.run_root, {spec.label: spec},
                               [(spec.label, c.params["sampling"], "none") for c in cells],
                               cache=fc.cache, where="features.llm")
            kinds = self.study(cfg).llm_input_kinds(cfg.study.options)
            return ds.map_batches(_from_generations, batch_format="pyarrow", num_cpus=LIGHT_CPUS,
                                  fn_kwargs={"kinds": kinds})
        if scorer == "langid":
            langs = self.study(cfg).langid_langs(cfg.study.options)
            return ds.map_batches(_LangIdBatch, batch_format="pyarrow", batch_size=256,
                                  fn_constructor_kwargs={"langs": langs,
                                                         "backend": _langid_backend(cells[0])},
                                  compute=actor_pool(Parallelism(concurrency=(1, 1)),
                                                     key="features.langid"))
        spec = getattr(fc, scorer)
        if scorer == "nli":
            from xling.actors.nli import NLIScorer as actor
        else:
            from xling.actors.cross_encoder import CrossEncoderScorer as actor
        p = spec.parallel
        out = ds.map_batches(actor, batch_format="pyarrow", batch_size=p.batch_size,
                             fn_constructor_kwargs={
                                 "model": resolve_model(spec.model, key=f"features.{scorer}.model"),
                                 "device": None if spec.device == "auto" else spec.device,
                                 "batch_size": spec.batch_size,
                                 "max_length": spec.max_length},
                             compute=actor_pool(p, key=f"features.{scorer}.parallel"),
                             num_cpus=p.num_cpus, num_gpus=p.num_gpus)
        return out.map_batches(_scored, batch_format="pyarrow", num_cpus=LIGHT_CPUS,
                               fn_kwargs={"columns": {"nli": ("entailment", "neutral",
                                                              "contradiction"),
                                                      "reranker": ("score",)}[scorer]})

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        t = store.read_parquet(part_files(store, cell.dir), columns=["cached", "error"])
        out = {"scored": {"rows": t.num_rows,
                          "failed": int(pc.sum(pc.is_valid(t["error"])).as_py() or 0),
                          "from_cache": int(pc.sum(pc.equal(t["cached"], True)).as_py() or 0)}}
        if cell.key["scorer"] == "llm":  # e.g. MIRAGE's wording of features 10-11 (issue 45)
            study = self.study(cfg)
            out.update(study.llm_setting(study.options_of(cell.params)))
        if cell.key["scorer"] == "langid":  # which detector made features 1-2 (issue 27)
            from xling.tasks.text import backend_version

            backend = _langid_backend(cell)
            out["language_id"] = {"backend": backend, "version": backend_version(backend)}
        return out


def raise_config(msg: str):
    from xling.core.config import ConfigError

    raise ConfigError(msg)


def _rows(batch: pa.Table, scores: list, *, outputs=None, cached=None, errors=None,
          kinds=None) -> pa.Table:
    n = batch.num_rows
    cols = {c: batch[c] for c in ("input_id", "item_id", "study", "setting", "lang", "model",
                                  "scorer")}
    cols["kind"] = batch["kind"] if "kind" in batch.column_names and kinds is None else \
        pa.array(kinds or [None] * n, pa.string())
    cols["scores"] = pa.array([None if s is None else json.dumps(s, sort_keys=True)
                               for s in scores], pa.string())
    cols["output"] = pa.array(outputs or [None] * n, pa.string())
    cols["cached"] = pa.array(cached or [False] * n, pa.bool_())
    err = errors if errors is not None else batch["error"].to_pylist()
    cols["error"] = pa.array(err, pa.string())
    out = pa.table(cols, schema=FEATURE_ROWS)
    for c in _EXTRA:
        out = out.append_column(c, batch[c])
    return out


def _lexical(batch: pa.Table, *, study: str, options: list[StudyOptions]) -> pa.Table:
    featured = get_study(study)
    rows = batch.to_pylist()
    scores, errors = [], []
    for r in rows:
        if r["error"]:
            scores.append(None)
            errors.append(r["error"])
            continue
        try:
            scores.append(featured.lexical_scores(options[r[CELL]], [r])[0])
            errors.append(r["error"])
        except Exception as e:  # one bad answer is an error row, the cell goes on
            scores.append(None)
            errors.append(f"lexical features: {type(e).__name__}: {e}")
    return _rows(batch, scores, errors=errors)


def _langid_backend(cell: Cell) -> str:
    """The study's `language_id` option (MIRAGE: lingua, or langid.py as the paper's compat
    backend); lingua for a study without one."""
    return getattr(get_study(cell.key["study"]).options_of(cell.params), "language_id",
                   "lingua")


class _LangIdBatch:
    """Language-id probabilities (xling.tasks.text.LanguageID) over the study's languages
    the backend can identify: lingua restricted to them, or langid.py over all of its 97
    languages (as the MIRAGE paper ran it). A row in a language the backend cannot identify
    is an error row, not a probability of 0."""

    def __init__(self, langs: list[str], backend: str = "lingua"):
        from xling.tasks.text import LanguageID, identifiable

        usable = identifiable(langs, backend)
        self.lacking = sorted(set(langs) - set(usable))
        self.backend = backend
        self.detector = LanguageID(usable, backend, restrict=backend == "lingua")

    def __call__(self, batch: pa.Table) -> pa.Table:
        probs = self.detector.probabilities(batch["text"].to_pylist())
        errors = []
        for e, p, lang in zip(batch["error"].to_pylist(), probs, batch["lang"].to_pylist()):
            if e is None and lang in self.lacking:
                e = (f"language ID: {self.backend} cannot identify {lang!r} "
                     f"({self.detector.fingerprint}); use language_id: lingua")
            errors.append(e or (None if p is not None else "no text to identify"))
        return _rows(batch, probs, errors=errors)


def _scored(batch: pa.Table, *, columns: tuple[str, ...]) -> pa.Table:
    vals = {c: batch[c].to_pylist() for c in columns}
    scores = [None if any(vals[c][i] is None for c in columns) else
              {c: float(vals[c][i]) for c in columns} for i in range(batch.num_rows)]
    return _rows(batch, scores)


def _as_prompts(batch: pa.Table) -> pa.Table:
    # generate_pool's rows: item_id is the input id, the prompt one user message
    prompts = [json.dumps([{"role": "user", "content": p}], ensure_ascii=False)
               if p is not None else None for p in batch["prompt"].to_pylist()]
    keep = batch.drop_columns(["prompt", "item_id"])
    return keep.append_column("item_id", batch["input_id"]).append_column(
        "prompt", pa.array(prompts, pa.string()))


def _from_generations(batch: pa.Table, *, kinds: dict[str, str]) -> pa.Table:
    ids = batch["item_id"].to_pylist()  # input ids: query|model|kind
    parts = [i.rsplit("|", 2) for i in ids]
    t = pa.table({"input_id": ids, "item_id": [p[0] for p in parts],
                  "study": batch["study"], "setting": batch["setting"], "lang": batch["lang"],
                  "model": [p[1] for p in parts], "scorer": ["llm"] * len(ids),
                  "error": batch["error"], **{c: batch[c] for c in _EXTRA}})
    return _rows(t, [None] * len(ids), outputs=batch["output"].to_pylist(),
                 cached=batch["cached"].to_pylist(), kinds=[kinds.get(p[2]) for p in parts])
