"""`judge` stage: a panel of LLM judges over a study's generations -> judgments rows.

One cell per (generate cell, judge); or, for a study that judges pairs of systems (an arena,
a `PairJudged` study), one cell per (setting, language, judge) that sees every model's
generations and asks one prompt per pair (`pair_rows`). Judges are LLM entries like generate's models (vLLM or
an OpenAI-compatible endpoint, mixed freely); judges that load the same engine share one
actor pool, and every judgment is cached like a generation (core/llm.py), so adding a judge
to a panel or rerunning a killed job asks only what was not asked yet.

    read   the generate cell's rows -> judge prompts (the study's tasks/ module); a
           generation that failed becomes a judgment error row, not a call
    map    StoreGenerator actors (core/llm.py) with the `verdict` parser
           (tasks/judge.py), then the rows are renamed into judgments
    write  the runner commits judgments shard by shard

The vote (majority over the judges whose verdict parsed) and the language check happen
in the evaluate stage, which sees the whole panel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from xling.core.config import ConfigError, NoHash, Strict
from xling.core.pools import LIGHT_CPUS
from xling.core.llm import (
    LLMSpec,
    LLMStage,
    SamplingSpec,
    check_model,
    engine_params,
    generate_pool,
    sampling_of,
)
from xling.core.cells import CELL, RID, Cell
from xling.core.status import part_files, read_rows
from xling.core.store import RunStore
from xling.jobs.study import study_generations, study_of
from xling.studies.base import Judged, PairJudged, judge_scope
from xling.tasks.prompts import built_prompt_table

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `judge:` section


class JudgeConfig(Strict):
    """`judge`: a panel of LLM judges over the study's generations (vLLM and API judges can be
    mixed); the evaluate stage takes the majority vote over the judges whose verdict parsed,
    AND a lingua check of the answer's language."""

    judges: list[LLMSpec] = Field(min_length=1, description="the panel (XRAG uses 3)")
    sampling: SamplingSpec = SamplingSpec(temperature=0.0, max_tokens=256)
    language_check: bool = Field(True, description="lingua, restricted to the study's languages")
    cache: bool = NoHash(True, description="reuse stored judgments with the same key")
    shards: int = NoHash(4, ge=1, le=100_000, description="deterministic shards per cell")

    @model_validator(mode="after")
    def _names(self) -> "JudgeConfig":
        names = [m.label for m in self.judges]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"judge.judges: names must be unique, {dup} repeat (give each "
                             "judge its own `name:`)")
        return self



JUDGMENTS = pa.schema([
    ("item_id", pa.string()), ("study", pa.string()), ("setting", pa.string()),
    ("lang", pa.string()), ("model", pa.string()), ("model_b", pa.string()),
    ("judge", pa.string()), ("verdict", pa.string()), ("raw", pa.string()), ("prompt_hash", pa.string()),
    ("n_prompt_tokens", pa.int64()), ("n_output_tokens", pa.int64()), ("latency_s", pa.float64()),
    ("cached", pa.bool_()), ("attempts", pa.int64()), ("cache_key", pa.string()),
    ("error", pa.string())])


class JudgeStage(LLMStage):
    """Judges the study's generations with the study's judge prompts: each generation alone
    (`Judged`) or each pair of models on an item (`PairJudged`). It reaches the study only
    through the Study interface."""

    name = "judge"
    label_key = "judge"

    def generation_cells(self, cfg: XlingConfig) -> list[Cell]:
        return study_generations(cfg)

    def judged(self, cfg: XlingConfig) -> Judged | PairJudged:
        study = study_of(cfg)
        if not isinstance(study, (Judged, PairJudged)):
            raise ConfigError(f"judge: study '{cfg.study.task}' has no judge prompts; remove the "
                              "`judge:` section")
        return study

    def judge_rows(self, cfg: XlingConfig, cell: Cell, gens: list[dict]) -> list[dict]:
        study = self.judged(cfg)
        return study.judge_rows(study.options_of(cell.params), gens)

    def pair_rows(self, cfg: XlingConfig, cell: Cell, gens: list[dict]) -> list[dict]:
        study = self.judged(cfg)
        return study.pair_rows(study.options_of(cell.params), gens)

    def scope(self, cfg: XlingConfig) -> str:
        """"generation" (each generation judged alone) or "pairs" (pairs of models)."""
        return judge_scope(study_of(cfg))

    def parser(self, cfg: XlingConfig) -> str:
        return self.judged(cfg).judge_parser(cfg.study.options)

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        jc = cfg.judge
        groups: dict[tuple, list[Cell]] = {}
        pairs = self.scope(cfg) == "pairs"
        for g in self.generation_cells(cfg):
            if pairs:  # every model of the (setting, lang) in one cell
                key = {k: v for k, v in g.key.items() if k != "model"}
                groups.setdefault(tuple(key.items()), []).append(g)
            else:
                groups[(*g.key.items(), ("_", g.dir))] = [g]
        cells = []
        for gs in groups.values():
            dirs = sorted(g.dir for g in gs)
            key = gs[0].key if not pairs else {k: v for k, v in gs[0].key.items()
                                               if k != "model"}
            for spec in jc.judges:
                params = {"generation": dirs[0] if not pairs else dirs,
                          "model": engine_params(spec),
                          "sampling": sampling_of(spec, jc.sampling).as_dict(),
                          "options": cfg.study.options.as_options()}
                if pairs:
                    params.update(scope="pairs", parser=self.parser(cfg))
                cells.append(Cell("judge", {**key, "judge": spec.label}, params,
                                  inputs=dirs, n_shards=jc.shards))
        return cells

    def entries(self, cfg: XlingConfig) -> list:
        return cfg.judge.judges

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        for i, spec in enumerate(cfg.judge.judges):
            check_model(spec, f"judge.judges[{i}]")

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        gens = read_rows(RunStore(cfg.run_root), cell.inputs,
                         ["item_id", "study", "setting", "lang", "model", "parsed", "output",
                          "error"], f"judge cell {cell.id}")
        rows = self.pair_rows(cfg, cell, gens) if cell.params.get("scope") == "pairs" else \
            self.judge_rows(cfg, cell, gens)
        t = built_prompt_table(rows, where=cell.key["setting"])
        return ray.data.from_arrow(t.append_column(RID, t["item_id"]))

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        ds = generate_pool(ds, cfg.run_root, {s.label: s for s in cfg.judge.judges},
                           [(c.key["judge"], c.params["sampling"],
                             c.params.get("parser", "verdict")) for c in cells],
                           cache=cfg.judge.cache, where="judge.judges")
        return ds.map_batches(as_judgments, batch_format="pyarrow", num_cpus=LIGHT_CPUS,
                              fn_kwargs={"models": [c.key.get("model") for c in cells]})

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        files = part_files(store, cell.dir)
        t = store.read_parquet(files, columns=["verdict", "cached", "n_prompt_tokens",
                                               "n_output_tokens", "error"])
        verdicts = {"correct", "incorrect"} if self.scope(cfg) == "generation" else set()
        counts = {v: int(pc.sum(pc.equal(t["verdict"], v)).as_py() or 0)
                  for v in sorted(verdicts | set(t["verdict"].drop_null().to_pylist()))}
        return {"judgments": {**counts, "failed": int(pc.sum(pc.is_valid(t["error"])).as_py() or 0),
                              "from_cache": int(pc.sum(pc.equal(t["cached"], True)).as_py() or 0),
                              "prompt_tokens": int(pc.sum(t["n_prompt_tokens"]).as_py() or 0),
                              "output_tokens": int(pc.sum(t["n_output_tokens"]).as_py() or 0)}}


def as_judgments(batch: pa.Table, *, models: list[str | None]) -> pa.Table:
    """StoreGenerator's generations rows (model = the judge) -> judgments rows (model = the
    judged generator, judge = the judge). A pair's item id is `item|model_a|model_b` (the
    order shown to the judge): model = the one shown first, model_b the other."""
    rows = batch.to_pylist()
    out = []
    for r in rows:
        parsed = dict(r["parsed"]) if r["parsed"] is not None else {}
        model, model_b = models[r[CELL]], None
        if model is None:
            _, model, model_b = r["item_id"].rsplit("|", 2)
        out.append({"item_id": r["item_id"], "study": r["study"], "setting": r["setting"],
                    "lang": r["lang"], "model": model, "model_b": model_b, "judge": r["model"],
                    "verdict": parsed.get("verdict"), "raw": r["output"],
                    "prompt_hash": r["prompt_hash"], "n_prompt_tokens": r["n_prompt_tokens"],
                    "n_output_tokens": r["n_output_tokens"], "latency_s": r["latency_s"],
                    "cached": r["cached"], "attempts": r["attempts"], "cache_key": r["cache_key"],
                    "error": r["error"], RID: r[RID], "_shard": r["_shard"], CELL: r[CELL]})
    schema = JUDGMENTS.append(pa.field(RID, pa.string())).append(
        pa.field("_shard", pa.int64())).append(pa.field(CELL, pa.int64()))
    return pa.Table.from_pylist(out, schema=schema)
