"""Experiment configs: typed YAML, dotted command-line overrides, a stable hash, clear errors.

A config is validated completely before any work starts (Ray is not even started), and every
error names the file, the dotted key and what to do about it. Fields that only change *how*
a job runs (concurrency, batch sizes, addresses) are marked ``hash=False`` and stay out of the
hash that names output cells, so tuning a cluster never invalidates finished work.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from xling.tasks.languages import UnknownLanguageError, get_language

ENCODING = Literal["auto", "utf-8", "latin-1"]


class ConfigError(ValueError):
    """A config problem a user can fix; the message says where and how."""


def NoHash(default: Any = ..., **kw: Any) -> Any:
    """A field that does not change results (and so is left out of cell hashes)."""
    extra = dict(kw.pop("json_schema_extra", None) or {})
    extra["hash"] = False
    return Field(default, json_schema_extra=extra, **kw)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_lang(code: str) -> str:
    try:
        return get_language(code).code
    except UnknownLanguageError as e:
        raise ValueError(str(e)) from None


class Parallelism(Strict):
    """How a map step is spread over an actor pool. None of this changes results."""

    concurrency: tuple[int, int] = NoHash((1, 2), description="(min, max) actors in the pool")
    batch_size: int = NoHash(64, gt=0, description="records per map_batches call")
    num_cpus: float = NoHash(1.0, ge=0)
    num_gpus: float = NoHash(0.0, ge=0, description="fractions let actors share a GPU")

    @field_validator("concurrency")
    @classmethod
    def _minmax(cls, v: tuple[int, int]) -> tuple[int, int]:
        lo, hi = v
        if lo < 1 or hi < lo:
            raise ValueError(f"concurrency must be (min, max) with 1 <= min <= max; got {list(v)}")
        return v


class _Source(Strict):
    """What every input file set has: a name, and the languages it is written in."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    langs: list[str] = Field(min_length=1, description="the languages the files are written in")

    @field_validator("langs")
    @classmethod
    def _known_langs(cls, v: list[str]) -> list[str]:
        return [_check_lang(c) for c in v]


class CorpusSpec(_Source):
    """A document collection in one of the published formats (see tasks/corpora.py)."""

    format: Literal["mrtydi", "miracl", "ciral", "neuclir", "jsonl", "parquet", "clef"] = "mrtydi"
    path: str = Field(description="file or glob (local or s3://); `{lang}` is replaced by each "
                                  "language code; .gz files are read compressed")
    # Only for format=jsonl / parquet: which fields hold id / title / text.
    id_field: str = "docid"
    title_field: str | None = "title"
    text_field: str = "text"
    encoding: ENCODING = Field("auto", description="auto: UTF-8, and for clef Latin-1 where a "
                                                   "<DOC> is not valid UTF-8")


class TopicSpec(_Source):
    """Topics (queries): TREC `qid<TAB>text` TSV, or CLEF `<top>` SGML (tasks/topics.py)."""

    format: Literal["tsv", "clef"] = "tsv"
    path: str = Field(description="file or glob (local or s3://); `{lang}` is replaced")
    fields: list[Literal["title", "desc", "narr"]] = Field(
        ["title", "desc"], min_length=1, description="clef only: the fields that make the query")
    encoding: ENCODING = "auto"


class _Targets(Strict):
    targets: list[str] = Field(min_length=1, description="target languages")

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, v: list[str]) -> list[str]:
        return [_check_lang(c) for c in v]


class TranslateCorpus(CorpusSpec, _Targets):
    """A corpus to translate from each of `langs` into each of `targets`."""


class TranslateTopics(TopicSpec, _Targets):
    """Topics to translate (QT) from each of `langs` into each of `targets`."""


class DecodeBound(Strict):
    """How long a translation may grow: min(max_tokens, ceil(ratio * source) + extra)."""

    ratio: float = Field(2.0, gt=0)
    extra: int = Field(10, ge=0)
    max_tokens: int = Field(512, ge=1)


QUANTIZATIONS = ("int8", "int8_float16", "int8_float32", "int8_bfloat16", "float16",
                 "bfloat16", "float32")


class TranslateConfig(Strict):
    """`translate`: NLLB through CTranslate2, sentence by sentence, for documents and topics."""

    model: str = Field("tiny:nllb_ct2", description=(
        "a CTranslate2 model dir, a Transformers NLLB checkpoint (hub id or path: converted "
        "once and cached in the run store under _models/), or tiny:<name>"))
    quantization: Literal[QUANTIZATIONS] = Field(  # type: ignore[valid-type]
        "int8", description="weights of a converted checkpoint (ignored for CTranslate2 dirs)")
    compute_type: str = Field("default", description="CTranslate2 compute_type at load time")
    beam_size: int = Field(4, ge=1, le=64)
    max_input_tokens: int = Field(200, ge=8, description="longer sentences are split")
    decode: DecodeBound = DecodeBound()
    repetition_penalty: float = Field(1.0, gt=0)
    no_repeat_ngram_size: int = Field(0, ge=0)
    lang_check: Literal["error", "off"] = Field(
        "error", description="error: a document that looks like another language is an error row")
    device: Literal["auto", "cpu", "cuda"] = NoHash("auto")
    inter_threads: int = NoHash(1, ge=1, description="CTranslate2 replicas per actor")
    intra_threads: int = NoHash(0, ge=0, description="threads per replica (0: CT2 default)")
    max_batch_tokens: int = NoHash(4096, ge=16, description="padded tokens per engine batch")
    shards: int = NoHash(16, ge=1, le=100_000, description="deterministic shards per cell")
    parallel: Parallelism = NoHash(Parallelism(batch_size=128, num_cpus=1.0))
    documents: list[TranslateCorpus] = []
    topics: list[TranslateTopics] = []

    @field_validator("compute_type")
    @classmethod
    def _compute_type(cls, v: str) -> str:
        allowed = ("default", "auto", *QUANTIZATIONS, "int16")
        if v not in allowed:
            raise ValueError(f"compute_type must be one of {', '.join(allowed)}")
        return v

    @model_validator(mode="after")
    def _pairs(self) -> "TranslateConfig":
        if not self.documents and not self.topics:
            raise ValueError("translate needs `documents:` or `topics:` (or both)")
        names = [s.name for s in [*self.documents, *self.topics]]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"names must be unique across documents and topics: {dup}")
        for spec in [*self.documents, *self.topics]:
            for src in spec.langs:
                for tgt in spec.targets:
                    if get_language(src).nllb == get_language(tgt).nllb:
                        raise ValueError(
                            f"'{spec.name}': {src} -> {tgt} translates a language into itself "
                            f"(both are {get_language(src).nllb}); remove '{tgt}' from targets")
        return self


class IngestConfig(Strict):
    """`ingest`: read corpora into the documents schema, segmented and token-counted."""

    corpora: list[CorpusSpec] = Field(min_length=1)
    tokenizer: str = Field(
        "tiny:nllb_hf",
        description="tokenizer for n_tokens: a hub id, a local path, or tiny:<name>",
    )
    shards: int = NoHash(8, ge=1, le=100_000, description="deterministic shards per cell")
    parallel: Parallelism = NoHash(Parallelism())


class RayConfig(Strict):
    address: str | None = NoHash(None, description="ray://, host:port or auto; RAY_ADDRESS wins")
    num_cpus: int | None = NoHash(None, ge=1, description="local mode only")


STAGE_ORDER = ("ingest", "translate", "report")


class XlingConfig(Strict):
    """The whole experiment. One file per study; sweeps override fields from the CLI."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    run_root: str | None = NoHash(None, description="local path or s3://bucket/prefix")
    stages: list[Literal["ingest", "translate", "report"]] | None = NoHash(
        None, description="stages `xling run` runs, in order (default: every stage with a "
                          "section, then report)")
    ray: RayConfig = NoHash(RayConfig())
    ingest: IngestConfig | None = None
    translate: TranslateConfig | None = None

    @model_validator(mode="after")
    def _defaults(self) -> "XlingConfig":
        if self.run_root is None:
            object.__setattr__(self, "run_root", f"./runs/{self.name}")
        if self.stages is None:
            object.__setattr__(self, "stages", [s for s in STAGE_ORDER
                                                if s == "report" or getattr(self, s) is not None])
        for stage in self.stages:
            if stage != "report" and getattr(self, stage) is None:
                raise ValueError(
                    f"stage '{stage}' is listed in `stages` but has no `{stage}:` section"
                )
        return self


# ---------------------------------------------------------------------------------------
# hashing


def hashable(model: BaseModel) -> Any:
    """The result-relevant part of a config as plain JSON data (NoHash fields dropped)."""
    out: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("hash") is False:
            continue
        out[name] = _plain(getattr(model, name))
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, BaseModel):
        return hashable(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def stable_hash(data: Any, n: int = 8) -> str:
    """Short hex digest of canonical JSON: key order and whitespace never change it."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


# ---------------------------------------------------------------------------------------
# loading


def parse_override(text: str) -> tuple[list[str], Any]:
    """`generate.model=Qwen/Qwen2.5-7B-Instruct` -> (["generate", "model"], "Qwen/...").

    Values are parsed as YAML so `ingest.shards=16`, `ray.address=null` and
    `ingest.corpora.0.langs=[fi,sw]` mean what they look like.
    """
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not KEY=VALUE (for example ingest.shards=16)")
    key, _, raw = text.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{text}': value is not valid YAML ({e})") from None
    return path, value


def _apply(data: dict, path: list[str], value: Any, text: str) -> None:
    node: Any = data
    for i, part in enumerate(path[:-1]):
        if isinstance(node, list):
            node = node[_index(part, node, text)]
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"override '{text}': '{'.'.join(path[: i + 1])}' is not a section")
    last = path[-1]
    if isinstance(node, list):
        node[_index(last, node, text)] = value
    else:
        node[last] = value


def _index(part: str, node: list, text: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"override '{text}': '{part}' is not an index of a {len(node)}-item list")
    return int(part)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> XlingConfig:
    """Read, override and validate a config. Raises ConfigError with actionable messages."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist (see configs/ for examples)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(data).__name__}")
    given = {}
    for text in overrides:
        keys, value = parse_override(text)
        _apply(data, keys, value, text)
        given[".".join(keys)] = text
    return validate_config(data, source=str(path), overrides=given)


def validate_config(data: dict, source: str = "<config>",
                    overrides: dict[str, str] | None = None) -> XlingConfig:
    try:
        return XlingConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(e, source, overrides or {})) from None


def _dotted(loc: tuple) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top>"


def _all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        sub = _model_of(field.annotation)
        if sub is not None:
            keys += _all_keys(sub, f"{prefix}{name}.")
    return keys


def _explain(err: ValidationError, source: str, overrides: dict[str, str]) -> str:
    lines = [f"{source}: {err.error_count()} problem(s) in the config:"]
    for item in err.errors():
        loc = _dotted(item["loc"])
        plain = ".".join(str(p) for p in item["loc"])
        origin = next((f" (from the command-line override '{t}')" for k, t in overrides.items()
                       if plain == k or plain.startswith(k + ".")), "")
        kind, msg = item["type"], item["msg"]
        if kind == "extra_forbidden":
            parent, key = _model_at(item["loc"][:-1]), str(item["loc"][-1])
            valid = sorted(parent.model_fields) if parent else []
            close = difflib.get_close_matches(key, valid, n=1)
            if not close and parent is not None:
                # The key may exist one level down (batch_size lives under `parallel`).
                nested = {k.rsplit(".", 1)[-1]: k for k in _all_keys(parent) if "." in k}
                near = difflib.get_close_matches(key, list(nested), n=1)
                close = [nested[near[0]]] if near else []
            hint = f"did you mean '{close[0]}'? " if close else ""
            fix = f"{hint}Valid keys here: {', '.join(valid)}" if valid else "remove it"
            lines.append(f"  - {loc}: unknown key{origin}. Fix: {fix}.")
        elif kind == "missing":
            lines.append(f"  - {loc}: required key is missing. Fix: add `{item['loc'][-1]}:`.")
        else:
            msg = msg.removeprefix("Value error, ")
            got = item.get("input")  # a whole section adds nothing to a model-level message
            shown = "" if isinstance(got, dict) else f" (got {got!r})"
            lines.append(f"  - {loc}: {msg}{shown}{origin}.")
    return "\n".join(lines)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the key at `loc` (for suggesting valid keys)."""
    model: Any = XlingConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        model = _model_of(field.annotation)
    return model


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found:
            return found
    return None

