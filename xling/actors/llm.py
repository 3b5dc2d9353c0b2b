"""One LLM interface, two backends: vLLM offline (`VLLMEngine`) and any OpenAI-compatible
HTTP endpoint (`OpenAIEngine`: OpenAI, a `vllm serve` server, a gateway).

Every call goes in as a list of prompts and comes back as one `Completion` per prompt, in
order, with prompt and output token counts, latency and an `error` string. A prompt that is
empty, too long, refused by the server or lost to a dead endpoint is a Completion with
`error` set, never an exception: the stages turn those into error rows and go on.

A prompt is a string or a chat (a list of `{"role", "content"}` messages). With `chat=True`
(the default) a string is sent as one user message through the model's chat template, which
is what instruction-tuned models expect; `chat=False` sends strings as raw completions.

`cache_key` names a generation by (model, engine settings that change outputs, sampling
params, prompt), so stages can store and reuse results (jobs/generate.py).

The Ray Data actors that hold an engine for the life of a pool are in jobs/ (they also
read and write the run store's generation cache): core/llm.StoreLLM and its subclasses.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, Union

import pyarrow as pa

Prompt = Union[str, list]  # a string, or a list of {"role": ..., "content": ...} messages


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters; part of every cache key."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = 0
    regex: str | None = None  # structured output

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        object.__setattr__(self, "stop", tuple(self.stop))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        if d["regex"] is None:
            del d["regex"]  # cache keys made before the field existed stay valid
        return d


@dataclass
class Completion:
    text: str | None = None
    n_prompt_tokens: int | None = None
    n_output_tokens: int | None = None
    latency_s: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    attempts: int = 1
    truncated_from: int | None = None  # prompt tokens before truncation (too_long=truncate)


COMPLETION_SCHEMA = pa.schema([
    ("output", pa.string()), ("n_prompt_tokens", pa.int64()), ("n_output_tokens", pa.int64()),
    ("latency_s", pa.float64()), ("finish_reason", pa.string()), ("attempts", pa.int64()),
    ("truncated_from", pa.int64()), ("error", pa.string())])


def completions_table(done: list[Completion]) -> pa.Table:
    return pa.table({
        "output": [c.text for c in done], "n_prompt_tokens": [c.n_prompt_tokens for c in done],
        "n_output_tokens": [c.n_output_tokens for c in done],
        "latency_s": [c.latency_s for c in done], "finish_reason": [c.finish_reason for c in done],
        "attempts": [c.attempts for c in done], "truncated_from": [c.truncated_from for c in done],
        "error": [c.error for c in done]}, schema=COMPLETION_SCHEMA)


def canonical_prompt(prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def prompt_hash(prompt: Prompt) -> str:
    return hashlib.sha256(canonical_prompt(prompt).encode()).hexdigest()[:16]


def request_seed(seed: int | None, prompt: Prompt) -> int | None:
    """The sampling seed of one request: derived from the configured seed and the prompt, so
    a rerun draws the same sample, while different prompts draw independent ones (one seed
    for every request would give each the same random stream)."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}:{canonical_prompt(prompt)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def cache_key(model: str, settings: dict, sampling: Sampling, prompt: Prompt) -> str:
    """A generation's identity: model, output-changing engine settings, sampling, prompt."""
    blob = json.dumps({"model": model, "settings": settings, "sampling": sampling.as_dict(),
                       "prompt": canonical_prompt(prompt)},
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def check_prompt(prompt: Prompt) -> str | None:
    """Why a prompt cannot be sent, or None."""
    if isinstance(prompt, str):
        return "empty prompt" if not prompt.strip() else None
    if not isinstance(prompt, list) or not prompt:
        return "empty prompt" if isinstance(prompt, list) else (
            f"a prompt must be a string or a list of chat messages, not {type(prompt).__name__}")
    for m in prompt:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            return f"chat message {m!r} lacks role/content"
    if not any(str(m["content"]).strip() for m in prompt):
        return "empty prompt (every message is empty)"
    return None


def _messages(prompt: Prompt) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


class LLMEngine(ABC):
    """Generate for a list of prompts; one Completion per prompt, in order, never raising
    for a single bad prompt."""

    model: str

    @abstractmethod
    def complete(self, prompts: list[Prompt], sampling: Sampling, **options) -> list[Completion]:
        """options: per-call settings a backend understands (vLLM: too_long)."""

    def settings(self) -> dict:
        """Engine settings that change outputs (part of the cache key)."""
        return {}

    def truncate(self, texts: list[str], n_tokens: int) -> list[str]:
        """Each text cut to its first n_tokens tokens (whitespace tokens unless the backend
        has the model's tokenizer)."""
        return [" ".join(t.split()[:n_tokens]) for t in texts]


# ---------------------------------------------------------------------------------------
# vLLM offline


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
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

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
            text = self.tokenizer.apply_chat_template(_messages(prompt), tokenize=False,
                                                      add_generation_prompt=True)
            return list(self.tokenizer.encode(text + prefix, add_special_tokens=False))
        if prefix:
            return list(self.tokenizer.encode(prompt + prefix))
        if self.chat:
            ids = self.tokenizer.apply_chat_template(_messages(prompt), tokenize=True,
                                                     add_generation_prompt=True)
            # transformers 5 returns a BatchEncoding here, 4.x a list
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return list(self.tokenizer.encode(prompt))

    def allowed_token_ids(self, allowed: list[str]) -> list[int]:
        """The single tokens that spell each string, with or without a leading space."""
        ids = set()
        for a in allowed:
            for v in (a, " " + a):
                t = self.tokenizer.encode(v, add_special_tokens=False)
                if len(t) == 1:
                    ids.add(t[0])
        return sorted(ids)

    def complete(self, prompts: list[Prompt], sampling: Sampling, too_long: str | None = None,
                 prefix: str | None = None, allowed: list[str] | None = None) -> list[Completion]:
        from vllm import SamplingParams

        too_long = too_long or self.too_long
        out: list[Completion | None] = [None] * len(prompts)
        todo, inputs = [], []
        budget = self.max_model_len - sampling.max_tokens
        for i, p in enumerate(prompts):
            why = check_prompt(p)
            if why is None and not self.chat and not isinstance(p, str):
                why = "chat messages given to a model configured with chat: false"
            if why:
                out[i] = Completion(error=why, attempts=0)
                continue
            try:
                ids = self.tokenize(p, prefix)
            except Exception as e:  # a chat template that rejects the roles, say
                out[i] = Completion(error=f"cannot tokenize prompt: {e}", attempts=0)
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
        if inputs:
            extra = {"allowed_token_ids": self.allowed_token_ids(allowed)} if allowed else {}
            if sampling.regex:
                from vllm.sampling_params import StructuredOutputsParams
            # One SamplingParams per request: its own seed, and its own structured-output
            # state (vLLM records the grammar backend on it).
            params = [SamplingParams(
                temperature=sampling.temperature, top_p=sampling.top_p,
                max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None,
                seed=request_seed(sampling.seed, prompts[i]),
                structured_outputs=StructuredOutputsParams(regex=sampling.regex)
                if sampling.regex else None, **extra) for i, _ in todo]
            t0 = time.perf_counter()
            try:
                results = self.llm.generate(inputs, params, use_tqdm=False)
            except Exception as e:  # the engine died: every prompt of the batch is an error row
                results, failure = None, f"vLLM generate failed: {type(e).__name__}: {e}"
            latency = time.perf_counter() - t0
            for k, (i, truncated) in enumerate(todo):
                if results is None:
                    out[i] = Completion(error=failure, latency_s=latency)
                    continue
                r = results[k].outputs[0]
                out[i] = Completion(text=r.text, n_prompt_tokens=len(inputs[k]["prompt_token_ids"]),
                                    n_output_tokens=len(r.token_ids), latency_s=latency,
                                    finish_reason=r.finish_reason, truncated_from=truncated)
        return out  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------
# OpenAI-compatible HTTP

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIEngine(LLMEngine):
    """An OpenAI-compatible endpoint, called with at most `concurrency` requests in flight.

    429, 5xx, timeouts and connection errors are retried up to `max_retries` times with
    exponential backoff and jitter (a Retry-After header is honoured, capped by
    `max_backoff_s`); other statuses (400: prompt too long, 401, 404: unknown model) fail at
    once. The key is read from the environment variable `api_key_env`, never from config.
    """

    def __init__(self, model: str, *, base_url: str, api_key_env: str | None = "OPENAI_API_KEY",
                 chat: bool = True, concurrency: int = 8, timeout_s: float = 60.0,
                 max_retries: int = 5, backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 name: str | None = None):
        self.model, self.chat = model, chat
        self.name = name or model
        self.base_url = base_url.rstrip("/")
        self.api_key = None
        if api_key_env:
            self.api_key = os.environ.get(api_key_env)
            if not self.api_key:
                raise ValueError(f"environment variable {api_key_env} (api_key_env) is not set; "
                                 f"export it with the endpoint's key, or set api_key_env: null "
                                 "for an endpoint without auth")
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s

    def settings(self) -> dict:
        return {"backend": "openai", "chat": self.chat, "base_url": self.base_url}

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _body(self, prompt: Prompt, sampling: Sampling) -> tuple[str, dict]:
        body: dict[str, Any] = {"model": self.model, "temperature": sampling.temperature,
                                "top_p": sampling.top_p, "max_tokens": sampling.max_tokens}
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = request_seed(sampling.seed, prompt)
        if sampling.regex:
            body["structured_outputs"] = {"regex": sampling.regex}
        if self.chat:
            return "/chat/completions", {**body, "messages": _messages(prompt)}
        return "/completions", {**body, "prompt": prompt}

    def complete(self, prompts: list[Prompt], sampling: Sampling, **options) -> list[Completion]:
        return asyncio.run(self._complete_all(prompts, sampling))

    async def _complete_all(self, prompts, sampling) -> list[Completion]:
        import httpx

        gate = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency)
        async with httpx.AsyncClient(base_url=self.base_url, headers=self._headers(),
                                     timeout=self.timeout_s, limits=limits) as client:
            return list(await asyncio.gather(*(self._one(client, gate, p, sampling)
                                               for p in prompts)))

    async def _one(self, client, gate, prompt, sampling) -> Completion:
        import httpx

        why = check_prompt(prompt)
        if why is None and not self.chat and not isinstance(prompt, str):
            why = "chat messages given to an endpoint configured with chat: false"
        if why:
            return Completion(error=why, attempts=0)
        path, body = self._body(prompt, sampling)
        t0, last = time.perf_counter(), ""
        for attempt in range(1, self.max_retries + 2):
            wait = None
            async with gate:
                try:
                    r = await client.post(path, json=body)
                except httpx.TimeoutException:
                    last = f"timed out after {self.timeout_s:g}s"
                except httpx.HTTPError as e:
                    last = f"{type(e).__name__}: {e}"
                else:
                    if r.status_code == 200:
                        return self._parse(r, t0, attempt)
                    last = f"HTTP {r.status_code}: {r.text[:300]}"
                    if r.status_code not in RETRY_STATUS:
                        return Completion(error=last, attempts=attempt,
                                          latency_s=time.perf_counter() - t0)
                    wait = _retry_after(r.headers.get("retry-after"))
            if attempt <= self.max_retries:
                backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                delay = min(self.max_backoff_s, wait) if wait is not None else backoff
                await asyncio.sleep(delay * (0.5 + random.random() / 2) if wait is None else delay)
        return Completion(error=f"{self.base_url}{path} failed after {self.max_retries + 1} "
                                f"attempts: {last}", attempts=self.max_retries + 1,
                          latency_s=time.perf_counter() - t0)

    def _parse(self, r, t0: float, attempt: int) -> Completion:
        latency = time.perf_counter() - t0
        try:
            data = r.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.chat else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            return Completion(error=f"malformed response ({type(e).__name__}: {e}): {r.text[:200]}",
                              attempts=attempt, latency_s=latency)
        usage = data.get("usage") or {}
        return Completion(text=text or "", n_prompt_tokens=usage.get("prompt_tokens"),
                          n_output_tokens=usage.get("completion_tokens"), latency_s=latency,
                          finish_reason=choice.get("finish_reason"), attempts=attempt)

    def list_models(self) -> list[str]:
        """The endpoint's /models (raises httpx errors: the caller decides what they mean)."""
        import httpx

        r = httpx.get(f"{self.base_url}/models", headers=self._headers(), timeout=self.timeout_s)
        r.raise_for_status()
        return [m["id"] for m in r.json().get("data", [])]


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------
# construction


def make_engine(spec: dict) -> LLMEngine:
    """An engine from a plain dict: {"backend": "vllm"|"openai", "model": ..., **options}."""
    spec = dict(spec)
    backend = spec.pop("backend")
    if backend == "vllm":
        return VLLMEngine(**spec)
    if backend == "openai":
        return OpenAIEngine(**spec)
    raise ValueError(f"unknown LLM backend {backend!r}; use vllm or openai")


def decode_prompt(value: str | None) -> Prompt:
    """Prompt columns hold strings; a chat is stored as its JSON list of messages."""
    if value is None:
        return ""
    if value.startswith("[") and value.rstrip().endswith("]"):
        try:
            messages = json.loads(value)
        except ValueError:
            return value
        if isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages):
            return messages
    return value
