"""The model-scored MIRAGE-Bench feature actors against direct library calls.

NLIScorer (actors/nli.py) must give what a transformers forward pass + softmax gives, with
its columns following the model's config.id2label; CrossEncoderScorer (actors/cross_encoder.py)
what FlagReranker.compute_score gives; both called directly and through Ray Data's
map_batches, with empty rows turned into error rows. Plus LanguageDetector.probabilities.

The tiny models (`xling models tiny`) stand in for the real ones; each is loaded once per
module. Without them the model tests are skipped, not failed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from xling.core.models import tiny_model_paths

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_feature_actors")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# (passage, sentence) pairs in 12 languages and scripts; the last passage is long enough to be
# truncated at 512 tokens, so truncation is compared too.
PAIRS = [
    ("The river flows through the old city.", "A river runs through the city."),
    ("Der Ausschuss hat den neuen Haushalt am Dienstag gebilligt.", "Der Haushalt wurde abgelehnt."),
    ("La rivière traverse la vieille ville.", "Où est la gare la plus proche ?"),
    ("El comité aprobó el nuevo presupuesto el martes.", "El presupuesto fue aprobado."),
    ("Река течёт через старый город.", "Дети играют в футбол в парке."),
    ("وافقت اللجنة على الميزانية الجديدة يوم الثلاثاء.", "أين أقرب محطة قطار؟"),
    ("समिति ने मंगलवार को नया बजट मंज़ूर किया।", "नदी पुराने शहर से होकर बहती है।"),
    ("委员会在星期二批准了新的预算。", "孩子们在公园里踢足球。"),
    ("川は古い町を流れている。", "一番近い駅はどこですか？"),
    ("강이 오래된 도시를 가로질러 흐른다.", "아이들이 공원에서 축구를 하고 있다."),
    ("Mto unapita katikati ya mji wa zamani.", "Nchi gani inadhibiti kisiwa leo?"),
    ("Joki virtaa vanhan kaupungin läpi. " * 60, "Lapset pelaavat jalkapalloa puistossa."),
]
PREMISES = [p for p, _ in PAIRS]
HYPOTHESES = [h for _, h in PAIRS]
LABELS = ("entailment", "neutral", "contradiction")
TOL = dict(rtol=0, atol=1e-6)


def _tiny(name: str) -> str:
    path = tiny_model_paths()[name]
    if not (path / "config.json").is_file():
        pytest.skip(f"tiny model {name} is not built at {path}; run `xling models tiny`")
    return str(path)


@pytest.fixture(scope="module")
def nli_path() -> str:
    return _tiny("nli_deberta")


@pytest.fixture(scope="module")
def reranker_path() -> str:
    return _tiny("xlmr_reranker")


def _direct_nli(path: str, pairs, max_length: int = 512) -> np.ndarray:
    """transformers alone: one padded batch, softmax over the logits, columns in the model's
    own output order."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    enc = tok([p for p, _ in pairs], [h for _, h in pairs], truncation=True, padding=True,
              max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        return torch.softmax(model(**enc).logits, dim=-1).numpy()


@pytest.fixture(scope="module")
def nli(nli_path):
    from xling.actors.nli import NLIScorer

    return NLIScorer(nli_path, batch_size=4)


@pytest.fixture(scope="module")
def nli_direct(nli_path) -> np.ndarray:
    return _direct_nli(nli_path, PAIRS)


@pytest.fixture(scope="module")
def reranker(reranker_path):
    from xling.actors.cross_encoder import CrossEncoderScorer

    return CrossEncoderScorer(reranker_path, batch_size=4)


@pytest.fixture(scope="module")
def reranker_direct(reranker_path) -> dict[int, np.ndarray]:
    """FlagReranker's scores of PAIRS, by forward batch size (see the tests for why)."""
    from FlagEmbedding import FlagReranker

    model = FlagReranker(reranker_path, use_fp16=False, devices="cpu")
    pairs = [list(p) for p in PAIRS]
    return {batch: np.asarray(model.compute_score(pairs, batch_size=batch, normalize=False))
            for batch in (1, 4)}


def _pair_table(first: str, second: str) -> pa.Table:
    return pa.table({"id": list(range(len(PAIRS))), first: PREMISES, second: HYPOTHESES})


# ------------------------------------------------------------------------------------------
# NLI


def test_nli_tiny_model_has_the_real_label_order(nli, nli_path):
    config = json.loads((Path(nli_path) / "config.json").read_text())
    assert config["architectures"] == ["DebertaV2ForSequenceClassification"]
    assert config["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}
    assert nli.info["labels"] == list(LABELS)
    from transformers import AutoTokenizer

    assert type(AutoTokenizer.from_pretrained(nli_path)).__name__ == "DebertaV2Tokenizer"


def test_nli_equals_transformers_softmax(nli, nli_direct):
    out = nli(_pair_table("premise", "hypothesis"))
    assert out.column_names == ["id", "premise", "hypothesis", *LABELS, "error"]
    assert out["id"].to_pylist() == list(range(len(PAIRS)))
    assert out["error"].null_count == len(PAIRS)
    got = np.column_stack([out[c].to_numpy() for c in LABELS])
    np.testing.assert_allclose(got, nli_direct, **TOL)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-5)
    # The tiny model is not degenerate: the pairs get different, peaked distributions, so a
    # swapped column or row could not pass the comparison above.
    assert len({int(i) for i in got.argmax(axis=1)}) >= 2
    assert np.ptp(got, axis=0).min() > 0.1


def test_nli_pandas_batch(nli, nli_direct):
    df = _pair_table("premise", "hypothesis").to_pandas()
    df.index = df.index + 100  # Ray's pandas batches keep their index; so does the actor
    out = nli(df)
    assert list(out.index) == list(df.index)
    np.testing.assert_allclose(out[list(LABELS)].to_numpy(), nli_direct, **TOL)


def test_nli_label_order_comes_from_the_config(nli_path, nli_direct, tmp_path):
    from xling.actors.nli import NLIScorer

    # The same weights with the outputs labelled in another order: the columns must follow.
    permuted = {0: "neutral", 1: "contradiction", 2: "entailment"}
    model_dir = tmp_path / "permuted"
    shutil.copytree(nli_path, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["id2label"] = {str(k): v for k, v in permuted.items()}
    config["label2id"] = {v: k for k, v in permuted.items()}
    (model_dir / "config.json").write_text(json.dumps(config))

    scorer = NLIScorer(str(model_dir))
    assert scorer.info["labels"] == ["neutral", "contradiction", "entailment"]
    out = scorer(_pair_table("premise", "hypothesis"))
    for index, label in permuted.items():
        np.testing.assert_allclose(out[label].to_numpy(), nli_direct[:, index], **TOL)
    assert not np.allclose(out["entailment"].to_numpy(), nli_direct[:, 0], atol=1e-3)

    # Labels it cannot map are refused at load, never guessed.
    config["id2label"] = {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    config["label2id"] = {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="id2label"):
        NLIScorer(str(model_dir))


def test_nli_empty_rows_and_failures_become_errors(nli, nli_direct):
    batch = pa.table({
        "premise": [PREMISES[0], None, "", PREMISES[1], PREMISES[2], PREMISES[3]],
        "hypothesis": [HYPOTHESES[0], HYPOTHESES[1], HYPOTHESES[2], "   ", None, HYPOTHESES[3]],
        "error": [None, None, None, None, None, "translation failed"],
    })
    out = nli(batch)
    assert out["error"].to_pylist() == [None, "empty premise", "empty premise",
                                        "empty hypothesis", "empty hypothesis",
                                        "translation failed"]
    for label in LABELS:
        assert out[label].is_null().to_pylist() == [False, True, True, True, True, True]
    np.testing.assert_allclose([out[c][0].as_py() for c in LABELS], nli_direct[0], **TOL)


def test_nli_a_failing_row_does_not_fail_the_batch(nli, nli_direct, monkeypatch):
    real = type(nli)._score

    def score(self, pairs):
        if any("BOOM" in h for _, h in pairs):
            raise RuntimeError("bad row")
        return real(self, pairs)

    monkeypatch.setattr(type(nli), "_score", score)
    batch = pa.table({"premise": PREMISES[:3], "hypothesis": [HYPOTHESES[0], "BOOM",
                                                              HYPOTHESES[2]]})
    out = nli(batch)
    assert out["error"].to_pylist() == [None, "nli failed: RuntimeError: bad row", None]
    assert out["entailment"].is_null().to_pylist() == [False, True, False]
    np.testing.assert_allclose([out[c][2].as_py() for c in LABELS], nli_direct[2], **TOL)


# ------------------------------------------------------------------------------------------
# Cross-encoder


def test_reranker_tiny_model_loads_in_flag_reranker(reranker, reranker_path):
    from FlagEmbedding import FlagReranker

    model = FlagReranker(reranker_path, use_fp16=False, devices="cpu")
    assert type(model.model).__name__ == "XLMRobertaForSequenceClassification"
    assert type(model.tokenizer).__name__ == "XLMRobertaTokenizer"
    assert model.model.config.num_labels == 1
    assert reranker.info["device"] == "cpu" and reranker.info["dtype"] == "float32"


def test_reranker_equals_flag_reranker(reranker, reranker_direct):
    # Same forward batch size on both sides: FlagReranker sorts each call's pairs by length
    # and pads per forward batch, and padding to another length moves a logit by ~1e-6 of
    # the logits' spread (summation order), which is the size of the tolerance.
    out = reranker(_pair_table("query", "passage"))
    assert out.column_names == ["id", "query", "passage", "score", "error"]
    assert out["error"].null_count == len(PAIRS)
    np.testing.assert_allclose(out["score"].to_numpy(), reranker_direct[4], **TOL)
    # Raw logits (normalize=False), spread out like a trained reranker's.
    assert reranker_direct[4].min() < 0 < reranker_direct[4].max()
    assert np.ptp(reranker_direct[4]) > 1.0
    # Other paddings agree to float32 precision, no more.
    np.testing.assert_allclose(reranker_direct[1], reranker_direct[4], rtol=0, atol=1e-4)


def test_reranker_draws_no_progress_bars(reranker, capfd):
    scores = reranker._score([("q", f"passage {i}") for i in range(300)])
    assert len(scores) == 300
    captured = capfd.readouterr()
    assert "Compute Scores" not in captured.err + captured.out
    assert "pre tokenize" not in captured.err + captured.out


def test_reranker_empty_rows_become_errors(reranker, reranker_direct):
    df = pa.table({"query": [PREMISES[0], "", None, PREMISES[3]],
                   "passage": [HYPOTHESES[0], HYPOTHESES[1], HYPOTHESES[2], " \n"]}).to_pandas()
    out = reranker(df)
    assert out["error"].isna().tolist() == [True, False, False, False]
    assert out["error"].tolist()[1:] == ["empty query", "empty query", "empty passage"]
    assert out["score"].isna().tolist() == [False, True, True, True]
    assert out["score"][0] == pytest.approx(reranker_direct[1][0], abs=1e-6)


# ------------------------------------------------------------------------------------------
# Through Ray Data


def _through_ray(cls, kwargs: dict, table: pa.Table) -> list[dict]:
    """The rows `map_batches` gives back, in `id` order."""
    import ray.data

    ds = ray.data.from_arrow(table).map_batches(cls, fn_constructor_kwargs=kwargs,
                                                concurrency=1, batch_size=4,
                                                batch_format="pyarrow")
    return sorted(ds.take_all(), key=lambda row: row["id"])


def test_nli_through_ray_data(ray_local, nli_path, nli_direct):
    from xling.actors.nli import NLIScorer

    n = len(PAIRS)
    table = pa.concat_tables([
        _pair_table("premise", "hypothesis"),
        pa.table({"id": [n, n + 1], "premise": [None, PREMISES[0]],
                  "hypothesis": [HYPOTHESES[0], ""]})])
    rows = _through_ray(NLIScorer, {"model": nli_path, "batch_size": 2}, table)
    assert [r["id"] for r in rows] == list(range(n + 2))
    np.testing.assert_allclose([[r[c] for c in LABELS] for r in rows[:n]], nli_direct, **TOL)
    assert [r["error"] for r in rows] == [None] * n + ["empty premise", "empty hypothesis"]
    assert all(r[c] is None for r in rows[n:] for c in LABELS)


def test_reranker_through_ray_data(ray_local, reranker_path, reranker_direct):
    from xling.actors.cross_encoder import CrossEncoderScorer

    n = len(PAIRS)
    table = pa.concat_tables([
        _pair_table("query", "passage"),
        pa.table({"id": [n], "query": [""], "passage": [HYPOTHESES[0]]})])
    # One pair per forward pass on both sides, so no padding: how Ray cuts the rows into
    # batches cannot change a score (see test_reranker_equals_flag_reranker).
    rows = _through_ray(CrossEncoderScorer, {"model": reranker_path, "batch_size": 1}, table)
    assert [r["id"] for r in rows] == list(range(n + 1))
    np.testing.assert_allclose([r["score"] for r in rows[:n]], reranker_direct[1], **TOL)
    assert [r["error"] for r in rows] == [None] * n + ["empty query"]
    assert rows[n]["score"] is None


# ------------------------------------------------------------------------------------------
# Language identification probabilities


def test_langid_probabilities():
    from xling.actors.langid import LanguageDetector

    det = LanguageDetector(["ENGLISH", "GERMAN", "FRENCH", "RUSSIAN", "CHINESE", "YORUBA"])
    texts = ["The committee approved the new budget on Tuesday.",
             "Der Ausschuss hat den neuen Haushalt am Dienstag gebilligt.",
             "Le comité a approuvé le nouveau budget mardi.",
             "Комитет утвердил новый бюджет во вторник.",
             "委员会在星期二批准了新的预算。",
             "Ọmọ mi fẹ́ràn láti máa ka ìwé ní ilé ìkàwé.",
             None, "", "   ", "12345 !!!"]
    probs = det.probabilities(texts)
    assert probs[6:9] == [None, None, None]
    codes = {"de", "en", "fr", "ru", "yo", "zh"}
    for expected, p in zip(["en", "de", "fr", "ru", "zh", "yo"], probs):
        assert set(p) == codes and list(p) == sorted(p)
        assert sum(p.values()) == pytest.approx(1.0, abs=1e-8)
        assert max(p, key=p.get) == expected and p[expected] > 0.5
    # No letters lingua knows: no language has any confidence (detect() says None).
    assert probs[9] == dict.fromkeys(sorted(codes), 0.0)
    assert det.detect(["12345 !!!"]) == [None]
    assert det.probabilities(texts) == probs  # deterministic
