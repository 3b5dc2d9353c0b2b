"""What every LLM backend provides: `EngineSpec`, the config entry (rerank.model,
generate.models[], judge.judges[], features.llm) that a backend subclasses with its own keys,
and the methods the stages call instead of asking which backend an entry is.

A backend's subclass declares `backend: Literal["<its name>"]`, its keys, the `LLMEngine` it
builds (`ENGINE`) and what it needs before and while it runs: `engine_args` (the engine's
constructor arguments), `check` (before Ray starts: does the model exist?), `actor_env`,
`gpus` and `call_options` (settings sent with every call). A key that belongs to another
backend is refused with the fix: "base_url is for backend openai; set backend: openai or
remove base_url".
"""

from __future__ import annotations

import difflib
import re
from typing import Any, ClassVar

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from xling.actors.llm import LLMEngine
from xling.core.config import NoHash, Parallelism, Strict


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


class EngineSpec(Strict):
    """The keys every LLM entry has, whatever its backend."""

    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$",
                             description="label in cells and the `model` column (default: model)")
    backend: str = Field(description="vllm (offline engine, the default), openai (any "
                                     "OpenAI-compatible endpoint) or ctranslate2 "
                                     "(encoder-decoder models)")
    model: str = Field(description="vllm: hub id, local path or tiny:llama_chat; openai: the "
                                   "endpoint's model name")
    chat: bool = Field(True, description="send prompts through the chat template / chat API")
    sampling: SamplingSpec | None = Field(None, description="overrides the section's sampling")
    parallel: Parallelism = NoHash(Parallelism(concurrency=(1, 1), batch_size=256),
                                   description="the actor pool (vllm: set num_gpus to "
                                               "tensor_parallel_size)")

    # The engine class this backend builds from `engine_args()`.
    ENGINE: ClassVar[type[LLMEngine]]
    # Whether a call may continue the chat prompt with a prefix and limit the answer to given
    # tokens (rerank's prp_answer: passage_token); needs the model's tokenizer at hand.
    CONTINUES_PROMPT: ClassVar[bool] = False
    # An encoder-decoder (ctranslate2): the answer is the decoder's, outside the prompt's
    # context, and a prompt continued by a prefix continues the decoder's output (rerank's
    # PRP then sends llm-rankers' T5 prefix and reads its two tokens).
    ENCODER_DECODER: ClassVar[bool] = False
    # Served by an endpoint (no weights or revision on this machine).
    REMOTE: ClassVar[bool] = False
    # The engine args (with "backend") that change outputs: with the model, sampling and
    # prompt they key the generation cache, an absent one as None. vllm and openai share
    # these six, so the cache keys made before they had one model each stay valid; a new
    # backend lists its own.
    CACHE_KEYS: ClassVar[tuple[str, ...]] = ("backend", "chat", "max_model_len", "dtype",
                                             "engine_kwargs", "base_url")
    # Hashed keys sent with each call (`call_options`) rather than built into the engine:
    # entries that differ only in these share one engine (one actor pool).
    PER_CALL: ClassVar[tuple[str, ...]] = ()
    # Keys of the other backend that every entry hashed, at their defaults, while both
    # backends shared one model: kept as computed fields (in hashes and dumps, not keys to
    # set), name -> value, so no cell hash moved. Given with that value they are dropped;
    # with another, refused as a key of the other backend.
    FIXED: ClassVar[dict[str, Any]] = {}

    @property
    def label(self) -> str:
        return self.name or self.model

    @classmethod
    def backend_name(cls) -> str:
        return cls.model_fields["backend"].default

    @classmethod
    def own_keys(cls) -> list[str]:
        """The keys an entry of this backend may set."""
        return list(cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _keys_of_this_backend(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        from xling.core.engines import spec_classes

        problems = []
        for key, value in data.items():
            key = str(key)
            if key in cls.model_fields or (key in cls.FIXED and value == cls.FIXED[key]):
                continue
            owner = next((name for name, other in spec_classes().items()
                          if other is not cls and key in other.own_keys()), None)
            if owner is not None:
                text = f"{key} is for backend {owner}; set backend: {owner} or remove {key}"
            else:
                close = difflib.get_close_matches(key, cls.own_keys(), n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                text = (f"unknown key for backend {cls.backend_name()}. Fix: "
                        f"{hint}Valid keys here: {', '.join(sorted(cls.own_keys()))}")
            problems.append(InitErrorDetails(
                type=PydanticCustomError("llm_key", "{text}", {"text": text}), loc=(key,),
                input=value))
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return {k: v for k, v in data.items() if k not in cls.FIXED}

    # ---- what the stages ask of a backend ------------------------------------------------

    def engine_args(self) -> dict:
        """The constructor arguments of `ENGINE` (plain data: they travel to Ray actors)."""
        raise NotImplementedError

    def check(self, key: str, log=print) -> None:
        """Before Ray starts: a model that cannot be loaded or reached is a ConfigError that
        names `key`, not a dead actor pool."""

    def actor_env(self) -> dict:
        """Environment variables the actor sets before the engine is built."""
        return {}

    def gpus(self) -> float:
        """GPUs per actor."""
        return self.parallel.num_gpus

    def call_options(self) -> dict:
        """Per-call settings sent with every `complete` (part of the cache key)."""
        return {}
