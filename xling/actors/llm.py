"""One LLM interface (`LLMEngine`) and what every backend shares: prompts, sampling,
completions, seeds and cache keys. The backends (vLLM offline, any OpenAI-compatible HTTP
endpoint) are one module each under core/engines/, with their config entries.

Every call goes in as a list of prompts and comes back as one `Completion` per prompt, in
order, with prompt and output token counts, latency and an `error` string. A prompt that is
empty, too long, refused by the server or lost to a dead endpoint is a Completion with
`error` set, never an exception: the stages turn those into error rows and go on.

A prompt is a string or a chat (a list of `{"role", "content"}` messages). With `chat=True`
(the default) a string is sent as one user message through the model's chat template, which
is what instruction-tuned models expect; `chat=False` sends strings as raw completions.

`cache_key` names a generation by (model, engine settings that change outputs, sampling
params, prompt), so stages can store and reuse results (jobs/generate.py).

The Ray Data actors that hold an engine for the life of a pool (they also read and write the
run store's generation cache) are core/llm.StoreLLM and its subclasses.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Union


Prompt = Union[str, list]  # a string, or a list of {"role": ..., "content": ...} messages

# How long a local engine may make no progress before the call waiting on it fails and the
# engine restarts (core/watchdog.py for LLMs, the translator's own): no engine step or token
# batch takes minutes, and a hung CUDA call never returns.
HANG_TIMEOUT_S = 600.0


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


def cache_keys(model: str, settings: dict, sampling: Sampling,
               prompts: list[Prompt]) -> list[str]:
    """`cache_key` of each prompt, byte for byte, with what the prompts share serialised
    once: the sorted keys put the prompt between the model and the sampling params."""
    blob = json.dumps({"model": model, "settings": settings, "sampling": sampling.as_dict(),
                       "prompt": ""}, sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))
    head, tail = blob.split('"prompt":""', 1)
    head, tail = (head + '"prompt":').encode(), tail.encode()
    dumps, sha = json.dumps, hashlib.sha256
    return [sha(head + dumps(canonical_prompt(p), ensure_ascii=False).encode() + tail)
            .hexdigest() for p in prompts]


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


def as_messages(prompt: Prompt) -> list[dict]:
    """A prompt as chat messages: a string is one user message."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


class LLMEngine(ABC):
    """Generate for a list of prompts; one Completion per prompt, in order, never raising
    for a single bad prompt."""

    model: str

    @abstractmethod
    def complete(self, prompts: list[Prompt], sampling: Sampling, **options) -> list[Completion]:
        """options: per-call settings a backend understands (vLLM: too_long)."""

    async def acomplete(self, prompts: list[Prompt], sampling: Sampling,
                        **options) -> list[Completion]:
        """`complete` for callers on an event loop, so that several calls can be in flight
        at once (a backend that queues requests itself overrides it)."""
        import asyncio

        return await asyncio.to_thread(self.complete, prompts, sampling, **options)

    def settings(self) -> dict:
        """Engine settings that change outputs (part of the cache key)."""
        return {}

    def truncate(self, texts: list[str], n_tokens: int) -> list[str]:
        """Each text cut to its first n_tokens tokens (whitespace tokens unless the backend
        has the model's tokenizer)."""
        return [" ".join(t.split()[:n_tokens]) for t in texts]


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
