"""Config machinery: typed YAML, dotted command-line overrides, a stable hash, clear errors.

Each stage's section (its pydantic model and defaults) lives with the stage in `jobs/`, the
sections every stage shares with their concern in `core/` (sources, LLM entries), and the
top-level model that assembles them in `xling/config.py`. This module has what all of them
use: the strict base model, `NoHash` fields, `Parallelism`, hashing, overrides and the error
formatting.

A config is validated completely before any work starts (Ray is not even started), and every
error names the file, the dotted key and what to do about it. Fields that only change *how*
a job runs (concurrency, batch sizes, addresses) are marked ``hash=False`` and stay out of the
hash that names output cells, so tuning a cluster never invalidates finished work.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
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

    @model_validator(mode="before")
    @classmethod
    def _partial_parallel(cls, data: Any) -> Any:
        """A `parallel:` given in part keeps its section's defaults for the keys it leaves
        out (index's 4,096 documents a call at half a CPU, say), not Parallelism's generic
        ones: `parallel: {concurrency: [4, 4]}` changes the pool size and nothing else."""
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            given = data.get(name)
            if isinstance(given, dict) and isinstance(field.default, Parallelism):
                data = {**data, name: {**field.default.model_dump(), **given}}
        return data


def check_lang(code: str) -> str:
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



class RayConfig(Strict):
    address: str | None = NoHash(None, description="ray://, host:port or auto; RAY_ADDRESS wins")
    num_cpus: int | None = NoHash(None, ge=1, description="local mode only")


# ---------------------------------------------------------------------------------------
# hashing


def hashable(model: BaseModel) -> Any:
    """The result-relevant part of a config as plain JSON data (NoHash fields dropped)."""
    out: dict[str, Any] = {}
    # computed fields are data too (the LLM entries keep the other backend's keys that way)
    fields = {**type(model).model_fields, **type(model).model_computed_fields}
    for name, field in fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("hash") is False:
            continue
        value = getattr(model, name)
        if extra.get("hash") == "if_set" and value is None:
            continue  # a field added later leaves the hashes of configs without it unchanged
        out[name] = _plain(value)
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


def read_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()
                ) -> tuple[dict, dict[str, str]]:
    """Read a YAML config and apply dotted overrides: (data, {dotted key: override text})."""
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
    expand_env(data, str(path))
    return data, given


ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(data: Any, source: str = "<config>") -> Any:
    """`${NAME}` in a config's strings -> the environment variable NAME, in place (after the
    overrides, so a key given on the command line needs no variable). Licensed data (CLEF)
    and files made elsewhere are named this way: a variable that is not set is one
    ConfigError naming it and the keys that read it, before any work."""
    missing: dict[str, list[str]] = {}

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, dict):
            for k in node:
                node[k] = walk(node[k], f"{where}.{k}" if where else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                node[i] = walk(v, f"{where}.{i}")  # the override syntax
        elif isinstance(node, str) and "${" in node:
            for name in ENV_REF.findall(node):
                if not os.environ.get(name):
                    missing.setdefault(name, []).append(where)
            return ENV_REF.sub(lambda m: os.environ.get(m.group(1)) or m.group(0), node)
        return node

    walk(data, "")
    if missing:
        name, keys = next(iter(missing.items()))
        others = [n for n in missing if n != name]
        raise ConfigError(
            f"{source}: environment variable {name}"
            + (f" (and {', '.join(others)})" if others else "") + f" is not set, and {keys[0]}"
            + (f" and {len(keys) - 1} other key(s)" if len(keys) > 1 else "")
            + f" read it: export {name}=<path> (see the config's comments), or give the key "
              f"on the command line ({keys[0]}=<value>)")
    return data


def validate(root: type[BaseModel], data: dict, source: str = "<config>",
             overrides: dict[str, str] | None = None) -> Any:
    """`root.model_validate(data)`, with pydantic's errors turned into one ConfigError that
    names the source, each dotted key and its fix."""
    try:
        return root.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(e, root, source, overrides or {})) from None


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


def _explain(err: ValidationError, root: type[BaseModel], source: str,
             overrides: dict[str, str]) -> str:
    lines = [f"{source}: {err.error_count()} problem(s) in the config:"]
    for item in err.errors():
        loc = _dotted(item["loc"])
        plain = ".".join(str(p) for p in item["loc"])
        origin = next((f" (from the command-line override '{t}')" for k, t in overrides.items()
                       if plain == k or plain.startswith(k + ".")), "")
        kind, msg = item["type"], item["msg"]
        if kind == "extra_forbidden":
            parent, key = _model_at(root, item["loc"][:-1]), str(item["loc"][-1])
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


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the key at `loc` (for suggesting valid keys)."""
    model: Any = root
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


