"""`translate` stage: NLLB through CTranslate2 for whole corpora (DT) and topics (QT).

One cell per (source, source language, target language). Every cell of a run goes through
one pipeline and one actor pool (`actors/translator.py`), which holds one
`ctranslate2.Translator` and knows each cell's direction, so a corpus translated into three
languages loads the model once per actor, not three times.

    read   corpus / topic files -> documents / queries rows (core/sources.py, streamed)
    map    Translator actors: sentences, split, token batches, CTranslate2, reassembly
    write  the runner commits translations rows shard by shard (core/runner.py)

The model is prepared on the driver before the pool starts: a CTranslate2 directory is used
as it is; a Transformers checkpoint is converted once into the run store (`_models/ct2/`),
from where each actor fetches it (core/models.py), so workers on other nodes need neither
the hub nor the driver's disk.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from xling.actors.llm import HANG_TIMEOUT_S
from xling.actors.translator import Translator
from xling.core.config import ConfigError, NoHash, Parallelism, Strict, check_lang, hashable
from xling.core.models import fetch_ct2_model, is_ct2_dir, prepare_ct2_model, resolve_model
from xling.core.pools import actor_pool, pool_resources
from xling.core.cells import RID, Cell, Source, Stage
from xling.core.sources import (
    CorpusSpec,
    TopicSpec,
    documents_source,
    queries_source,
    spec_files,
)
from xling.core.store import RunStore
from xling.tasks.languages import LANGUAGES, get_language, lingua_language

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `translate:` section


class _Targets(Strict):
    targets: list[str] = Field(min_length=1, description="target languages")

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, v: list[str]) -> list[str]:
        return [check_lang(c) for c in v]


class TranslateCorpus(CorpusSpec, _Targets):
    """A corpus to translate from each of `langs` into each of `targets`."""

    lang_check: Literal["error", "flag", "off"] | None = Field(
        None, description="this corpus's language check (see translate.lang_check); default: "
                          "translate.lang_check")


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
    beam_size: int = Field(4, ge=1, le=64, description="beam width; 1 is greedy (LLM-CLIR: "
                                                       "greedy)")
    max_input_tokens: int = Field(200, ge=8, description="longer sentences are split")
    decode: DecodeBound = DecodeBound()
    repetition_penalty: float = Field(1.0, gt=0, description="CTranslate2's repetition "
                                                             "penalty; 1.0 is none")
    no_repeat_ngram_size: int = Field(0, ge=0, description="forbid repeating n-grams of "
                                                           "this size; 0 is off")
    lang_check: Literal["error", "flag", "off"] = Field(
        "error", description="error: a document that looks like another language is an error "
                             "row; flag: it is translated anyway and the finding kept in "
                             "`lang_flag` (XRAG uses such translations, as the paper "
                             "answered every item); off: no check")
    device: Literal["auto", "cpu", "cuda"] = NoHash("auto", description="auto: cuda where "
                                                    "the actor has a GPU, else cpu")
    inter_threads: int = NoHash(1, ge=1, description="CTranslate2 replicas per actor")
    intra_threads: int = NoHash(0, ge=0, description="threads per replica (0: CT2 default)")
    max_batch_tokens: int = NoHash(4096, ge=16, description="padded tokens per engine batch")
    hang_timeout_s: float = NoHash(HANG_TIMEOUT_S, gt=0, description=(
        "watchdog: a batch during which CTranslate2 finishes no token batch for this long "
        "becomes error rows, and the actor loads the model again"))
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
    def _gpu_for_cuda(self) -> "TranslateConfig":
        # Ray hides the GPUs from an actor that reserved none: it could only fail.
        if self.device == "cuda" and not self.parallel.num_gpus:
            raise ValueError("device: cuda needs a GPU per translator actor: set "
                             "translate.parallel.num_gpus (1, or 0.5 to share one), or "
                             "device: auto / cpu")
        return self

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



# Bump when the segmentation / splitting / reassembly changes what a translation is.
PIPELINE_VERSION = 1


def _sources(cfg: XlingConfig):
    tc = cfg.translate
    for i, spec in enumerate(tc.documents):
        yield "doc", spec, f"translate.documents[{i}]"
    for i, spec in enumerate(tc.topics):
        yield "query", spec, f"translate.topics[{i}]"


def _check_vocabulary(model: str, path: str, codes: set[str]) -> None:
    """Refuse language codes the model's vocabulary lacks (only for a local model dir)."""
    import json
    from pathlib import Path

    vocab = Path(path, "shared_vocabulary.json")
    if not vocab.is_file():
        return  # a checkpoint still to be converted: the converter checks it
    known = set(json.loads(vocab.read_text()))
    missing = sorted(codes - known)
    if missing:
        raise ConfigError(f"translate.model: {model} has no language token for {missing}; "
                          f"it cannot translate from or into those languages.")


class TranslateStage(Stage):
    name = "translate"
    id_column = "id"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        tc = cfg.translate
        engine = {k: v for k, v in hashable(tc).items() if k not in ("documents", "topics")}
        path = resolve_model(tc.model, key="translate.model")
        if is_ct2_dir(path):
            engine.pop("quantization")  # a CTranslate2 dir is used as it is
        cells, codes = [], set()
        for kind, spec, where in _sources(cfg):
            # Other languages and targets of the source are not this cell's business: adding
            # one must not invalidate the cells already done.
            source = {k: v for k, v in hashable(spec).items() if k not in ("langs", "targets")
                      and not (k == "lang_check" and v is None)}  # unset: ids as before
            for src in spec.langs:
                files = spec_files(spec, src, where)
                for tgt in spec.targets:
                    codes |= {get_language(src).nllb, get_language(tgt).nllb}
                    params = {"kind": kind, "source": source, "src": src, "tgt": tgt,
                              "engine": engine, "pipeline": PIPELINE_VERSION}
                    cells.append(Cell("translate", {"source": spec.name, "src": src, "tgt": tgt},
                                      params, inputs=files, n_shards=tc.shards))
        _check_vocabulary(tc.model, path, codes)
        return cells

    def read(self, cell: Cell, cfg: XlingConfig):
        source = self.source(cell, cfg)
        return source.read().map_batches(source.adapt, batch_format="pyarrow")

    def source(self, cell: Cell, cfg: XlingConfig) -> Source:
        """The documents (or queries) rows: every target language of a source language,
        and ingest and index of the same corpus, share their partition."""
        kind, src = cell.params["kind"], cell.key["src"]
        adapt = functools.partial(_to_input, kind=kind)
        if kind == "doc":
            spec = next(s for s in cfg.translate.documents if s.name == cell.key["source"])
            return documents_source(spec, src, cell.inputs, adapt=adapt)
        spec = next(s for s in cfg.translate.topics if s.name == cell.key["source"])
        return queries_source(spec, src, cell.inputs, adapt=adapt)

    def resources(self, cells: list[Cell], cfg: XlingConfig) -> dict:
        return pool_resources(cfg.translate.parallel)

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        # Convert before Ray starts: a model that cannot be loaded stops the job here.
        prepare_ct2_model(cfg.translate.model, cfg.translate.quantization, store)

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        tc, p = cfg.translate, cfg.translate.parallel
        store = RunStore(cfg.run_root)
        # Found in the store after `prepare` (or converted now when the runner is used directly).
        local, stored = prepare_ct2_model(tc.model, tc.quantization, store)
        directions = [(c.key["src"], get_language(c.key["src"]).nllb,
                       c.key["tgt"], get_language(c.key["tgt"]).nllb) for c in cells]
        lingua = sorted({n for n in (lingua_language(c) for c in LANGUAGES) if n})
        kwargs = dict(
            store_uri=store.uri, store_rel=stored, model_dir=local, model_name=tc.model,
            directions=directions, device=tc.device, compute_type=tc.compute_type,
            beam_size=tc.beam_size, inter_threads=tc.inter_threads,
            intra_threads=tc.intra_threads, max_batch_tokens=tc.max_batch_tokens,
            max_input_tokens=tc.max_input_tokens, decode_ratio=tc.decode.ratio,
            decode_extra=tc.decode.extra, max_decode_tokens=tc.decode.max_tokens,
            repetition_penalty=tc.repetition_penalty,
            no_repeat_ngram_size=tc.no_repeat_ngram_size, lang_check=tc.lang_check,
            lang_checks=[c.params["source"].get("lang_check") or tc.lang_check for c in cells],
            lingua_names=lingua, hang_timeout_s=tc.hang_timeout_s,
            lingua_expected={src: lingua_language(src) for src, *_ in directions
                             if lingua_language(src)})
        return ds.map_batches(StoreTranslator, fn_constructor_kwargs=kwargs,
                              batch_format="pyarrow", batch_size=p.batch_size,
                              compute=actor_pool(p, key="translate.parallel"),
                              num_cpus=p.num_cpus, num_gpus=p.num_gpus)


class StoreTranslator(Translator):
    """The Translator actor, loading its model from the run store when it lives there."""

    def __init__(self, *, store_uri: str, store_rel: str | None, model_dir: str | None, **kw):
        if store_rel is not None:
            model_dir = fetch_ct2_model(RunStore(store_uri), store_rel)
        super().__init__(model_dir, **kw)


def _to_input(batch: pa.Table, *, kind: str) -> pa.Table:
    """documents / queries rows -> the translator's input columns."""
    n = batch.num_rows
    ids = batch["doc_id" if kind == "doc" else "query_id"]
    title = batch["title"] if kind == "doc" else pa.nulls(n, pa.string())
    return pa.table({RID: batch[RID], "id": ids, "kind": pa.array([kind] * n, pa.string()),
                     "title": title, "text": batch["text"], "error": batch["error"]})
