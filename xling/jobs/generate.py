"""`generate` stage: prompt rows through LLMs -> generations rows (DESIGN.md's schema).

One cell per (prompt set, model). Model entries that load the same engine (same model and
engine settings, different sampling or too_long) share one actor pool, so sweeping sampling
params loads the model once.

    read   prompt file -> prompt rows (tasks/prompts.py); bad lines are error rows
    map    StoreGenerator actors: cache lookup, engine call for the rest, output parser
    write  the runner commits generations shard by shard (core/runner.py)

Every generation is cached by (model, engine settings, sampling params, prompt) in the run
store (core/llm.py): a killed job's rerun, a `--force` rerun or another prompt set with the
same prompts reuses them; a different model or params does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from xling.core.config import NoHash, Strict
from xling.core.llm import (
    LLMSpec,
    LLMStage,
    SamplingSpec,
    check_model,
    engine_params,
    generate_pool,
    sampling_of,
)
from xling.core.cells import RID, Cell
from xling.core.status import part_files
from xling.core.sources import _open, list_files
from xling.core.store import RunStore
from xling.jobs.study import prompt_rows as study_prompt_rows
from xling.jobs.study import prompt_sets as study_prompt_sets
from xling.tasks.prompts import iter_prompt_lines, prompt_row, prompt_table

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `generate:` section


class PromptSet(Strict):
    """Prompt rows from a JSONL or Parquet file (local or s3://): `item_id` and `prompt`
    (a string, or a list of chat messages), optionally `study`, `setting`, `lang`."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    path: str
    parser: str = Field("none", description="tasks/parsers.py: none, answer_tag, json")


class GenerateConfig(Strict):
    """`generate`: every prompt set through every model; cached by (model, params, prompt)."""

    models: list[LLMSpec] = Field(min_length=1)
    prompts: list[PromptSet] = Field([], description="prompt files; with a `study:` section the "
                                                     "study's tasks/ module builds the prompts")
    sampling: SamplingSpec = SamplingSpec()
    cache: bool = NoHash(True, description="reuse stored generations with the same key")
    shards: int = NoHash(4, ge=1, le=100_000, description="deterministic shards per cell")

    @model_validator(mode="after")
    def _names(self) -> "GenerateConfig":
        for what, names in (("models", [m.label for m in self.models]),
                            ("prompts", [p.name for p in self.prompts])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"generate.{what}: names must be unique, {dup} repeat "
                                 "(give each model entry its own `name:`)")
        from xling.studies.registry import all_parsers

        for p in self.prompts:
            if p.parser not in all_parsers():
                raise ValueError(f"prompt set '{p.name}': unknown parser '{p.parser}'; "
                                 f"choose one of {sorted(all_parsers())}")
        return self



class GenerateStage(LLMStage):
    name = "generate"

    def prompt_sets(self, cfg: XlingConfig) -> list[tuple[dict, dict, list[str]]]:
        """(cell key, prompts params, input files) of each prompt set: the files under
        generate.prompts, then the study's sets (jobs/study.py)."""
        sets = [({"prompts": ps.name}, {"path": ps.path, "parser": ps.parser},
                 list_files(ps.path, where=f"generate.prompts[{i}]"))
                for i, ps in enumerate(cfg.generate.prompts)]
        for ps in study_prompt_sets(cfg) if cfg.study is not None else []:
            sets.append(({"study": ps["study"], "setting": ps["setting"], "lang": ps["lang"]},
                         {k: v for k, v in ps.items() if k != "files"}, ps["files"]))
        return sets

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        gc = cfg.generate
        cells = []
        for key, prompts, files in self.prompt_sets(cfg):
            for spec in gc.models:
                model = engine_params(spec)
                params = {"prompts": prompts, "model": model,
                          "sampling": sampling_of(spec, gc.sampling).as_dict()}
                cells.append(Cell("generate", {**key, "model": spec.label}, params,
                                  inputs=files, n_shards=gc.shards))
        return cells

    def entries(self, cfg: XlingConfig) -> list:
        return cfg.generate.models

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        for i, spec in enumerate(cfg.generate.models):
            check_model(spec, f"generate.models[{i}]")

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        t = self.prompt_rows(cell, cfg)
        return ray.data.from_arrow(t.append_column(RID, t["item_id"]))

    def prompt_rows(self, cell: Cell, cfg: XlingConfig) -> pa.Table:
        """The cell's prompt rows (tasks/prompts.py's schema); bad lines are error rows."""
        if "study" in cell.params["prompts"]:
            return study_prompt_rows(cfg, cell.params["prompts"])
        tables = []
        for path in cell.inputs:
            if path.endswith(".parquet"):
                import pyarrow.parquet as pq

                with _open(path, random_access=True) as f:
                    rows = pq.read_table(f).to_pylist()
                tables.append(prompt_table(prompt_row(r, f"{path}:row{n}")
                                           for n, r in enumerate(rows, 1)))
            else:
                import io

                with _open(path) as f:  # an Arrow stream does not iterate lines
                    data = io.BytesIO(f.read())
                tables.append(prompt_table(iter_prompt_lines(data, name=cell.key["prompts"])))
        return pa.concat_tables(tables)

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        return generate_pool(ds, cfg.run_root, {s.label: s for s in cfg.generate.models},
                             [(c.key["model"], c.params["sampling"], c.params["prompts"]["parser"])
                              for c in cells], cache=cfg.generate.cache, where="generate.models")

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        files = part_files(store, cell.dir)
        t = store.read_parquet(files, columns=["cached", "n_prompt_tokens", "n_output_tokens",
                                               "truncated_from", "error"])
        ok = pc.is_null(t["error"])
        return {"generations": {
            "generated": int(pc.sum(pc.and_(ok, pc.equal(t["cached"], False))).as_py() or 0),
            "from_cache": int(pc.sum(pc.and_(ok, pc.equal(t["cached"], True))).as_py() or 0),
            "truncated": int(pc.sum(pc.is_valid(t["truncated_from"])).as_py() or 0),
            "prompt_tokens": int(pc.sum(t["n_prompt_tokens"]).as_py() or 0),
            "output_tokens": int(pc.sum(t["n_output_tokens"]).as_py() or 0)}}
