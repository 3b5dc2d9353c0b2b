"""The CTranslate2 backend: encoder-decoder LLMs (mT5, T5: LLM-CLIR's Aya-101) on CPU and
CUDA through `ctranslate2.Translator`, its config entry, its start-up checks and the
conversion of a Transformers checkpoint.

vLLM runs decoders only (its pinned 0.32 lists no T5/MT5 architecture); CTranslate2, which
the translate stage already runs for NLLB, converts `MT5ForConditionalGeneration` and
decodes it greedily or by sampling. A prompt is the encoder's input: a string as it is, a
chat as its messages' contents joined by blank lines (an mT5 has no chat template). Per call, `prefix` is the start of the answer, the
decoder's target prefix after its start token (PRP in llm-rankers gives T5 models
"<pad> Passage" and reads two more tokens: `rerank` sends DECODER_PREFIX), and `allowed`
picks, of the given strings, the one the model scores highest after the prefix.

A Transformers checkpoint (a hub id such as CohereForAI/aya-101, or a directory) is
converted once, before Ray starts (`check`), into $XLING_CACHE/models/ct2/ with its
tokenizer; a CTranslate2 directory (with tokenizer.json) is used as it is. On a cluster of
several nodes, give a CTranslate2 directory that every node can read (docs/design.md).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from xling.actors.llm import (
    HANG_TIMEOUT_S,
    Completion,
    LLMEngine,
    Prompt,
    Sampling,
    check_prompt,
)
from xling.core.config import ConfigError, NoHash
from xling.core.engines.base import EngineSpec
from xling.core.models import convert_seq2seq, is_ct2_dir, resolve_model

QUANTIZATIONS = ("float32", "bfloat16", "float16", "int8", "int8_float32", "int8_float16",
                 "int8_bfloat16")


def converted_dir(model: str, quantization: str) -> Path:
    """Where `check` converts a Transformers checkpoint: $XLING_CACHE/models/ct2/<name>-<q>."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "--", model.removeprefix("tiny:").strip("/"))
    root = Path(os.environ.get("XLING_CACHE", ".xling-cache")) / "models" / "ct2"
    return (root / f"{slug}-{quantization}").expanduser().absolute()


def as_text(prompt: Prompt) -> str:
    """The encoder's input: a string, or a chat's contents joined by blank lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(str(m["content"]) for m in prompt)


class CT2Engine(LLMEngine):
    """`ctranslate2.Translator` with the model's tokenizer.json, loaded once.

    Prompts are decoded in batches of `max_batch_size`, greedily (temperature 0) or by
    sampling; a sample cannot be seeded per request (CTranslate2 draws from one random
    stream per thread, seeded once), so sampling needs `seed: null`. `max_model_len` is
    the encoder's input length: a longer prompt is refused or cut in the middle
    (`too_long`), as vLLM's are. Stop strings cut the answer where they first appear.
    """

    def __init__(self, model: str, *, name: str | None = None, chat: bool = True,
                 max_model_len: int = 1024, quantization: str | None = None,
                 compute_type: str = "default", device: str = "auto", too_long: str = "refuse",
                 inter_threads: int = 1, intra_threads: int = 0, max_batch_size: int = 32):
        import ctranslate2
        from tokenizers import Tokenizer

        from xling.actors.translator import cuda_or_cpu

        if too_long not in ("refuse", "truncate"):
            raise ValueError(f"too_long must be refuse or truncate, not {too_long!r}")
        self.model, self.chat, self.too_long = name or model, chat, too_long
        self.max_model_len, self.quantization = max_model_len, quantization
        self.max_batch_size = max_batch_size
        self.device = cuda_or_cpu(device)
        self.translator = ctranslate2.Translator(model, device=self.device,
                                                 compute_type=compute_type,
                                                 inter_threads=inter_threads,
                                                 intra_threads=intra_threads)
        self.compute_type = self.translator.compute_type  # what CT2 runs, after fallbacks
        self.tokenizer = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
        # Callers on several threads share one Rust tokenizer (it may refuse a concurrent call).
        self.lock = threading.Lock()
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            self.eos = json.load(f).get("eos_token", "</s>")  # as the converter recorded it

    def settings(self) -> dict:
        return {"backend": "ctranslate2", "chat": self.chat, "max_model_len": self.max_model_len,
                "quantization": self.quantization, "compute_type": self.compute_type}

    def close(self) -> None:
        """Release a hung engine's model (core/watchdog.py)."""
        self.translator.unload_model()

    # ---- tokens ----------------------------------------------------------------------

    def _encode(self, text: str, special: bool) -> list[str]:
        with self.lock:
            return self.tokenizer.encode(text, add_special_tokens=special).tokens

    def _decode(self, tokens: list[str]) -> str:
        ids = [self.tokenizer.token_to_id(t) for t in tokens]
        with self.lock:
            return self.tokenizer.decode([i for i in ids if i is not None],
                                         skip_special_tokens=True)

    def tokenize(self, prompt: Prompt, prefix: str | None = None) -> list[str]:
        """The encoder's input tokens (with </s>); `prefix` goes to the decoder, so it adds
        nothing here. The listwise reranker fits windows by their length."""
        return self._encode(as_text(prompt), True)

    def truncate(self, texts: list[str], n_tokens: int) -> list[str]:
        out = []
        for t in texts:
            tokens = self._encode(t, False)
            out.append(t if len(tokens) <= n_tokens else self._decode(tokens[:n_tokens]))
        return out

    # ---- generation ------------------------------------------------------------------

    def _source(self, prompt: Prompt, too_long: str):
        """(tokens, truncated_from) or an error Completion."""
        why = check_prompt(prompt)
        if why is None and not self.chat and not isinstance(prompt, str):
            why = "chat messages given to a model configured with chat: false"
        if why:
            return Completion(error=why, attempts=0)
        tokens = self.tokenize(prompt)
        if len(tokens) <= self.max_model_len:
            return tokens, None
        if too_long == "refuse":
            return Completion(error=f"prompt too long: {len(tokens)} tokens > max_model_len "
                                    f"{self.max_model_len} (the encoder's input); set too_long: "
                                    "truncate to cut it", n_prompt_tokens=len(tokens), attempts=0)
        # Its first and last halves (instructions open a prompt, the question closes it);
        # the tail keeps </s>.
        budget = self.max_model_len
        return tokens[:budget - budget // 2] + tokens[len(tokens) - budget // 2:], len(tokens)

    def _answer(self, hyp: list[str], prefix: list[str], n_prompt: int, truncated, t0,
                sampling: Sampling) -> Completion:
        """A hypothesis (prefix, new tokens, maybe </s>) -> the text the new tokens add."""
        new = hyp[len(prefix):]
        ended = bool(new) and new[-1] == self.eos
        new = [t for t in new if t != self.eos]
        head = self._decode(prefix)
        full = self._decode(prefix + new)
        # In context: "Passage" + "▁A" reads " A", as llm-rankers' decoded "Passage A" does.
        text = full[len(head):] if prefix and full.startswith(head) else self._decode(new)
        reason = "stop" if ended else "length"
        for stop in sampling.stop:
            if stop and stop in text:
                text, reason = text[:text.index(stop)], "stop"
        return Completion(text=text, n_prompt_tokens=n_prompt, n_output_tokens=len(new),
                          latency_s=time.perf_counter() - t0, finish_reason=reason,
                          truncated_from=truncated)

    def _options(self, sampling: Sampling, n_prefix: int) -> dict:
        # max_decoding_length counts the target prefix.
        options = dict(max_decoding_length=n_prefix + sampling.max_tokens, return_end_token=True,
                       max_input_length=0)
        if sampling.temperature > 0:
            return {**options, "beam_size": 1, "sampling_topk": 0,
                    "sampling_topp": sampling.top_p, "sampling_temperature": sampling.temperature}
        return {**options, "beam_size": 1}

    def _allowed(self, sources: list[list[str]], prefix: list[str],
                 allowed: list[str]) -> list[list[str]]:
        """Per source, the hypothesis prefix + the allowed string whose tokens score highest
        after the prefix."""
        candidates = [(a, self._encode(a, False)) for a in allowed]
        n = len(candidates)
        scored = self.translator.score_batch(
            [s for s in sources for _ in range(n)],
            [prefix + toks for _ in sources for _, toks in candidates],
            max_batch_size=self.max_batch_size)
        out = []
        for i in range(len(sources)):
            best = max(range(n), key=lambda k: sum(
                scored[i * n + k].log_probs[len(prefix):len(prefix) + len(candidates[k][1])]))
            out.append(prefix + candidates[best][1])
        return out

    def complete(self, prompts: list[Prompt], sampling: Sampling, too_long: str | None = None,
                 prefix: str | None = None, allowed: list[str] | None = None) -> list[Completion]:
        t0 = time.perf_counter()
        out: list[Completion | None] = [None] * len(prompts)
        why = None
        if sampling.regex:
            why = ("structured output (sampling.regex) needs backend vllm or openai; backend "
                   "ctranslate2 cannot constrain by a regex")
        elif sampling.temperature > 0 and sampling.seed is not None:
            why = ("backend ctranslate2 cannot seed a sample per request (CTranslate2 keeps one "
                   "random stream per thread, seeded once), so a seeded sample would not be "
                   "reproducible; set sampling.seed: null for unseeded sampling, or temperature: 0")
        if why:
            return [Completion(error=why, attempts=0) for _ in prompts]
        todo, rows = [], []
        for i, p in enumerate(prompts):
            got = self._source(p, too_long or self.too_long)
            if isinstance(got, Completion):
                out[i] = got
            else:
                todo.append(i)
                rows.append(got)
        if not todo:
            return out
        target = self._encode(prefix, False) if prefix else []
        sources = [tokens for tokens, _ in rows]
        try:
            if allowed:
                hyps = self._allowed(sources, target, allowed)
            else:
                res = self.translator.translate_batch(
                    sources, target_prefix=[target] * len(sources) if target else None,
                    max_batch_size=self.max_batch_size, **self._options(sampling, len(target)))
                hyps = [r.hypotheses[0] for r in res]
        except Exception as e:  # noqa: BLE001 - the engine refused the batch: its rows fail
            for i in todo:
                out[i] = Completion(error=f"CTranslate2 failed: {type(e).__name__}: {e}",
                                    latency_s=time.perf_counter() - t0)
            return out
        for i, hyp, (tokens, truncated) in zip(todo, hyps, rows):
            out[i] = self._answer(hyp, target, len(tokens), truncated, t0, sampling)
        return out


class CT2Spec(EngineSpec):
    """An encoder-decoder model (mT5: Aya-101) run by CTranslate2 on CPU or CUDA."""

    backend: Literal["ctranslate2"] = Field("ctranslate2", description="ctranslate2 "
                                            "(encoder-decoder models: mT5, T5)")
    model: str = Field(description="a CTranslate2 directory (with tokenizer.json), "
                                   "tiny:aya_ct2, or a Transformers checkpoint (hub id such as "
                                   "CohereForAI/aya-101, or a directory), converted once into "
                                   "$XLING_CACHE/models/ct2/")
    quantization: Literal[QUANTIZATIONS] = Field(  # type: ignore[valid-type]
        "bfloat16", description="weights of a converted checkpoint (bfloat16: half the memory "
        "of float32 with its range; mT5 activations overflow float16). A CTranslate2 "
        "directory keeps its own")
    compute_type: str = Field("default", description="CTranslate2 compute_type at load "
                                                     "(default: the weights' type, or the "
                                                     "nearest the device runs)")
    max_model_len: int = Field(1024, ge=16, description="encoder input tokens (mT5 was "
                                                        "pre-trained on inputs of 1024)")
    too_long: Literal["refuse", "truncate"] = Field(
        "refuse", description="a prompt longer than max_model_len is an error row (refuse) "
                              "or cut in the middle (truncate); recorded per row")
    device: Literal["auto", "cpu", "cuda"] = NoHash("auto", description="auto: cuda where "
                                                    "the actor has a GPU, else cpu")
    inter_threads: int = NoHash(1, ge=1, description="CTranslate2 replicas per actor")
    intra_threads: int = NoHash(0, ge=0, description="threads per replica (0: CT2 default)")
    max_batch_size: int = NoHash(32, ge=1, description="prompts per CTranslate2 batch")
    hang_timeout_s: float = NoHash(
        HANG_TIMEOUT_S, gt=0, description="watchdog: a call that takes longer fails as error "
        "rows and the model is loaded again (core/watchdog.py)")

    ENGINE = CT2Engine
    CONTINUES_PROMPT = True
    ENCODER_DECODER = True
    CACHE_KEYS = ("backend", "chat", "max_model_len", "quantization", "compute_type")
    PER_CALL = ("too_long",)

    def _path(self) -> tuple[str, bool]:
        """(the directory the engine loads, whether it is the model as given)."""
        path = resolve_model(self.model, key="model")
        if os.path.isdir(path) and is_ct2_dir(path):
            return path, True
        return str(converted_dir(self.model, self.quantization)), False

    def engine_args(self) -> dict:
        # `name`: the config's model, so the engine (and its cache) is named by what the
        # config says, not by where the converted weights live.
        path, as_given = self._path()
        return dict(model=path, name=self.model, chat=self.chat,
                    max_model_len=self.max_model_len,
                    quantization=None if as_given else self.quantization,
                    compute_type=self.compute_type, device=self.device,
                    too_long=self.too_long, inter_threads=self.inter_threads,
                    intra_threads=self.intra_threads, max_batch_size=self.max_batch_size,
                    hang_timeout_s=self.hang_timeout_s)

    def check(self, key: str, log=print) -> None:
        """A CTranslate2 directory has its tokenizer; a checkpoint is converted now (once)."""
        path = resolve_model(self.model, key=f"{key}.model")
        if os.path.isdir(path) and is_ct2_dir(path):
            if not os.path.isfile(os.path.join(path, "tokenizer.json")):
                raise ConfigError(f"{key}.model: {path} has no tokenizer.json; save the model's "
                                  "tokenizer there (AutoTokenizer.from_pretrained(<checkpoint>)"
                                  f".save_pretrained('{path}'))")
            return
        out = converted_dir(self.model, self.quantization)
        if is_ct2_dir(str(out)):
            return
        if self.model.startswith(("/", "./", "../", "~")) and not os.path.isdir(path):
            raise ConfigError(f"{key}.model: directory {self.model} does not exist")
        import tempfile

        log(f"[{key}] converting {self.model} to CTranslate2 ({self.quantization}) -> {out}")
        t0 = time.time()
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".tmp-", dir=out.parent) as tmp:
            try:
                convert_seq2seq(path, Path(tmp) / "model", quantization=self.quantization)
            except (OSError, ValueError, KeyError) as e:  # offline, missing, not seq2seq
                raise ConfigError(
                    f"{key}.model: cannot convert '{self.model}' to CTranslate2 ({e}). Give a "
                    "CTranslate2 directory, a Transformers encoder-decoder directory, or a hub "
                    "id in the local Hugging Face cache (hf download)") from None
            os.replace(Path(tmp) / "model", out)  # whole, or not at all
        log(f"[{key}] converted in {time.time() - t0:.0f}s")

    def call_options(self) -> dict:
        return {"too_long": self.too_long}


Spec = CT2Spec
