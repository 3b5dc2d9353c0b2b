"""The OpenAI-compatible backend: any HTTP endpoint that speaks the OpenAI API (OpenAI, a
`vllm serve` server, a gateway), its config entry and its start-up checks.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any, Literal

from pydantic import Field, computed_field

from xling.actors.llm import (
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
            return "/chat/completions", {**body, "messages": as_messages(prompt)}
        return "/completions", {**body, "prompt": prompt}

    def complete(self, prompts: list[Prompt], sampling: Sampling, **options) -> list[Completion]:
        return asyncio.run(self._complete_all(prompts, sampling))

    async def acomplete(self, prompts: list[Prompt], sampling: Sampling,
                        **options) -> list[Completion]:
        # Calls in flight together share one limit: `concurrency` is per endpoint, not per call.
        loop = asyncio.get_running_loop()
        if getattr(self, "_gate_loop", None) is not loop:
            self._gate_loop, self._gate = loop, asyncio.Semaphore(self.concurrency)
        return await self._complete_all(prompts, sampling, self._gate)

    async def _complete_all(self, prompts, sampling, gate=None) -> list[Completion]:
        import httpx

        gate = gate or asyncio.Semaphore(self.concurrency)
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


class OpenAISpec(EngineSpec):
    """An OpenAI-compatible endpoint (OpenAI, a `vllm serve` server, a gateway)."""

    backend: Literal["openai"] = Field("openai", description="openai (an OpenAI-compatible "
                                                               "endpoint)")
    base_url: str = Field(description="e.g. https://api.openai.com/v1 or http://HOST:8000/v1")
    api_key_env: str | None = NoHash("OPENAI_API_KEY", description="environment variable "
                                     "holding the key (null: no auth)")
    concurrency: int = NoHash(8, ge=1, description="requests in flight per actor")
    timeout_s: float = NoHash(120.0, gt=0, description="per-request timeout")
    max_retries: int = NoHash(5, ge=0, description="retries on 429/5xx/timeouts")
    backoff_s: float = NoHash(1.0, ge=0, description="first retry delay (doubles)")

    ENGINE = OpenAIEngine
    REMOTE = True
    FIXED = {"too_long": "refuse", "max_model_len": None, "dtype": "auto", "engine_kwargs": {}}

    # vllm only, at their defaults (see EngineSpec.FIXED)
    @computed_field
    @property
    def too_long(self) -> Literal["refuse"]:
        return "refuse"

    @computed_field
    @property
    def max_model_len(self) -> None:
        return None

    @computed_field
    @property
    def dtype(self) -> Literal["auto"]:
        return "auto"

    @computed_field
    @property
    def engine_kwargs(self) -> dict[str, Any]:
        return {}

    def engine_args(self) -> dict:
        return dict(model=self.model, base_url=self.base_url, api_key_env=self.api_key_env,
                    chat=self.chat, concurrency=self.concurrency, timeout_s=self.timeout_s,
                    max_retries=self.max_retries, backoff_s=self.backoff_s, name=self.label)

    def check(self, key: str, log=print) -> None:
        """The key is set, the endpoint accepts it and serves the model (an endpoint that
        is down now is only a warning: calls retry, and failures become error rows)."""
        try:
            engine = OpenAIEngine(self.model, base_url=self.base_url,
                                  api_key_env=self.api_key_env, timeout_s=min(self.timeout_s, 10.0))
        except ValueError as e:
            raise ConfigError(f"{key}: {e}") from None
        import httpx

        try:
            models = engine.list_models()
        except httpx.HTTPStatusError as e:
            if e.response.status_code in (401, 403):
                raise ConfigError(f"{key}: {self.base_url} refused the key in "
                                  f"${self.api_key_env} (HTTP {e.response.status_code})") from None
            log(f"[{key}] could not list models at {self.base_url} (HTTP "
                f"{e.response.status_code}); not checking that '{self.model}' exists")
            return
        except httpx.HTTPError as e:
            log(f"[{key}] WARNING: '{self.label}' at {self.base_url} is not reachable now "
                f"({type(e).__name__}: {e}); "
                "calls will be retried and failures recorded as error rows")
            return
        if models and self.model not in models:
            raise ConfigError(f"{key}.model: '{self.model}' is not served at {self.base_url}; "
                              f"it serves {sorted(models)[:20]}")


Spec = OpenAISpec
