"""MIRAGE-Bench's eleven features (s3): citation MAP/Recall, BLEU and ROUGE-L computed here,
the inputs of the model scorers (language id, NLI, reranker, pointwise LLM judges) and the
reductions of their raw scores; and the features stage's protocol (`feature_inputs`,
`lexical_scores`, `reduce_features`)."""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence

from xling.studies.mirage.constants import SCORERS
from xling.studies.mirage.data import failed, items_of
from xling.studies.mirage.options import Knobs, Options, is_published
from xling.studies.mirage.parse import (BRACKET, answer_parts, bracket_ids, cited_ids,
                                        first_paragraph, overlap_answer, parse_llm_score)
from xling.studies.mirage.prompts import answer_overlap_prompt, fluency_prompt
from xling.tasks import irmetrics
from xling.tasks.text import sentences as text_sentences

# the pointwise LLM judge's two prompt kinds -> the features they score (s3.7, s3.8)
LLM_KINDS = {"score": "answer_overlap_score", "rating": "fluency_score"}

# --------------------------------------------------------------------------------------
# Citations (s3.3)
# --------------------------------------------------------------------------------------


def citation_run(ids: Sequence[str]) -> dict[str, float]:
    """Scores ``len - position``: in a dict a repeated id keeps its *last* score (s3.3)."""
    run: dict[str, float] = {}
    for position, docid in enumerate(ids):
        run[docid] = float(len(ids) - position)
    return run


def citation_scores(output: str, qrels: Mapping[str, int], knobs: Knobs = Knobs()
                    ) -> dict[str, float]:
    """``citation_MAP@10`` (trec_eval ``map_cut_10``) and ``citation_Recall@10``; 0.0 for an
    answer that cites nothing, as pytrec_eval gives for an empty ranking."""
    run = citation_run(cited_ids(output, qrels, knobs))
    measured = irmetrics.evaluate({"q": run}, {"q": dict(qrels)},
                                  ("map_cut_10", "recall_10"))["q"]
    return {"citation_MAP@10": measured["map_cut_10"],
            "citation_Recall@10": measured["recall_10"]}


# --------------------------------------------------------------------------------------
# Lexical overlap (s3.6)
# --------------------------------------------------------------------------------------

def bleu(hypothesis: str, reference: str) -> float:
    """Sentence BLEU as HF ``evaluate``'s sacrebleu gave it (corpus_bleu of one pair,
    tokenizer 13a, exp smoothing), divided by 100."""
    import sacrebleu
    return sacrebleu.corpus_bleu([hypothesis], [[reference]]).score / 100.0


_CHAR_LANGS = frozenset({"zh", "ja", "th"})  # written without spaces between words


def _is_punct(ch: str) -> bool:
    cp = ord(ch)  # XL-Sum's rule: ASCII non-alphanumerics and Unicode P* are punctuation
    return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or unicodedata.category(ch).startswith("P"))


def rouge_tokens(text: str, lang: str) -> list[str]:
    """XL-Sum's normalisation: lowercase, control characters dropped, punctuation splits
    and is dropped; characters for zh/ja/th, whitespace words otherwise."""
    text = "".join(" " if ch.isspace() or _is_punct(ch) else ch for ch in (text or "").lower()
                   if not (unicodedata.category(ch).startswith("C") and not ch.isspace()))
    if lang in _CHAR_LANGS:
        return [ch for ch in text if not ch.isspace()]
    return text.split()


def _lcs(first: Sequence[str], second: Sequence[str]) -> int:
    prev = [0] * (len(second) + 1)
    for x in first:
        cur = [0]
        for j, y in enumerate(second):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(hypothesis: str, reference: str, lang: str) -> float:
    """ROUGE-L F1 (symmetric, so the argument order does not matter)."""
    hyp_tokens, ref_tokens = rouge_tokens(hypothesis, lang), rouge_tokens(reference, lang)
    if not hyp_tokens or not ref_tokens:
        return 0.0
    lcs = _lcs(hyp_tokens, ref_tokens)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(hyp_tokens), lcs / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def lexical_values(output: str, label: str | None, qrels: Mapping[str, int], lang: str,
                   knobs: Knobs) -> dict[str, float | None]:
    """Features 3, 4, 8, 9 of one answer; BLEU and ROUGE-L are None without a label (the
    reference model's answer)."""
    values: dict[str, float | None] = dict(citation_scores(output, qrels, knobs))
    label_answer = None if label is None else overlap_answer(label, knobs)
    hyp = overlap_answer(output, knobs)
    values["answer_bleu"] = None if label_answer is None else bleu(hyp, label_answer)
    values["answer_rougeL"] = None if label_answer is None else rouge_l(hyp, label_answer, lang)
    return values


# --------------------------------------------------------------------------------------
# Model-scored features: inputs for the scorers, reductions of their scores (s3.2-3.8)
# --------------------------------------------------------------------------------------

def langid_text(output: str, docids: Iterable[str]) -> str:
    """Detector input (s3.2): docids, ``##Reason:``, ``##Answer:``, brackets removed,
    whitespace collapsed."""
    text = output or ""
    for docid in sorted(docids, key=len, reverse=True):  # longest first: "1#2" inside "1#23"
        text = text.replace(docid, "")
    for marker in ("##Reason:", "##Answer:", "[", "]"):
        text = text.replace(marker, "")
    return " ".join(text.split())


def language_features(probs: Mapping[str, float], lang: str, knobs: Knobs = Knobs()
                      ) -> dict[str, float]:
    """From a detector's ``{code: probability}`` (langdetect's ``zh-cn`` read as zh; a code
    not listed has probability 0). Reference: for English queries ``english_language`` is
    always 0 (the dump's ``if target … elif en``)."""
    by_code = {("zh" if k.lower() == "zh-cn" else k.lower()): float(v) for k, v in probs.items()}
    target, english = by_code.get(lang, 0.0), by_code.get("en", 0.0)
    if lang == "en" and knobs.ref("en_detection"):
        english = 0.0
    return {"target_language": target, "english_language": english}


def _sentences(lang: str, text: str) -> list[str]:
    """The reason's sentences by the multilingual text layer (sentencex, the reference's own
    fallback, plus rules for zh/ja/th and unspaced full stops; ``tasks.text.fingerprint()``)."""
    return text_sentences(text, lang)


def support_pairs(output: str, passages: Mapping[str, str], lang: str,
                  knobs: Knobs = Knobs(),
                  segment: Callable[[str, str], list[str]] = _sentences) -> list[dict]:
    """NLI inputs (s3.4): for each reason sentence with valid citations, one pair per cited
    passage, ``premise`` = passage, ``hypothesis`` = the sentence without its brackets.
    ``segment(lang, text)`` is the sentence splitter (the reference: Stanza, else
    sentencex); reference: the reason's first paragraph only."""
    reason = answer_parts(output, knobs)[0]
    if knobs.ref("answer_parts"):
        reason = first_paragraph(reason)
    pairs = []
    for sentence in segment(lang, reason):
        ids = list(dict.fromkeys(bracket_ids(sentence, passages, knobs)))
        hypothesis = " ".join(BRACKET.sub("", sentence).split())
        pairs += [{"docid": d, "premise": passages[d], "hypothesis": hypothesis} for d in ids]
    return pairs


def support_features(probs: Sequence[Sequence[float]], knobs: Knobs = Knobs()
                     ) -> dict[str, float | None]:
    """Mean entailment / neutral / contradiction over a generation's (sentence, citation)
    pairs; each row ``(entailment, neutral, contradiction)``. None without pairs.
    Reference: each probability first rounded to 1 decimal (Python ``round``)."""
    keys = ("support_entailment", "support_neutral", "support_contradiction")
    if not len(probs):
        return dict.fromkeys(keys)
    rows = [[round(float(x), 1) if knobs.ref("nli_rounding") else float(x) for x in row]
            for row in probs]
    return {key: math.fsum(row[i] for row in rows) / len(rows) for i, key in enumerate(keys)}


def reranker_pairs(output: str, query: str, passages: Mapping[str, str],
                   knobs: Knobs = Knobs()) -> list[dict]:
    """Cross-encoder inputs (s3.5): each valid cited passage of the whole output once."""
    ids = dict.fromkeys(bracket_ids(output, passages, knobs))
    return [{"docid": d, "query": query, "passage": passages[d]} for d in ids]


def reranker_feature(logits: Sequence[float]) -> float | None:
    """Mean raw logit over the cited passages; None when nothing is cited."""
    return math.fsum(map(float, logits)) / len(logits) if len(logits) else None


def overlap_label(outputs: Sequence[tuple[str, str]], knobs: Knobs = Knobs()) -> str | None:
    """The "Label" answer of feature 10 from a query's ``[(model, output)]`` in stored
    order. Reference: the *last* model's (the dump's overwrite bug, s3.7)."""
    if not outputs:
        return None
    if knobs.ref("overlap_label"):
        return outputs[-1][1]
    return dict(outputs).get(knobs.reference_model)


# --------------------------------------------------------------------------------------
# The features stage's protocol (Featured)
# --------------------------------------------------------------------------------------

def scorers(opts: Options) -> list[str]:
    """The scorers the chosen features need (none when the features are published)."""
    if is_published(opts):
        return []
    chosen = set(opts.features)
    return [scorer for scorer, names in SCORERS.items() if chosen & set(names)]


def _scorer_rows(scorer: str, base: dict, item: Mapping, output: str, lang: str,
                 generations: Sequence[Mapping], knobs: Knobs) -> list[dict]:
    """One generation's input rows for one scorer (`base`: its item_id and model)."""
    query_id, model = base["item_id"], base["model"]
    passages = dict(item["passages"])
    if scorer == "lexical":
        label = next((g.get("output") for g in generations if str(g["item_id"]) == query_id
                      and g["model"] == knobs.reference_model and not failed(g)), None)
        return [{**base, "input_id": f"{query_id}|{model}", "output": output, "label": label,
                 "qrels": json.dumps(item["qrels"], sort_keys=True), "lang": lang}]
    if scorer == "langid":
        return [{**base, "input_id": f"{query_id}|{model}",
                 "text": langid_text(output, passages)}]
    if scorer in ("nli", "reranker"):
        if scorer == "nli":
            got = [{**base, "input_id": f"{query_id}|{model}|{i}", **pair}
                   for i, pair in enumerate(support_pairs(output, passages, lang, knobs))]
        else:
            got = [{**base, "input_id": f"{query_id}|{model}|{pair['docid']}",
                    "query": pair["query"], "passage": pair["passage"]}
                   for pair in reranker_pairs(output, item["query"], passages, knobs)]
        # nothing cited: a counted error row (the feature is then missing, as in the
        # reference), so every answer is accounted for and a cell is never empty
        return got or [{**base, "input_id": f"{query_id}|{model}|-",
                        "error": "no valid citation to score"}]
    if scorer == "llm":
        rows = []
        label = overlap_label([(g["model"], g.get("output") or "") for g in generations
                               if str(g["item_id"]) == query_id], knobs)
        if label is not None and "answer_overlap_score" in knobs.features:
            rows.append({**base, "input_id": f"{query_id}|{model}|overlap", "kind": "score",
                         "prompt": answer_overlap_prompt(item["query"], output, label, lang,
                                                         knobs.feature_prompts)})
        if "fluency_score" in knobs.features:
            rows.append({**base, "input_id": f"{query_id}|{model}|fluency", "kind": "rating",
                         "prompt": fluency_prompt(item["query"], item["contexts"], output,
                                                  lang, knobs.feature_prompts)})
        return rows
    raise ValueError(f"unknown scorer {scorer!r}; MIRAGE's are {sorted(SCORERS)}")


def feature_inputs(opts: Options, scorer: str, lang: str, generations: Sequence[Mapping],
                   ) -> list[dict]:
    """What one scorer is asked about a language's generations: rows ``input_id, item_id,
    model`` plus the scorer's inputs (``premise, hypothesis`` for nli; ``query, passage`` for
    reranker; ``text`` for langid; ``prompt`` and ``kind`` for llm; ``output`` for lexical).
    A generation with nothing to score (no citation, a failed generation, an unknown query)
    is one row with an ``error``: the features stage counts it, and the feature is missing,
    as in the reference."""
    knobs = Knobs.of(opts)
    items = {item["query_id"]: item for item in items_of(opts, lang)}
    rows = []
    for gen in generations:
        item = items.get(str(gen["item_id"]))
        if item is None or item["error"] or failed(gen):
            why = (f"no query {gen['item_id']} in {lang}" if item is None else item["error"]
                   or f"no answer to score: {gen.get('error')}")
            rows.append({"item_id": str(gen["item_id"]), "model": gen["model"],
                         "input_id": f"{gen['item_id']}|{gen['model']}|-", "error": why})
            continue
        base = {"item_id": item["query_id"], "model": gen["model"]}
        rows += _scorer_rows(scorer, base, item, gen.get("output") or "", lang, generations,
                             knobs)
    return rows


def lexical_scores(opts: Options, rows: Sequence[Mapping]) -> list[dict]:
    """Features 3, 4, 8, 9 of lexical input rows (``output, label, qrels`` JSON, ``lang``),
    one ``{feature: value}`` per row. The BLEU/ROUGE label is the reference model's answer
    (None without one, so those two features are missing)."""
    knobs = Knobs.of(opts)
    return [lexical_values(row["output"], row.get("label"), json.loads(row["qrels"]),
                           row["lang"], knobs) for row in rows]


def reduce_features(opts: Options, scored: Sequence[Mapping]):
    """The features stage's scored rows (``scorer, lang, item_id, model, scores {name:
    value}, output, kind``) -> a DataFrame of long feature rows ``lang, query_id, model,
    feature, value`` (s3 formulas). Rows are keyed by (lang, query id): MIRACL dev query
    ids repeat across languages (ar and en share 157), so a query id alone would merge one
    language's answers into another's. A pointwise LLM score the judge's text does not
    give, or the engine failed to get, is a row with value None (``llm_parse_failure:
    fixed``) or 0 (``reference``): `surrogate.FeatureTable` counts it."""
    import pandas as pd

    knobs = Knobs.of(opts)
    grouped: dict[tuple[str, str, str, str], list[Mapping]] = {}
    for row in scored:
        llm_failed = row["scorer"] == "llm" and row.get("kind") in LLM_KINDS
        if row.get("error") and not llm_failed:
            continue  # nothing was asked of the scorer (no answer, no citation): missing
        if not row.get("lang"):
            raise ValueError(f"scored row {row.get('item_id')!r}/{row.get('model')!r} has no "
                             "lang: features are keyed by (lang, query id)")
        grouped.setdefault((row["scorer"], row["lang"], str(row["item_id"]), row["model"]),
                           []).append(row)
    out = []
    for (scorer, lang, query_id, model), rows in grouped.items():
        if scorer == "lexical":
            values = dict(rows[0]["scores"])
        elif scorer == "langid":
            values = language_features(rows[0]["scores"], lang, knobs)
        elif scorer == "nli":
            values = support_features([(r["scores"]["entailment"], r["scores"]["neutral"],
                                        r["scores"]["contradiction"]) for r in rows], knobs)
        elif scorer == "reranker":
            values = {"reranker_score": reranker_feature([r["scores"]["score"] for r in rows])}
        else:  # llm: an engine error is a failure like an unparsed answer
            failure = None if not knobs.ref("llm_parse_failure") else 0
            values = {LLM_KINDS[r["kind"]]: (failure if r.get("error") else
                                             parse_llm_score(r.get("output") or "", r["kind"],
                                                             knobs))
                      for r in rows}
        out += [{"lang": lang, "query_id": query_id, "model": model, "feature": name,
                 "value": value} for name, value in values.items() if name in knobs.features]
    return pd.DataFrame(out, columns=["lang", "query_id", "model", "feature", "value"])
