"""The tiny offline models load through the same code paths as the real ones.

The tests work on one copy of the session's models (`make test` builds them first, ~20 s of
CPU cold on 2 cores) and rebuild it once; the vLLM test starts the engine in a subprocess (~30 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from xling.dev import tiny_models
from xling.core.models import VLLM_CPU_ENV
from xling.dev.tiny_models import MARKER, build_tiny_models, tiny_model_paths

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Its tests share one copy of the session's models in a temporary folder: one xdist worker runs
# them all, so the copy is made once, not once per worker (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_tiny_models")

ALL = ("nllb_hf", "nllb_ct2", "bge_m3", "llama_chat", "nli_deberta", "xlmr_reranker", "aya_hf",
       "aya_ct2", "e5", "repllama", "mgte", "nv_embed")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, tiny_models) -> dict[str, Path]:
    """A copy of the session's models, which these tests damage and rebuild. `make test` builds
    them first (`xling models tiny`, from scratch on a clean clone), so the second build that
    must reproduce them byte for byte is test_force_rebuild_is_byte_identical's."""
    shared = Path(tiny_models["nllb_hf"]).parent
    root = tmp_path_factory.mktemp("tiny-models") / "tiny"
    shutil.copytree(shared, root, ignore=shutil.ignore_patterns(".lock", ".tmp-*", ".old-*"))
    return tiny_model_paths(root)


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


# ------------------------------------------------------------------------------------------
# Paths, cache, determinism


def test_paths_and_markers(tiny):
    root = tiny["nllb_hf"].parent
    assert tiny == tiny_model_paths(root)
    assert list(tiny) == list(ALL)
    for name, path in tiny.items():
        assert path.is_absolute() and path.is_dir()
        marker = json.loads((path / MARKER).read_text())
        assert marker["build_version"] == tiny_models.BUILD_VERSION
        assert marker["name"] == name
        assert set(marker["files"]) == {
            p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != MARKER
        }
        assert oct(path.stat().st_mode & 0o777) == oct(0o755)
    # The CT2 model records which nllb_hf build it was converted from.
    ct2 = json.loads((tiny["nllb_ct2"] / MARKER).read_text())
    hf = json.loads((tiny["nllb_hf"] / MARKER).read_text())
    assert ct2["sources"] == {"nllb_hf": hf["content_sha256"]}
    # No half-built folders left behind.
    assert not list(root.glob(".tmp-*")) and not list(root.glob(".old-*"))


def test_default_cache_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("XLING_CACHE", str(tmp_path / "cache"))
    assert tiny_model_paths()["bge_m3"] == tmp_path / "cache" / "models" / "tiny" / "bge_m3"


def test_second_call_reuses_cache(tiny, capfd):
    root = tiny["nllb_hf"].parent
    before = _snapshot(root)
    t0 = time.perf_counter()
    assert build_tiny_models(root, progress=True) == tiny
    assert time.perf_counter() - t0 < 5
    assert _snapshot(root) == before  # same bytes, same mtimes: nothing rewritten
    assert "all tiny models current" in capfd.readouterr().err


def test_cache_hit_does_not_import_torch(tiny):
    # The cache check must stay cheap for a Ray driver: no torch/transformers import.
    code = (
        "import sys, json; from xling.dev.tiny_models import build_tiny_models; "
        f"build_tiny_models({str(tiny['nllb_hf'].parent)!r}, progress=False); "
        "print(json.dumps([m in sys.modules for m in ('torch', 'transformers', 'ctranslate2')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False, False]


def test_partial_or_damaged_models_are_rebuilt(tiny, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(tiny["nllb_hf"].parent, root)
    original = _snapshot(root)
    (root / "llama_chat" / MARKER).unlink()  # as if killed before the marker was written
    with open(root / "bge_m3" / "model.safetensors", "r+b") as fh:  # damaged weights
        fh.truncate(100)
    marker = json.loads((root / "nllb_ct2" / MARKER).read_text())
    marker["sources"]["nllb_hf"] = "0" * 64  # converted from an nllb_hf that no longer exists
    (root / "nllb_ct2" / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    (root / ".tmp-nllb_hf-killed").mkdir()  # leftover of a killed build
    (root / ".tmp-nllb_hf-killed" / "config.json").write_text("{}")

    build_tiny_models(root, progress=False)

    after = _snapshot(root)
    assert set(after) == set(original)
    for rel, (data, mtime) in after.items():
        assert data == original[rel][0], rel  # rebuilt byte-identically
        rebuilt = rel.startswith(("llama_chat/", "bge_m3/", "nllb_ct2/"))
        assert (mtime != original[rel][1]) == rebuilt, rel
    assert not (root / ".tmp-nllb_hf-killed").exists()


def test_force_rebuild_is_byte_identical(tiny, tmp_path):
    # A second, forced build (into a copy of the session cache, so it has something to
    # replace) rewrites every file and reproduces every byte: weights (model.safetensors, CT2
    # model.bin, the FlagEmbedding *.pt heads), tokenizers and markers alike.
    root = tmp_path / "copy"
    shutil.copytree(tiny["nllb_hf"].parent, root)
    before = _snapshot(root)
    cpu0 = time.process_time()
    assert build_tiny_models(root, force=True, progress=False) == tiny_model_paths(root)
    cpu = time.process_time() - cpu0
    # ~20 s of CPU on 2 cores. CPU time rather than wall time, so a machine busy with other
    # jobs does not make this flaky.
    assert cpu < 60, f"tiny model build used {cpu:.1f}s of CPU"
    after = _snapshot(root)
    assert set(after) == set(before)
    for rel in after:
        # `before` is the session cache's build: a builder changed without a BUILD_VERSION
        # bump differs here (the cache kept the old build as current).
        assert after[rel][0] == before[rel][0], f"{rel} differs between two builds"
        assert after[rel][1] != before[rel][1], f"{rel} was not rebuilt"
    weights = ["nllb_hf/model.safetensors", "nllb_ct2/model.bin", "bge_m3/model.safetensors",
               "bge_m3/colbert_linear.pt", "bge_m3/sparse_linear.pt", "llama_chat/model.safetensors"]
    assert all(len(after[w][0]) > 1000 for w in weights)


# ------------------------------------------------------------------------------------------
# NLLB: tokenizer, transformers model, CTranslate2


def test_nllb_tokenizer_matches_real_layout(tiny):
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    tok = AutoTokenizer.from_pretrained(tiny["nllb_hf"], src_lang="fin_Latn")
    assert type(tok).__name__ == "NllbTokenizer"
    text = "Joki virtaa vanhan kaupungin läpi."
    tokens = tok.convert_ids_to_tokens(tok.encode(text))
    assert tokens[0] == "fin_Latn" and tokens[-1] == "</s>" and len(tokens) > 4
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text

    assert [tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    code_ids = tok.convert_tokens_to_ids(list(FAIRSEQ_LANGUAGE_CODES))
    assert len(FAIRSEQ_LANGUAGE_CODES) == 202
    # Like facebook/nllb-200-*: the 202 codes follow the sentencepiece pieces, <mask> is last.
    assert code_ids == list(range(code_ids[0], code_ids[0] + 202))
    assert tok.mask_token_id == len(tok) - 1 == code_ids[-1] + 1

    config = AutoConfig.from_pretrained(tiny["nllb_hf"])
    assert config.model_type == "m2m_100" and config.vocab_size == len(tok)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (1, 0, 2)
    assert config.decoder_start_token_id == 2

    # Every script in the training text has pieces of its own (not <unk>).
    for lang, sentence in [("rus_Cyrl", "Река течёт через старый город."),
                           ("arb_Arab", "أين أقرب محطة قطار؟"),
                           ("hin_Deva", "नदी पुराने शहर से होकर बहती है।"),
                           ("zho_Hans", "河流穿过古老的城市。"),
                           ("amh_Ethi", "ወንዙ በአሮጌው ከተማ ውስጥ ይፈሳል።")]:
        tok.src_lang = lang
        ids = tok(sentence)["input_ids"]
        assert ids[0] == tok.convert_tokens_to_ids(lang)
        assert tok.unk_token_id not in ids, lang


def test_aya_matches_mt5_layout(tiny):
    """tiny:aya_hf has Aya-101's (mT5's) layout: T5Tokenizer ids <pad>=0 </s>=1 <unk>=2 and no
    sentinels, an embedding matrix padded past the vocabulary, an untied output layer."""
    import json

    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny["aya_hf"])
    assert type(tok).__name__ == "T5Tokenizer"
    assert [tok.pad_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2]
    assert tok.bos_token_id is None and not [t for t in tok.get_vocab() if "extra_id" in t]
    text = "Река течёт через старый город."
    assert tok.convert_ids_to_tokens(tok.encode(text))[-1] == "</s>"
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text
    config = AutoConfig.from_pretrained(tiny["aya_hf"])
    assert config.model_type == "mt5" and config.vocab_size % 16 == 0 >= len(tok) - config.vocab_size
    assert (config.feed_forward_proj, config.decoder_start_token_id) == ("gated-gelu", 0)
    assert json.loads((tiny["aya_hf"] / "config.json").read_text())["tie_word_embeddings"] is False
    assert (tiny["aya_ct2"] / "model.bin").is_file() and (tiny["aya_ct2"] / "tokenizer.json").is_file()


def test_ct2_translation(tiny):
    import ctranslate2
    from transformers import AutoTokenizer

    ct2_dir = tiny["nllb_ct2"]
    assert {"model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json",
            "tokenizer_config.json", "sentencepiece.bpe.model"} <= {p.name for p in ct2_dir.iterdir()}
    # One folder serves both the translator and the tokenizer.
    tok = AutoTokenizer.from_pretrained(ct2_dir, src_lang="fin_Latn")
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu")

    sources = [("fin_Latn", "Joki virtaa vanhan kaupungin läpi."),
               ("eng_Latn", "Where is the nearest train station?"),
               ("zho_Hans", "最近的火车站在哪里？")]
    batch = []
    for lang, text in sources:
        tok.src_lang = lang
        batch.append(tok.convert_ids_to_tokens(tok.encode(text)))
    assert batch[0][0] == "fin_Latn" and batch[0][-1] == "</s>"

    results = translator.translate_batch(
        batch, target_prefix=[["deu_Latn"], ["fra_Latn"], ["deu_Latn"]], max_decoding_length=16
    )
    for result, prefix in zip(results, ["deu_Latn", "fra_Latn", "deu_Latn"], strict=True):
        hyp = result.hypotheses[0]
        assert hyp[0] == prefix and 1 < len(hyp) <= 16
        text = tok.decode(tok.convert_tokens_to_ids(hyp), skip_special_tokens=True)
        # The short copy-task training makes output non-empty (gibberish, but real pieces).
        assert isinstance(text, str) and text.strip()


def test_ct2_matches_transformers_greedy(tiny):
    # The conversion kept the weights: CT2 and transformers pick the same greedy tokens.
    import ctranslate2
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny["nllb_hf"], src_lang="eng_Latn")
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny["nllb_hf"]).eval()
    assert type(model).__name__ == "M2M100ForConditionalGeneration"
    text = "Children are playing football in the park."
    deu = tok.convert_tokens_to_ids("deu_Latn")
    with torch.no_grad():
        hf = model.generate(**tok([text], return_tensors="pt"), forced_bos_token_id=deu,
                            max_new_tokens=8, num_beams=1, do_sample=False)[0].tolist()
    assert hf[:2] == [2, deu]  # decoder_start_token_id = </s>, then the forced language

    translator = ctranslate2.Translator(str(tiny["nllb_ct2"]), device="cpu")
    ct2 = translator.translate_batch([tok.convert_ids_to_tokens(tok.encode(text))],
                                     target_prefix=[["deu_Latn"]], beam_size=1,
                                     max_decoding_length=9)[0].hypotheses[0]
    ct2_ids = tok.convert_tokens_to_ids(ct2)
    hf_ids = [i for i in hf[1:] if i != tok.pad_token_id]
    if hf_ids[-1] == tok.eos_token_id:
        hf_ids = hf_ids[:-1]  # CT2 leaves </s> out of the hypothesis
    n = min(len(ct2_ids), len(hf_ids))
    assert n >= 2 and ct2_ids[:n] == hf_ids[:n]


# ------------------------------------------------------------------------------------------
# BGE-M3 through FlagEmbedding


def test_bge_m3_flag_embedding(tiny):
    import numpy as np
    import torch
    from FlagEmbedding import BGEM3FlagModel

    path = tiny["bge_m3"]
    assert {"colbert_linear.pt", "sparse_linear.pt", "config.json", "model.safetensors",
            "tokenizer.json", "sentencepiece.bpe.model"} <= {p.name for p in path.iterdir()}
    model = BGEM3FlagModel(str(path), use_fp16=False, devices="cpu")
    assert type(model.tokenizer).__name__ == "XLMRobertaTokenizer"
    # FlagEmbedding loaded the saved heads (it silently re-initialises them if a file is missing).
    for head in ("colbert_linear", "sparse_linear"):
        saved = torch.load(path / f"{head}.pt", map_location="cpu", weights_only=True)
        assert set(saved) == {"weight", "bias"}
        assert torch.equal(getattr(model.model, head).weight.detach().cpu(), saved["weight"])

    texts = ["Where is the nearest train station?", "Wo ist der nächste Bahnhof?",
             "最近的火车站在哪里？"]
    out = model.encode(texts, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    hidden = model.model.model.config.hidden_size
    dense = out["dense_vecs"]
    assert dense.shape == (3, hidden)
    np.testing.assert_allclose(np.linalg.norm(dense, axis=1), 1.0, rtol=1e-5)

    for text, weights, colbert in zip(texts, out["lexical_weights"], out["colbert_vecs"], strict=True):
        ids = model.tokenizer(text)["input_ids"]
        assert weights and all(float(w) > 0 for w in weights.values())
        assert {int(k) for k in weights} <= set(ids) - {0, 1, 2, 3}  # no special tokens
        assert colbert.shape == (len(ids) - 1, hidden)  # every token but [CLS]
        assert np.isfinite(colbert).all()

    scores = model.compute_score([(texts[0], texts[1]), (texts[0], texts[0])])
    assert scores["dense"][1] == pytest.approx(1.0, abs=1e-4)
    assert scores["colbert"][1] == pytest.approx(1.0, abs=1e-4)


# ------------------------------------------------------------------------------------------
# Llama chat model: transformers and vLLM

MESSAGES = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Wo ist der nächste Bahnhof?"}]


def _hf_chat_greedy(path: Path, max_new_tokens: int = 8):
    """Prompt ids, greedy continuation and the first step's top-5 log-probs, via transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    enc = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
        logprobs = torch.log_softmax(model(**enc).logits[0, -1].double(), dim=-1)
    top = torch.topk(logprobs, 5)
    prompt = enc["input_ids"][0].tolist()
    return prompt, out[0, len(prompt):].tolist(), dict(zip(top.indices.tolist(), top.values.tolist()))


def test_llama_chat_template_transformers(tiny):
    from transformers import AutoConfig, AutoTokenizer

    path = tiny["llama_chat"]
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "llama" and config.architectures == ["LlamaForCausalLM"]
    assert config.head_dim == 32 and config.max_position_embeddings >= 2048
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    assert "<|start_header_id|>" in tok_config["chat_template"]
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"]

    tok = AutoTokenizer.from_pretrained(path)
    assert tok.bos_token == "<|begin_of_text|>" and tok.eos_token == "<|eot_id|>"
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nAnswer briefly.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWo ist der nächste Bahnhof?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    prompt_ids, new_ids, _ = _hf_chat_greedy(path)
    assert prompt_ids.count(tok.bos_token_id) == 1 and prompt_ids[0] == tok.bos_token_id
    assert tok.decode(prompt_ids) == prompt  # byte fallback: newlines and umlauts survive
    assert 1 <= len(new_ids) <= 8
    # Any script round-trips through byte fallback, even characters never seen in training.
    text = "Grüße 👋 ✓ ᚠᛇᚻ 你好"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


VLLM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from vllm import LLM, SamplingParams

    if __name__ == "__main__":
        path, kwargs, messages = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
        llm = LLM(model=path, seed=0, **kwargs)
        params = SamplingParams(max_tokens=8, temperature=0, seed=0, logprobs=5)
        chat = llm.chat(messages, params, use_tqdm=False)[0]
        gen = llm.generate(["Der Fluss fließt durch"], params, use_tqdm=False)[0]
        print("XLING_RESULT " + json.dumps({
            "chat_prompt_ids": list(chat.prompt_token_ids),
            "chat_ids": list(chat.outputs[0].token_ids),
            "chat_text": chat.outputs[0].text,
            "chat_first_logprobs": {str(t): lp.logprob
                                    for t, lp in chat.outputs[0].logprobs[0].items()},
            "gen_ids": list(gen.outputs[0].token_ids),
        }), flush=True)
    """
)


def test_vllm_loads_and_generates(tiny, tmp_path):
    script = tmp_path / "run_vllm.py"
    script.write_text(VLLM_SCRIPT)
    env = {**os.environ, **VLLM_CPU_ENV, "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tiny["llama_chat"]),
         json.dumps(tiny_models.VLLM_CPU_ENGINE_KWARGS), json.dumps(MESSAGES)],
        capture_output=True, text=True, env=env, timeout=420, cwd=tmp_path,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("XLING_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(lines[-1].removeprefix("XLING_RESULT "))

    # vLLM applied the chat template the way transformers does and, in float32, computed the
    # same next-token distribution from the same weights (the random model's greedy output is
    # a repeated token, so compare log-probs, not just tokens).
    prompt_ids, hf_ids, hf_top5 = _hf_chat_greedy(tiny["llama_chat"])
    assert result["chat_prompt_ids"] == prompt_ids
    assert 1 <= len(result["chat_ids"]) <= 8
    assert result["chat_ids"] == hf_ids[: len(result["chat_ids"])]
    vllm_top = {int(t): lp for t, lp in result["chat_first_logprobs"].items()}
    # transformers' top 3 must be among vLLM's top 5 (slack for near-ties at the cut-off).
    for token, logprob in list(hf_top5.items())[:3]:
        assert vllm_top.get(token) == pytest.approx(logprob, abs=1e-3), (token, vllm_top)
    assert isinstance(result["chat_text"], str)
    assert 1 <= len(result["gen_ids"]) <= 8
