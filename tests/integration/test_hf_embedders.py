"""The LLM-CLIR paper's transformers bi-encoders (actors/hf_embedders.py) against their
reference implementations, on the tiny models of the same architectures (`xling models
tiny`: e5, mgte, repllama, nv_embed):

- E5: sentence-transformers loading the model's own modules (Transformer, mean Pooling,
  Normalize) and encoding the texts with the model card's "query: " / "passage: " prefixes;
- mGTE: the model card's transformers code (`tokenizer(texts, max_length=..., padding=True,
  truncation=True)`, `last_hidden_state[:, 0]`, `F.normalize(p=2)`), no prefix;
- NV-Embed-v2: its model code's computation written out here from the weights' file (its
  hub code does not load under transformers 5: docs/design.md): the inputs as its
  `input_transform_func` makes them (instruction + text + </s>, right padding with </s>),
  transformers' MistralModel under `_prepare_4d_attention_mask` (the non-causal mask it
  uses), the latent attention as einsums (pre-norms, cross attention to the latents, the
  GELU-gated MLP, residuals), the mean over `pool_mask` (the instruction's first tokens
  left out, as its `prepare_kwargs_from_batch`), L2-normalised;
- RepLLaMA: the model card's code, one text at a time (`tokenizer(f'query: {q}</s>')`, the
  last hidden state of the last token, L2-normalised), for a merged model and for a LoRA
  adapter merged the model card's way (PeftConfig, AutoModel, PeftModel.merge_and_unload).

Texts: the English CIRAL Hausa test-a queries and the BorderLines questions of 48 languages
(tests/data/README.md gives their sources), plus one long passage cut at max_length.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from xling.actors.embedder import EMPTY, make_embedder, vector_matrix  # noqa: E402

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_hf_embedders")

DATA = Path(__file__).resolve().parents[1] / "data"
QUERIES = [line.split("\t", 1)[1].strip() for line in
           (DATA / "topics" / "topics.ciral-v1.0-ha-test-a.tsv").read_text().splitlines()[:12]]
PASSAGES = list(json.loads((DATA / "text" / "real.json").read_text())
                ["texts"]["borderlines"]["text"].values())
LONG = " ".join(PASSAGES[:6])  # far over max_length: truncated
MAX_LENGTH = 96


def _embed(kind: str, model: str, role: str, texts: list[str], **settings) -> np.ndarray:
    emb = make_embedder(model, kind=kind, role=role, max_length=MAX_LENGTH, batch_size=5,
                        device="cpu", **settings)
    out = emb(pa.table({"text": pa.array(texts, pa.string())}))
    assert out["error"].null_count == len(texts), out["error"].to_pylist()
    return vector_matrix(out["dense"])


def _agreement(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max abs difference, min cosine) over rows; both sides are unit vectors."""
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    return float(np.abs(ours - ref).max()), float(cos.min())


def _check(ours: np.ndarray, ref: np.ndarray, label: str) -> None:
    diff, cos = _agreement(ours, ref)
    print(f"{label}: max |diff| {diff:.2e}, min cosine {cos:.8f}")
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert diff < 1e-5 and cos > 1 - 1e-6, (label, diff, cos)


@pytest.fixture(scope="module")
def e5(tiny_models) -> str:
    return tiny_models["e5"]


@pytest.fixture(scope="module")
def repllama(tiny_models) -> str:
    return tiny_models["repllama"]


@pytest.mark.parametrize("role", ["query", "passage"])
def test_e5_is_sentence_transformers(e5, role):
    from sentence_transformers import SentenceTransformer

    texts = (QUERIES if role == "query" else PASSAGES) + [LONG]
    ref_model = SentenceTransformer(e5, device="cpu")
    ref_model.max_seq_length = MAX_LENGTH
    # The model card: every input starts with "query: " or "passage: "; vectors normalised.
    ref = ref_model.encode([f"{role}: {t}" for t in texts], batch_size=7,
                           normalize_embeddings=True, convert_to_numpy=True)
    _check(_embed("e5", e5, role, texts), ref, f"e5 {role}")


@pytest.mark.parametrize("role", ["query", "passage"])
def test_mgte_is_the_model_card(tiny_models, role):
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = tiny_models["mgte"]
    texts = (QUERIES if role == "query" else PASSAGES) + [LONG]
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    batch = tokenizer(texts, max_length=MAX_LENGTH, padding=True, truncation=True,
                      return_tensors="pt")
    with torch.no_grad():
        ref = model.eval()(**batch).last_hidden_state[:, 0]
    ref = torch.nn.functional.normalize(ref, p=2, dim=1).numpy()
    _check(_embed("mgte", path, role, texts), ref, f"mgte {role}")


def test_mgte_remote_code_checkpoint_is_refused_with_the_fix(tiny_models, tmp_path):
    import shutil

    original = tmp_path / "gte-multilingual-base"
    shutil.copytree(tiny_models["mgte"], original)
    config = json.loads((original / "config.json").read_text())
    (original / "config.json").write_text(json.dumps({**config, "model_type": "new"}))
    with pytest.raises(ValueError, match="alibaba-nlp-community/gte-multilingual-base"):
        make_embedder(str(original), kind="mgte", device="cpu")


def _nv_embed_reference(path: str, role: str, texts: list[str]) -> np.ndarray:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, MistralConfig, MistralModel
    from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask

    config = json.loads((Path(path) / "config.json").read_text())
    weights = load_file(str(Path(path) / "model.safetensors"))
    decoder = MistralModel(MistralConfig(**{k: v for k, v in config["text_config"].items()
                                            if k not in ("_name_or_path", "model_type")}))
    decoder.load_state_dict({k.removeprefix("embedding_model."): v for k, v in weights.items()
                             if k.startswith("embedding_model.")})
    w = {k.removeprefix("latent_attention_model."): v for k, v in weights.items()
         if k.startswith("latent_attention_model.")}
    heads = config["latent_attention_config"]["num_cross_heads"]

    instruction = ("Instruct: Given a question, retrieve passages that answer the question\n"
                   "Query: " if role == "query" else "")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "right"
    batch = tokenizer([instruction + t + tokenizer.eos_token for t in texts], padding=True,
                      truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    mask = batch["attention_mask"]
    with torch.no_grad():
        h = decoder.eval()(input_ids=batch["input_ids"], use_cache=False,
                           attention_mask=_prepare_4d_attention_mask(mask, torch.float32)
                           ).last_hidden_state

        def norm(x, name):
            return torch.nn.functional.layer_norm(x, x.shape[-1:], w[f"{name}.weight"],
                                                  w[f"{name}.bias"])

        x = norm(h, "cross_attend_blocks.0.norm")
        c = norm(w["latents"], "cross_attend_blocks.0.norm_context")
        q = x @ w["cross_attend_blocks.0.fn.to_q.weight"].T
        k, v = (c @ w["cross_attend_blocks.0.fn.to_kv.weight"].T).chunk(2, dim=-1)
        q = q.unflatten(-1, (heads, -1))                      # b n h d
        k, v = k.unflatten(-1, (heads, -1)), v.unflatten(-1, (heads, -1))  # r h d
        att = torch.einsum("bnhd,rhd->bhnr", q, k) / q.shape[-1] ** 0.5
        out = torch.einsum("bhnr,rhd->bnhd", att.softmax(-1), v).flatten(-2)
        h = out @ w["cross_attend_blocks.0.fn.to_out.weight"].T + h
        y = norm(h, "cross_attend_blocks.1.norm")
        ff = "cross_attend_blocks.1.fn.net"
        y = y @ w[f"{ff}.0.weight"].T + w[f"{ff}.0.bias"]
        a, gates = y.chunk(2, dim=-1)
        h = (a * torch.nn.functional.gelu(gates)) @ w[f"{ff}.2.weight"].T + w[f"{ff}.2.bias"] + h
        pool = mask.clone()
        if instruction:
            pool[:, :len(tokenizer.tokenize(instruction))] = 0
        vec = (h * pool.unsqueeze(-1)).sum(1) / pool.sum(1, keepdim=True)
    return torch.nn.functional.normalize(vec, p=2, dim=-1).numpy()


@pytest.mark.parametrize("role", ["query", "passage"])
def test_nv_embed_is_its_model_code(tiny_models, role):
    path = tiny_models["nv_embed"]
    texts = (QUERIES if role == "query" else PASSAGES) + [LONG]
    _check(_embed("nv-embed", path, role, texts), _nv_embed_reference(path, role, texts),
           f"nv-embed {role}")


def _card_vectors(model, tokenizer, role: str, texts: list[str]) -> np.ndarray:
    """castorini/repllama-v1-7b-lora-passage's model card, one text at a time."""
    import torch

    out = []
    for t in texts:
        inputs = tokenizer(f"{role}: {t}</s>", return_tensors="pt")
        with torch.no_grad():
            vec = model(**inputs).last_hidden_state[0][-1]
        out.append(torch.nn.functional.normalize(vec, p=2, dim=0).numpy())
    return np.stack(out)


def _untruncated(tokenizer, role: str, texts: list[str]) -> list[str]:
    """The texts within max_length: the card's code does not truncate."""
    texts = [t for t in texts if len(tokenizer(f"{role}: {t}</s>")["input_ids"]) <= MAX_LENGTH]
    assert len(texts) >= 6
    return texts


@pytest.mark.parametrize("role", ["query", "passage"])
def test_repllama_is_the_model_card(repllama, role):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(repllama)
    texts = _untruncated(tokenizer, role, QUERIES if role == "query" else PASSAGES)
    ref = _card_vectors(AutoModel.from_pretrained(repllama).eval(), tokenizer, role, texts)
    _check(_embed("repllama", repllama, role, texts), ref, f"repllama {role}")


def test_repllama_lora_adapter_is_merged_as_the_model_card_does(repllama, tmp_path):
    import torch
    from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model
    from transformers import AutoModel, AutoTokenizer

    # RepLLaMA's adapter: LoRA on the attention and MLP projections of Llama-2 (random, not
    # zero, B matrices so that merging it changes the vectors).
    torch.manual_seed(0)
    peft = get_peft_model(AutoModel.from_pretrained(repllama), LoraConfig(
        r=4, lora_alpha=8, init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"]))
    adapter = tmp_path / "adapter"
    peft.save_pretrained(adapter)

    config = PeftConfig.from_pretrained(adapter)
    base = AutoModel.from_pretrained(config.base_model_name_or_path)
    card = PeftModel.from_pretrained(base, adapter).merge_and_unload().eval()
    tokenizer = AutoTokenizer.from_pretrained(config.base_model_name_or_path)
    texts = _untruncated(tokenizer, "query", QUERIES)
    ours = _embed("repllama", str(adapter), "query", texts)
    _check(ours, _card_vectors(card, tokenizer, "query", texts), "repllama LoRA query")
    plain = _embed("repllama", repllama, "query", texts)
    assert _agreement(ours, plain)[0] > 1e-3  # the adapter is applied


def test_repllama_truncates_before_its_eos(repllama):
    emb = make_embedder(repllama, kind="repllama", role="passage", max_length=16, device="cpu")
    ids = emb._input_ids([LONG, "kurz"])
    assert len(ids[0]) == 16 and ids[0][-1] == emb.tokenizer.eos_token_id
    assert ids[1][-1] == emb.tokenizer.eos_token_id and len(ids[1]) < 16
    # The text's own tokens, <s> and the appended </s>; no prefix.
    assert emb.count_tokens(["kurz"]) == [len(emb.tokenizer("kurz")["input_ids"]) + 1]


def test_roles_rows_and_settings(e5):
    emb = make_embedder(e5, kind="e5", max_length=MAX_LENGTH, device="cpu")
    batch = pa.table({"text": pa.array(["Wasser kocht.", "", None, "Maji yanachemka."]),
                      "error": pa.array([None, None, None, "upstream"], pa.string())})
    with pytest.raises(ValueError, match="queries or passages"):
        emb(batch)
    query, passage = emb.with_settings(role="query"), emb.with_settings(role="passage")
    assert (query.fingerprint, passage.fingerprint) == (
        {"max_length": MAX_LENGTH, "fp16": False, "role": "query"},
        {"max_length": MAX_LENGTH, "fp16": False, "role": "passage"})
    q, p = query(batch), passage(batch)
    assert q["error"].to_pylist() == [None, EMPTY, EMPTY, "upstream"]
    assert q["dense"].null_count == 3 and q.column_names == ["text", "error", "dense"]
    # The prefix is part of the input: one text, two vectors.
    assert not np.allclose(vector_matrix(q["dense"])[0], vector_matrix(p["dense"])[0])
    with pytest.raises(ValueError, match="dense vectors only"):
        emb.with_settings(sparse=True)
    with pytest.raises(ValueError, match="role must be one of"):
        emb.with_settings(role="document")
    assert emb.info["dim"] == 64 and emb.info["pooling"] == "mean"
