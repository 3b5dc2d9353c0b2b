"""Bi-encoders run with transformers' `AutoModel`: the LLM-CLIR paper's first stages beside
BGE-M3 (paper §3, "first-stage retrievers"), each the pooling, prefixes and normalisation
its model card prescribes, behind the `Embedder` protocol of actors/embedder.py.

    e5        intfloat/multilingual-e5-large: XLM-R encoder, mean pooling over the attention
              mask, "query: " / "passage: " prefixes, L2-normalised, 512 tokens (model card,
              https://huggingface.co/intfloat/multilingual-e5-large: `average_pool`, "Each
              input text should start with 'query: ' or 'passage: '", `max_length=512`,
              `F.normalize(p=2)`; its sentence-transformers files: Pooling mean, Normalize).
    repllama  castorini/repllama-v1-7b-lora-passage: Llama-2-7B with a LoRA adapter, the
              hidden state of an appended </s> (last token), "query: " / "passage: "
              prefixes, L2-normalised (model card,
              https://huggingface.co/castorini/repllama-v1-7b-lora-passage:
              `tokenizer(f'query: {query}</s>')`, `last_hidden_state[0][-1]`, `normalize`;
              the adapter is merged into the base model named by its adapter_config.json,
              `PeftModel.from_pretrained(...).merge_and_unload()`).
    mgte      Alibaba-NLP/gte-multilingual-base: its "new" encoder (RoPE, gated MLP), the
              hidden state of the first token ([CLS] = <s>), no prefix, L2-normalised, up to
              8192 tokens (model card, https://huggingface.co/Alibaba-NLP/gte-multilingual-base:
              `outputs.last_hidden_state[:, 0]`, `F.normalize(p=2)`, `max_length=8192`; its
              1_Pooling/config.json: pooling_mode_cls_token). transformers 5 runs it natively as
              `GteModel` (model_type "gte", the converted checkpoint
              alibaba-nlp-community/gte-multilingual-base); the original checkpoint's
              model_type "new" needs trust_remote_code code, refused with the fix named.
    nv-embed  nvidia/NV-Embed-v2: Mistral-7B made bidirectional, latent-attention pooling,
              the query instruction; see the section at the end of this module.

A text longer than `max_length` tokens (prefix and special tokens included) is truncated
from the end. RepLLaMA's </s> is appended after truncation, so it always ends the input;
NV-Embed-v2's is text before tokenization, as its model code adds it, so a cut text loses it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from pathlib import Path

import numpy as np

from xling.actors.embedder import RowEmbedder

log = logging.getLogger(__name__)

ROLES = ("query", "passage")


class TransformersEmbedder(RowEmbedder):
    """A bi-encoder of `AutoModel` + `AutoTokenizer`: a subclass names its `POOLING` ("mean"
    over the attention mask, "cls": the first token, or "last": the appended end-of-sequence
    token) and its `PREFIXES` per role. Dense vectors only, L2-normalised, float32.

    `role` ("query" or "passage") is a per-call setting (index embeds passages, retrieve
    queries); a call without one fails before any work. `use_fp16` is honoured on CUDA only,
    as M3Embedder does. `batch_size` texts go through the model at a time, longest first
    within a call so each forward batch pads little."""

    POOLING = "mean"
    PREFIXES = {"query": "", "passage": ""}
    APPEND_EOS = False
    PER_CALL = ("max_length", "batch_size", "text_column", "role", "dense", "sparse", "colbert")
    OUTPUTS = ("dense",)

    def __init__(self, model: str, max_length: int = 512, batch_size: int = 32,
                 use_fp16: bool = False, dense: bool = True, sparse: bool = False,
                 colbert: bool = False, text_column: str = "text", device: str | None = None,
                 role: str | None = None):
        import torch

        self.name = type(self).__name__
        self._check(dense, sparse, colbert, role, max_length)  # before the load
        if device is None:
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        note, asked_fp16 = None, use_fp16
        if use_fp16 and not (device.startswith("cuda") and torch.cuda.is_available()):
            note = f"use_fp16 ignored: half precision is only used on CUDA, not on {device}"
            log.warning("%s: %s", self.name, note)
            use_fp16 = False
        self.tokenizer, self.model = self._load(model, torch.float16 if use_fp16 else
                                                torch.float32)
        self.model.to(device).eval()
        self.max_length, self.batch_size, self.text_column = max_length, batch_size, text_column
        self.role = role
        self.device = device
        self._fingerprint = {"max_length": max_length, "fp16": asked_fp16}
        self.info = {"model": model, "dim": int(self.model.config.hidden_size),
                     "device": str(next(self.model.parameters()).device),
                     "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
                     "use_fp16": use_fp16, "max_length": max_length, "role": role,
                     "pooling": self.POOLING, "note": note}

    def _load(self, model: str, dtype):
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        return tokenizer, AutoModel.from_pretrained(model, dtype=dtype)

    def _check(self, dense, sparse, colbert, role, max_length) -> None:
        if sparse or colbert or not dense:
            raise ValueError(f"{self.name}: dense vectors only (sparse and ColBERT outputs "
                             "are BGE-M3's: index.dense.embedder: bge-m3)")
        if role is not None and role not in ROLES:
            raise ValueError(f"{self.name}: role must be one of {ROLES}, not {role!r}")
        if max_length < 2 + self.APPEND_EOS:
            raise ValueError(f"{self.name}: max_length {max_length} is too short")

    def with_settings(self, **per_call) -> "TransformersEmbedder":
        """The same loaded model with other `PER_CALL` settings (no second load)."""
        unknown = set(per_call) - set(self.PER_CALL)
        if unknown:
            raise ValueError(f"{self.name}: {sorted(unknown)} change the loaded model, not a "
                             f"call; per-call settings are {list(self.PER_CALL)}")
        merged = {"dense": True, "sparse": False, "colbert": False, "role": self.role,
                  "max_length": self.max_length, **per_call}
        self._check(merged["dense"], merged["sparse"], merged["colbert"], merged["role"],
                    merged["max_length"])
        other = copy.copy(self)
        for name in ("max_length", "batch_size", "text_column", "role"):
            if name in per_call:
                setattr(other, name, per_call[name])
        other._fingerprint = {**self._fingerprint, "max_length": other.max_length}
        other.info = {**self.info, "max_length": other.max_length, "role": other.role}
        return other

    @property
    def fingerprint(self) -> dict:
        """The settings as asked for, and the role: a query and a passage of the same text
        get different vectors."""
        return {**self._fingerprint, "role": self.role}

    def count_tokens(self, texts: list[str]) -> list[int]:
        backend = self.tokenizer.backend_tokenizer
        backend.no_truncation()
        backend.no_padding()
        extra = int(self.APPEND_EOS)
        return [len(e) + extra for e in backend.encode_batch_fast(texts, add_special_tokens=True)]

    def __call__(self, batch):
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: say whether the texts are queries or passages "
                             f"(role: {' or '.join(ROLES)})")
        return super().__call__(batch)

    # ---- encoding --------------------------------------------------------------------
    def _input_ids(self, texts: list[str]) -> list[list[int]]:
        prefix = self.PREFIXES[self.role]
        room = self.max_length - int(self.APPEND_EOS)
        ids = self.tokenizer([prefix + t for t in texts], truncation=True, max_length=room,
                             add_special_tokens=True)["input_ids"]
        if self.APPEND_EOS:
            ids = [seq + [self.tokenizer.eos_token_id] for seq in ids]
        return ids

    def _encode_batch(self, texts: list[str]) -> list[dict]:
        import torch

        ids = self._input_ids(texts)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        pad = self.tokenizer.pad_token_id
        pad = pad if pad is not None else 0  # right padding under the mask: any id works
        out = np.zeros((len(ids), self.info["dim"]), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            width = max(len(ids[i]) for i in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                input_ids[row, :len(ids[i])] = torch.tensor(ids[i])
                mask[row, :len(ids[i])] = 1
            input_ids, mask = input_ids.to(self.device), mask.to(self.device)
            with torch.inference_mode():
                vecs = torch.nn.functional.normalize(self._forward(input_ids, mask), p=2, dim=-1)
            out[chunk] = vecs.cpu().numpy()
        return [{"dense": v} for v in out]

    def _forward(self, input_ids, mask):
        """The pooled (not yet normalised) float32 vectors of one padded batch."""
        hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        return self._pool(hidden.float(), mask)

    def _pool(self, hidden, mask):
        if self.POOLING == "mean":
            m = mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * m).sum(dim=1) / m.sum(dim=1)
        if self.POOLING == "cls":
            return hidden[:, 0]
        if self.POOLING == "last":  # right padding: the last attended position
            import torch

            last = mask.sum(dim=1) - 1
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        raise ValueError(f"{self.name}: unknown pooling {self.POOLING!r}")


class E5Embedder(TransformersEmbedder):
    """multilingual-e5 (small/base/large; the paper uses large): mean pooling, prefixes."""

    POOLING = "mean"
    PREFIXES = {"query": "query: ", "passage": "passage: "}


class MGTEEmbedder(TransformersEmbedder):
    """gte-multilingual-base: first-token ([CLS]) pooling, no prefixes."""

    POOLING = "cls"

    def _load(self, model: str, dtype):
        config = Path(model) / "config.json"
        if config.is_file() and json.loads(config.read_text()).get("model_type") == "new":
            raise ValueError(
                f"{self.name}: {model} is the trust_remote_code checkpoint (model_type 'new', "
                "code from Alibaba-NLP/new-impl, not installed); use the same weights in "
                "transformers' own format, alibaba-nlp-community/gte-multilingual-base "
                "(model_type 'gte', GteModel)")
        return super()._load(model, dtype)


class RepLlamaEmbedder(TransformersEmbedder):
    """RepLLaMA: last-token (appended </s>) pooling of a Llama decoder, prefixes. `model` is
    a merged model or a LoRA adapter folder (adapter_config.json) whose base model is a
    local path or a hub id in the local Hugging Face cache; the tokenizer is the base's."""

    POOLING = "last"
    PREFIXES = {"query": "query: ", "passage": "passage: "}
    APPEND_EOS = True

    def _load(self, model: str, dtype):
        from transformers import AutoModel, AutoTokenizer

        adapter = Path(model) / "adapter_config.json"
        if not adapter.is_file():
            tokenizer = AutoTokenizer.from_pretrained(model)
            return tokenizer, AutoModel.from_pretrained(model, dtype=dtype)
        from peft import PeftModel

        base = json.loads(adapter.read_text())["base_model_name_or_path"]
        tokenizer = AutoTokenizer.from_pretrained(base)
        merged = PeftModel.from_pretrained(AutoModel.from_pretrained(base, dtype=dtype),
                                           model).merge_and_unload()
        return tokenizer, merged


# ---- NV-Embed-v2 -----------------------------------------------------------------------
# nvidia/NV-Embed-v2 (paper L97; Lee et al., ICLR 2025): Mistral-7B with its causal mask
# removed, then a latent-attention layer: the token states attend to 512 trained latents
# (8 heads, cross attention, no mask), a GELU-gated MLP, both with residuals and pre-layer
# norms, then the mean over the tokens, instruction tokens left out, L2-normalised. Its hub
# code (modeling_nvembed.py, trust_remote_code) targets transformers 4.42 and does not load
# under transformers 5; this is the same computation on transformers' MistralModel, the
# checkpoint's weights loaded under its own names (`embedding_model.*`,
# `latent_attention_model.*`). Model card (https://huggingface.co/nvidia/NV-Embed-v2): queries
# get "Instruct: Given a question, retrieve passages that answer the question\nQuery: ",
# passages nothing; every input ends in </s> before tokenization (`add_eos`), padding on the
# right with </s>.


class LatentAttention:
    """Builds the latent-attention pooling module (torch is imported on use)."""

    @staticmethod
    def build(hidden: int, num_latents: int, heads: int, dim_head: int):
        import torch
        from torch import nn

        class CrossAttention(nn.Module):
            def __init__(self):
                super().__init__()
                inner = heads * dim_head
                self.to_q = nn.Linear(hidden, inner, bias=False)
                self.to_kv = nn.Linear(hidden, 2 * inner, bias=False)
                self.to_out = nn.Linear(inner, hidden, bias=False)

            def forward(self, x, context):
                b, n, _ = x.shape
                q = self.to_q(x).view(b, n, heads, dim_head).transpose(1, 2)
                k, v = (t.view(b, -1, heads, dim_head).transpose(1, 2)
                        for t in self.to_kv(context).chunk(2, dim=-1))
                out = nn.functional.scaled_dot_product_attention(q, k, v)
                return self.to_out(out.transpose(1, 2).reshape(b, n, heads * dim_head))

        class GatedFeedForward(nn.Module):
            def __init__(self, mult: int = 4):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(hidden, hidden * mult * 2), nn.Identity(),
                                         nn.Linear(hidden * mult, hidden))

            def forward(self, x):
                x, gates = self.net[0](x).chunk(2, dim=-1)
                return self.net[2](x * nn.functional.gelu(gates))

        class PreNorm(nn.Module):
            def __init__(self, fn, context: bool):
                super().__init__()
                self.fn, self.norm = fn, nn.LayerNorm(hidden)
                self.norm_context = nn.LayerNorm(hidden) if context else None

            def forward(self, x, context=None):
                if self.norm_context is None:
                    return self.fn(self.norm(x))
                return self.fn(self.norm(x), self.norm_context(context))

        class Pooling(nn.Module):
            def __init__(self):
                super().__init__()
                self.cross_attend_blocks = nn.ModuleList([PreNorm(CrossAttention(), True),
                                                          PreNorm(GatedFeedForward(), False)])
                self.latents = nn.Parameter(torch.zeros(num_latents, hidden))

            def forward(self, hidden_states, pool_mask):
                attend, feed = self.cross_attend_blocks
                latents = self.latents.unsqueeze(0).expand(hidden_states.shape[0], -1, -1)
                h = attend(hidden_states, latents) + hidden_states
                h = feed(h) + h
                m = pool_mask.unsqueeze(-1).to(h.dtype)
                return (h * m).sum(dim=1) / m.sum(dim=1)

        return Pooling()


class NVEmbedEmbedder(TransformersEmbedder):
    """NV-Embed-v2: bidirectional Mistral + latent-attention pooling; the query instruction
    is left out of the pooling as the model's code does (its first n positions, n = the
    instruction's token count without <s>)."""

    POOLING = "latent"
    PREFIXES = {"query": "Instruct: Given a question, retrieve passages that answer the "
                         "question\nQuery: ", "passage": ""}

    def _load(self, model: str, dtype):
        from safetensors import safe_open
        from transformers import AutoTokenizer, MistralConfig, MistralModel

        config = json.loads((Path(model) / "config.json").read_text())
        text = {k: v for k, v in config["text_config"].items()
                if k not in ("_name_or_path", "architectures", "model_type", "auto_map")}
        with _quiet_transformers():
            # The pooling's weights are in the same files: loaded below, not unexpected.
            decoder = MistralModel.from_pretrained(
                model, config=MistralConfig(**text), dtype=dtype,
                key_mapping={r"^embedding_model\.": ""})
        for layer in decoder.layers:
            layer.self_attn.is_causal = False
        la = config["latent_attention_config"]
        pooling = LatentAttention.build(la["hidden_dim"], la["num_latents_value"],
                                        la["num_cross_heads"], la["cross_dim_head"])
        prefix, state = "latent_attention_model.", {}
        for shard in sorted(Path(model).glob("*.safetensors")):
            with safe_open(str(shard), "pt") as f:
                for key in f.keys():
                    if key.startswith(prefix):
                        state[key[len(prefix):]] = f.get_tensor(key)
        pooling.load_state_dict(state)
        with _quiet_transformers():  # it reads config.json, of a model_type it does not know
            tokenizer = AutoTokenizer.from_pretrained(model)
        tokenizer.pad_token = tokenizer.eos_token  # the model's add_pad_token
        return tokenizer, _NVEmbed(decoder, pooling.to(dtype))

    def _input_ids(self, texts: list[str]) -> list[list[int]]:
        # </s> is text before tokenization, as the model's code adds it: a text cut at
        # max_length loses it.
        prefix, eos = self.PREFIXES[self.role], self.tokenizer.eos_token
        return self.tokenizer([prefix + t + eos for t in texts], truncation=True,
                              max_length=self.max_length)["input_ids"]

    def _forward(self, input_ids, mask):
        from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask

        decoder = self.model.decoder
        full = _prepare_4d_attention_mask(mask, decoder.dtype)  # every token sees every token
        hidden = decoder(input_ids=input_ids, attention_mask=full, use_cache=False
                         ).last_hidden_state
        pool = mask.clone()
        prefix = self.PREFIXES[self.role]
        if prefix:
            pool[:, :len(self.tokenizer.tokenize(prefix))] = 0
        return self.model.pooling(hidden, pool).float()


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _NVEmbed(decoder, pooling):
    """The decoder and the pooling as one module (one `.to(device)`, `.eval()`, dtype)."""
    import torch

    class NVEmbed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder, self.pooling = decoder, pooling
            self.config = decoder.config

    return NVEmbed()
