"""MIRAGE-Bench: a multilingual RAG arena with a surrogate judge (Thakur et al., NAACL 2025,
arXiv:2410.13716; data ``nthakur/mirage-bench``, ``-output``, ``-pairwise-judgments``).

The pure part of the study: everything that is parsing, prompt text or arithmetic on model
scores. Models (NLI, reranker, language id, LLMs) run elsewhere and hand their raw scores to
the reductions here. Sources: the paper (``papers/mirage-bench.txt``, cited "P L<n>") wins
over the specification (``specs/mirage-bench.md``, cited "s<n>"), which documents the
research code ("dump") that produced the published numbers.

What is here
------------
* Loaders for the three hub layouts, from a local path or ``s3://`` (pyarrow.fs):
  :func:`load_queries` (``query_id, prompt, positive_ids, negative_ids``; query and passages
  are parsed out of ``prompt``, s1.3), :func:`load_outputs` (``outputs`` list of
  ``{model, output}`` plus one ``{model: value}`` struct column per feature, either name set),
  :func:`load_judgments` (``query_id, model_A, model_B, verdict`` [+ ``judge, output``]).
* The RAG prompt (:func:`build_rag_prompt`, :func:`rebuild_prompt`; Figure 10) and the
  ``##Reason: … ##Answer: …`` parser with ``[docid]``, ``[a, b]``, ``[a,b]`` citations.
* The eleven features (s3): citation MAP@10 / Recall@10 (trec_eval conventions through
  ``tasks/irmetrics.py``), BLEU (sacrebleu), ROUGE-L (:func:`rouge_l`), and the reductions
  of given model scores: language-id probabilities, NLI probabilities, reranker logits,
  pointwise LLM scores (with their prompts).
* The arena: pair prompts (:func:`pair_prompts`), the verdict parser, Bradley–Terry
  (:func:`bt_fit`, choix), bootstrap tournaments, the random-forest surrogate, Kendall tau,
  R², and the paper's Tables 2, 3, 4, 5 and 7/8 as DataFrames (:func:`tables`).

Options (:class:`Options`)
--------------------------
Every place where the research code differs from a sound choice (s8.8) is a named option
whose ``"reference"`` value reproduces the published numbers and whose ``"fixed"`` value is
the default (``Options.reference()`` sets all of them):

==================  ====================================================  ===========================
option              reference (dump scripts)                               fixed (default)
==================  ====================================================  ===========================
answer_parts        ``Reason(.*?)Answer:`` / ``Answer:(.*?)$``, first      ``##Reason:``/``##Answer:``
                    paragraph, every ``##`` and ``:`` removed              markers, whole parts
comma_citations     ``[a, b]`` split on "," unstripped (only ``a`` kept)  split and strip
citation_ranking    duplicates kept, an id scores at its last occurrence  first occurrence, dedup
citation_scope      first paragraphs of reason and answer                 the whole output
en_detection        P(en) goes to target_language only for en queries     P(en) always
nli_rounding        each probability rounded to 1 decimal                 full precision
overlap_label       the last model of the query's ``outputs`` list        ``reference_model``
llm_parse_failure   0, averaged like a score                              None (missing), counted
pairwise_parse      ``[[A]]/[[B]]/[[C]]`` in the last 25 characters        the last such token
seeds               random forest unseeded                                ``random_state``
kendall_tau         tau of the two ``argsort`` orders                     tau-b on aligned scores
==================  ====================================================  ===========================

Not options, because no reference behaviour can be reproduced or none differs: the bootstrap
is always seeded (``numpy.random.default_rng(bootstrap_seed)`` over the *sorted* judged query
ids; the reference was unseeded, so its draws cannot be replayed), BT falls back from ILSR to
``opt_pairwise`` as the reference does and flags the tournament (``bt_alpha`` adds choix's L2
penalty), ties and unparsed verdicts never enter the BT fit (as in the reference) but are
counted. The pairwise judge wording is ``pairwise_prompt``: ``reference`` (the dump text, the
default because it produced the judgments) or ``paper`` (Figure 13).

Deviations we chose
-------------------
* ROUGE-L: the reference used XL-Sum's multilingual fork (Snowball stemmers for 9 languages,
  jieba / fugashi / pythainlp segmenters), which needs data files that are not installable
  offline (s3.6). :func:`rouge_l` keeps that fork's normalisation (lowercase, Unicode
  punctuation removed, whitespace split) without stemming, and scores zh, ja and th by
  characters, as they are written without spaces.
* Passages are not re-truncated to 800 tokens (P L166): the published prompts already are.
* Table 2's tau is computed over all models on score vectors (s6.3, no code published).
* A pair's presentation order is a seeded coin flip on (query, pair), not a draw from one
  stream after shuffling the roster: adding a model keeps every old pair's prompt, so the
  arena's cache answers them (the reference's draws cannot be replayed anyway).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from xling.tasks import irmetrics
from xling.tasks.languages import get_language

LANGS = ("ar", "bn", "de", "en", "es", "fa", "fi", "fr", "hi", "id", "ja", "ko", "ru", "sw",
         "te", "th", "yo", "zh")
# The 19 arena models as the data names them (s1.3; order = the reference's index order).
MODELS = ("gpt-3.5-turbo-azure", "gpt-4-azure", "gpt-4o-azure",
          "mistralai/Mistral-7B-Instruct-v0.2", "mistralai/Mistral-7B-Instruct-v0.3",
          "mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x22B-Instruct-v0.1",
          "cohereforai-c4ai-command-r", "cohereforai-c4ai-command-r-plus",
          "cohereforai-c4ai-aya-23", "google/gemma-1.1-2b-it", "google/gemma-1.1-7b-it",
          "meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-70B-Instruct",
          "microsoft/Phi-3-mini-128k-instruct", "microsoft/Phi-3-small-8k-instruct",
          "microsoft/Phi-3-medium-128k-instruct", "Qwen/Qwen2-1.5B-Instruct",
          "Qwen/Qwen2-7B-Instruct")
HELD_OUT = ("google/gemma-1.1-2b-it", "meta-llama/Meta-Llama-3-70B-Instruct")  # P L130
REFERENCE_MODEL = "gpt-4-azure"  # the "gold" answer of the overlap features (P L102)
FEATURES = ("target_language", "english_language", "citation_MAP@10", "citation_Recall@10",
            "support_entailment", "support_neutral", "reranker_score", "answer_bleu",
            "answer_rougeL", "answer_overlap_score", "fluency_score")
# The research code's column names (s1.3) -> the released names; both occur on the hub.
FEATURE_ALIASES = {
    "language_detection": "target_language", "en_detection": "english_language",
    "xlni_context_entailment": "support_entailment", "xlni_context_neutral": "support_neutral",
    "xlni_context_contradiction": "support_contradiction",
    "bge-reranker-v2-m3-score": "reranker_score",
    "Meta-Llama-3-8B-Instruct-answer-eval": "answer_overlap_score",
    "Meta-Llama-3-8B-Instruct-fluency": "fluency_score", "other_detection": "other_language"}
LLM_FEATURES = ("answer_overlap_score", "fluency_score")
# Table 4's feature sets (P L220-225): "low correlation" = language detection and support.
FEATURE_SETS = {
    "all": FEATURES,
    "w/o LLM judge": tuple(f for f in FEATURES if f not in LLM_FEATURES),
    "w/o low correlation": tuple(f for f in FEATURES if f not in (
        "target_language", "english_language", "support_entailment", "support_neutral")),
    "only LLM judge": LLM_FEATURES}
ABLATION_LANGS = ("ar", "bn", "fi", "ja", "ko", "ru", "te")  # Tables 3 and 4
REGRESSORS = ("random_forest", "linear", "mlp", "xgboost", "svr")  # Table 3's rows
PROMPTS: dict[str, str] = {}  # filled from mirage_prompts.yaml below

_COMPAT = ("answer_parts", "comma_citations", "citation_ranking", "citation_scope",
           "en_detection", "nli_rounding", "overlap_label", "llm_parse_failure",
           "pairwise_parse", "seeds", "kendall_tau")


@dataclass(frozen=True)
class Options:
    """The study's knobs; the ``_COMPAT`` fields take ``"fixed"`` or ``"reference"``."""

    answer_parts: str = "fixed"
    comma_citations: str = "fixed"
    citation_ranking: str = "fixed"
    citation_scope: str = "fixed"
    en_detection: str = "fixed"
    nli_rounding: str = "fixed"
    overlap_label: str = "fixed"
    llm_parse_failure: str = "fixed"
    pairwise_parse: str = "fixed"
    seeds: str = "fixed"
    kendall_tau: str = "fixed"
    pairwise_prompt: str = "reference"   # reference (dump text) | paper (Figure 13)
    instruction: str = "published"       # published | paper | api_scripts (s2.2)
    reference_model: str = REFERENCE_MODEL
    judge_queries: int = 100             # P L39
    judge_seed: int = 42
    tournaments: int = 200               # P L190
    matches: int = 100
    bootstrap_seed: int = 0
    bt_alpha: float = 0.0
    held_out: tuple[str, ...] = HELD_OUT
    features: tuple[str, ...] = FEATURES
    surrogate: str = "random_forest"
    random_state: int = 0

    def __post_init__(self):
        for name in _COMPAT:
            if getattr(self, name) not in ("fixed", "reference"):
                raise ValueError(f"study.options.{name}: {getattr(self, name)!r} is not "
                                 "'fixed' or 'reference'")
        for name, allowed in (("pairwise_prompt", ("reference", "paper")),
                              ("instruction", ("published", "paper", "api_scripts")),
                              ("surrogate", REGRESSORS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"study.options.{name}: {getattr(self, name)!r}; use one of "
                                 f"{', '.join(allowed)}")
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise ValueError(f"study.options.features: unknown {sorted(unknown)}; use {FEATURES}")

    @classmethod
    def reference(cls, **overrides) -> Options:
        """Every compat item at its reference value (to reproduce the published numbers)."""
        return replace(cls(**{n: "reference" for n in _COMPAT}), **overrides)

    def ref(self, name: str) -> bool:
        return getattr(self, name) == "reference"

    @property
    def rf_state(self) -> int | None:
        return None if self.ref("seeds") else self.random_state


def _load_prompts() -> dict[str, str]:
    import yaml  # PyYAML is a dependency of the config layer already
    return yaml.safe_load((Path(__file__).with_name("prompts.yaml")).read_text("utf-8"))


PROMPTS.update(_load_prompts())


def fill(template: str, values: Mapping[str, str]) -> str:
    """Return a new string with each placeholder replaced (never ``str.format``: templates
    hold literal braces). A placeholder missing from the template is an error: that is the
    symptom of the released evaluator's bug (s4.5), which overwrote its template with the
    first filled prompt, so every later prompt was the first one."""
    out = template
    for key, value in values.items():
        if key not in template:
            raise ValueError(f"placeholder {key!r} not in the template; a template must be "
                             "filled from the constant, never from a filled prompt")
        out = out.replace(key, value)
    return out


def language_name(lang: str) -> str:
    """English name injected into prompts ("Persian" for fa; s1.2)."""
    return get_language(lang).name


# --------------------------------------------------------------------------------------
# The RAG prompt: building and parsing (Figure 10, s1.3)
# --------------------------------------------------------------------------------------

_PASSAGE_START = re.compile(r'^"?\[([^\]\n]+)\]"?[ \t]?', re.M)


def build_rag_prompt(query: str, passages: Sequence[tuple[str, str]], lang: str,
                     instruction: str = "paper") -> str:
    """Figure 10's layout (P L570-585): passages are ``(docid, "title - text")`` pairs in
    prompt order. The quotes Figure 10 prints around ``[docid]`` are taken as a rendering
    artefact (the code splits on bare ``[docid]``, s2.1)."""
    contexts = "\n".join(f"[{d}] {t}" for d, t in passages)
    head = f"Question:\n{query}\n\nContexts:\n{contexts}\n\n"
    return head + _instruction(lang, instruction)


def _instruction(lang: str, which: str) -> str:
    if which == "api_scripts":
        return fill(PROMPTS["rag_instruction_api_scripts"], {"{language}": language_name(lang)})
    return "Instruction:\n" + fill(PROMPTS["rag_instruction_paper"],
                                   {"{{language}}": language_name(lang)})


def rebuild_prompt(prompt: str, lang: str, instruction: str = "published") -> str:
    """The published prompt (``published``) or its text before the first ``Instruction:``
    followed by another instruction, as the API scripts did (s2.2)."""
    if instruction == "published":
        return prompt
    i = prompt.find("Instruction:")
    if i < 0:
        raise ValueError("prompt has no 'Instruction:' to replace")
    return prompt[:i] + _instruction(lang, instruction)


def parse_prompt(prompt: str) -> dict:
    """Query, passages ``[(docid, text)]`` and the raw Contexts block out of a published
    prompt. Two rules (s1.3) must agree, else ``error`` is set: the released code's (query up
    to ``\\n\\nContexts:``, passages cut at each line-initial ``[docid]``, so a passage may
    span lines) and the research code's (query up to the first blank line, one passage per
    line)."""
    out = {"query": "", "passages": [], "contexts": "", "error": None}
    q = prompt.find("Question:")
    c = prompt.find("\n\nContexts:", q + 1)
    if q < 0 or c < 0:
        out["error"] = "prompt: no 'Question:' ... 'Contexts:'"
        return out
    out["query"] = prompt[q + len("Question:"):c].strip()
    dump_query = prompt[q + len("Question:"):].strip().split("\n\n")[0].strip()
    end = prompt.find("\n\nInstruction", c)
    block = prompt[c + len("\n\nContexts:"):end if end >= 0 else len(prompt)].strip("\n")
    out["contexts"] = block.strip()
    starts = list(_PASSAGE_START.finditer(block))
    out["passages"] = [(m.group(1).strip(), block[m.end():(starts[i + 1].start() if i + 1 < len(
        starts) else len(block))].strip()) for i, m in enumerate(starts)]
    dump = [(ln.split("]")[0].replace("[", "").strip('"').strip(),
             ln.split("]", 1)[1].lstrip('"').strip()) for ln in block.split("\n")
            if ln.strip() and "]" in ln]
    if dump_query != out["query"] or dump != out["passages"]:
        out["error"] = "prompt: the released and the research parsing rules disagree"
    if end < 0:
        out["error"] = "prompt: no 'Instruction' after the contexts"
    return out


# --------------------------------------------------------------------------------------
# Answers and citations (s1.4, s3.1, s3.3)
# --------------------------------------------------------------------------------------

_REF_REASON = re.compile(r"Reason(.*?)Answer:", re.S)
_REF_ANSWER = re.compile(r"Answer:(.*?)$", re.S)
_FIX_REASON = re.compile(r"#+\s*Reason\s*:?(.*?)(?=#+\s*Answer\b|\Z)", re.S | re.I)
_FIX_ANSWER = re.compile(r"#+\s*Answer\s*:?(.*)\Z", re.S | re.I)
_BRACKET = re.compile(r"\[[^\]]*\]")


def answer_parts(text: str, opts: Options = Options()) -> tuple[str, str, bool]:
    """``(reason, answer, format_ok)`` before per-feature cleaning. Reference: the dump's
    regexes (a missing part is ``""``; the dump crashed or left it unbound, s3.1)."""
    text = text or ""
    rx = (_REF_REASON, _REF_ANSWER) if opts.ref("answer_parts") else (_FIX_REASON, _FIX_ANSWER)
    r, a = (x.search(text) for x in rx)
    return (r.group(1).strip() if r else "", a.group(1).strip() if a else "", bool(r and a))


def _para(s: str) -> str:
    return s.strip().split("\n\n")[0].strip()


def _unhash(s: str) -> str:
    # the dump removes every "##" and every ":" ("10:30" -> "1030"; s3.1)
    return s.replace("##", "").replace(":", "").strip()


def parse_rag_answer(text: str, opts: Options = Options()) -> dict:
    """The generations parser: ``reason``, ``answer``, ``citations`` (every bracketed id in
    order of first appearance, unvalidated) and ``format_ok``. Never fails: an unformatted
    answer is data and scores low."""
    reason, answer, ok = answer_parts(text, opts)
    if opts.ref("answer_parts"):
        reason, answer = _unhash(_para(reason)), _unhash(_para(answer))
    ids = [i.strip() for g in _BRACKET.findall(text or "") for i in g[1:-1].split(",")]
    return {"reason": reason, "answer": answer, "format_ok": ok,
            "citations": list(dict.fromkeys(i for i in ids if i))}


def bracket_ids(text: str, valid: Iterable[str], opts: Options = Options()) -> list[str]:
    """Valid docids of every ``[...]`` group in order, duplicates kept. Reference: a group
    with a comma is split on "," without stripping, so ``[a, b]`` keeps only ``a``."""
    valid = set(valid)
    out = []
    for g in _BRACKET.findall(text or ""):
        inner = g[1:-1]
        items = inner.split(",") if "," in inner else [inner]
        if not opts.ref("comma_citations"):
            items = [i.strip() for i in items]
        out += [i for i in items if i in valid]
    return out


def cited_ids(output: str, qrels: Mapping[str, int], opts: Options = Options()) -> list[str]:
    """The citations scored by MAP/Recall, in rank order. Reference: the first paragraph
    of the reason, then of the answer, duplicates kept (s3.3)."""
    if opts.ref("citation_scope"):
        reason, answer, _ = answer_parts(output, replace(opts, answer_parts="reference"))
        ids = bracket_ids(_para(reason), qrels, opts) + bracket_ids(_para(answer), qrels, opts)
    else:
        ids = bracket_ids(output, qrels, opts)
    return ids if opts.ref("citation_ranking") else list(dict.fromkeys(ids))


def citation_run(ids: Sequence[str]) -> dict[str, float]:
    """Scores ``len - position``: in a dict a repeated id keeps its *last* score (s3.3)."""
    run: dict[str, float] = {}
    for i, d in enumerate(ids):
        run[d] = float(len(ids) - i)
    return run


def citation_scores(output: str, qrels: Mapping[str, int], opts: Options = Options()
                    ) -> dict[str, float]:
    """``citation_MAP@10`` (trec_eval ``map_cut_10``) and ``citation_Recall@10``; 0.0 for an
    answer that cites nothing, as pytrec_eval gives for an empty ranking."""
    run = citation_run(cited_ids(output, qrels, opts))
    m = irmetrics.evaluate({"q": run}, {"q": dict(qrels)}, ("map_cut_10", "recall_10"))["q"]
    return {"citation_MAP@10": m["map_cut_10"], "citation_Recall@10": m["recall_10"]}


# --------------------------------------------------------------------------------------
# Lexical overlap (s3.6)
# --------------------------------------------------------------------------------------

def overlap_answer(output: str, opts: Options = Options()) -> str:
    """The answer BLEU/ROUGE compare: citations removed (reference: first paragraph)."""
    answer = answer_parts(output, opts)[1]
    if opts.ref("answer_parts"):
        answer = _para(answer)
    return " ".join(_BRACKET.sub("", answer).split())


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


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(hypothesis: str, reference: str, lang: str) -> float:
    """ROUGE-L F1 (symmetric, so the argument order does not matter)."""
    h, r = rouge_tokens(hypothesis, lang), rouge_tokens(reference, lang)
    if not h or not r:
        return 0.0
    lcs = _lcs(h, r)
    if lcs == 0:
        return 0.0
    p, rec = lcs / len(h), lcs / len(r)
    return 2 * p * rec / (p + rec)


def lexical_features(items: Sequence[Mapping], generations: pd.DataFrame,
                     opts: Options = Options()) -> pd.DataFrame:
    """Features 3, 4, 8, 9 for every generation: long rows ``query_id, model, feature,
    value`` (null when the reference model has no answer to compare with)."""
    by_q = {it["query_id"]: it for it in items}
    ref = {q: o for q, m, o in generations[["query_id", "model", "output"]].itertuples(
        index=False) if m == opts.reference_model}
    rows = []
    for q, m, out in generations[["query_id", "model", "output"]].itertuples(index=False):
        it = by_q.get(q)
        if it is None:
            continue
        vals = citation_scores(out, it["qrels"], opts)
        label = overlap_answer(ref[q], opts) if q in ref else None
        hyp = overlap_answer(out, opts)
        vals["answer_bleu"] = None if label is None else bleu(hyp, label)
        vals["answer_rougeL"] = None if label is None else rouge_l(hyp, label, it["lang"])
        rows += [{"query_id": q, "model": m, "feature": k, "value": v} for k, v in vals.items()]
    return pd.DataFrame(rows, columns=["query_id", "model", "feature", "value"])


# --------------------------------------------------------------------------------------
# Model-scored features: inputs for the scorers, reductions of their scores (s3.2-3.8)
# --------------------------------------------------------------------------------------

def langid_text(output: str, docids: Iterable[str]) -> str:
    """Detector input (s3.2): docids, ``##Reason:``, ``##Answer:``, brackets removed,
    whitespace collapsed."""
    text = output or ""
    for d in sorted(docids, key=len, reverse=True):  # longest first: "1#2" inside "1#23"
        text = text.replace(d, "")
    for s in ("##Reason:", "##Answer:", "[", "]"):
        text = text.replace(s, "")
    return " ".join(text.split())


def language_features(probs: Mapping[str, float], lang: str, opts: Options = Options()
                      ) -> dict[str, float]:
    """From a detector's ``{code: probability}`` (langdetect's ``zh-cn`` read as zh; a code
    not listed has probability 0). Reference: for English queries ``english_language`` is
    always 0 (the dump's ``if target … elif en``)."""
    p = {("zh" if k.lower() == "zh-cn" else k.lower()): float(v) for k, v in probs.items()}
    target, en = p.get(lang, 0.0), p.get("en", 0.0)
    if lang == "en" and opts.ref("en_detection"):
        en = 0.0
    return {"target_language": target, "english_language": en}


def _sentences(lang: str, text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?。！？।])\s+", text) if s.strip()]


def support_pairs(output: str, passages: Mapping[str, str], lang: str,
                  opts: Options = Options(),
                  segment: Callable[[str, str], list[str]] = _sentences) -> list[dict]:
    """NLI inputs (s3.4): for each reason sentence with valid citations, one pair per cited
    passage, ``premise`` = passage, ``hypothesis`` = the sentence without its brackets.
    ``segment(lang, text)`` is the sentence splitter (the reference: Stanza, else
    sentencex); reference: the reason's first paragraph only."""
    reason = answer_parts(output, opts)[0]
    if opts.ref("answer_parts"):
        reason = _para(reason)
    pairs = []
    for sentence in segment(lang, reason):
        ids = list(dict.fromkeys(bracket_ids(sentence, passages, opts)))
        hyp = " ".join(_BRACKET.sub("", sentence).split())
        pairs += [{"docid": d, "premise": passages[d], "hypothesis": hyp} for d in ids]
    return pairs


def support_features(probs: Sequence[Sequence[float]], opts: Options = Options()
                     ) -> dict[str, float | None]:
    """Mean entailment / neutral / contradiction over a generation's (sentence, citation)
    pairs; each row ``(entailment, neutral, contradiction)``. None without pairs.
    Reference: each probability first rounded to 1 decimal (Python ``round``)."""
    keys = ("support_entailment", "support_neutral", "support_contradiction")
    if not len(probs):
        return dict.fromkeys(keys)
    rows = [[round(float(x), 1) if opts.ref("nli_rounding") else float(x) for x in r]
            for r in probs]
    return {k: math.fsum(r[i] for r in rows) / len(rows) for i, k in enumerate(keys)}


def reranker_pairs(output: str, query: str, passages: Mapping[str, str],
                   opts: Options = Options()) -> list[dict]:
    """Cross-encoder inputs (s3.5): each valid cited passage of the whole output once."""
    ids = dict.fromkeys(bracket_ids(output, passages, opts))
    return [{"docid": d, "query": query, "passage": passages[d]} for d in ids]


def reranker_feature(logits: Sequence[float]) -> float | None:
    """Mean raw logit over the cited passages; None when nothing is cited."""
    return math.fsum(map(float, logits)) / len(logits) if len(logits) else None


def overlap_label(outputs: Sequence[tuple[str, str]], opts: Options = Options()) -> str | None:
    """The "Label" answer of feature 10 from a query's ``[(model, output)]`` in stored
    order. Reference: the *last* model's (the dump's overwrite bug, s3.7)."""
    if not outputs:
        return None
    if opts.ref("overlap_label"):
        return outputs[-1][1]
    return dict(outputs).get(opts.reference_model)


def _llm_answer(output: str) -> str:
    # s3.7: the dump's answer for the pointwise judges (first paragraph, ## and : removed)
    return _unhash(_para(answer_parts(output, Options.reference())[1]))


def judge_answer(output: str, opts: Options = Options()) -> str:
    """``Context: {reason} Answer: {answer}``, the answer text the pairwise and fluency
    judges see (s4.2). Reference: ``##``/``:`` removed, answer's first paragraph."""
    reason, answer, _ = answer_parts(output, opts)
    if opts.ref("answer_parts"):
        reason, answer = _unhash(reason), _unhash(_para(answer))
    return f"Context: {reason} Answer: {answer}"


def answer_overlap_prompt(query: str, response: str, label: str, lang: str,
                          wording: str = "reference") -> str:
    """Feature 10's pointwise prompt (s3.7; ``paper`` = Figure 11)."""
    return fill(PROMPTS[f"answer_overlap_{wording}"], {
        "{{language}}": language_name(lang), "{{Question}}": query,
        "{{Label}}": _llm_answer(label), "{{Response}}": _llm_answer(response)})


def fluency_prompt(query: str, contexts: str, output: str, lang: str,
                   wording: str = "reference") -> str:
    """Feature 11's pointwise prompt (s3.8; ``paper`` = Figure 12)."""
    return fill(PROMPTS[f"fluency_{wording}"], {
        "{{language}}": language_name(lang), "{{Question}}": query,
        "{{Documents}}": contexts, "{{Summary}}": judge_answer(output, Options.reference())})


def _to_int(s: str) -> int | None:
    try:
        return int(s.strip())
    except ValueError:
        return None


def parse_llm_score(text: str, kind: str, opts: Options = Options()) -> int | None:
    """``kind="score"`` (feature 10: ``Score: [[4]] Justification:``) or ``"rating"``
    (feature 11: ``##Rating: 4 ##Explanation:``). Reference: the dump's regex or 0 (s3.7,
    3.8); fixed: also ``[[n]]`` / a bare digit after the label, else None."""
    text = text or ""
    if kind == "score":
        m = re.search(r"Score:(.*?)Justification:", text, re.S)
        v = _to_int(m.group(1).replace("[", "").replace("]", "")) if m else None
        if v is None and not opts.ref("llm_parse_failure"):
            m = re.search(r"\[\[\s*([1-5])\s*\]\]", text)
            v = int(m.group(1)) if m else None
    else:
        m = re.search(r"Rating(.*?)Explanation:", text, re.S)
        v = _to_int(m.group(1).replace(":", "").replace("#", "")) if m else None
        if v is None and not opts.ref("llm_parse_failure"):
            m = re.search(r"Rating\W*([1-5])\b", text)
            v = int(m.group(1)) if m else None
    return (0 if v is None else v) if opts.ref("llm_parse_failure") else v


# --------------------------------------------------------------------------------------
# Pairwise judge: prompts and verdicts (s4)
# --------------------------------------------------------------------------------------

def pair_prompt(query: str, passages: Sequence[tuple[str, str]], answer_a: str, answer_b: str,
                wording: str = "reference") -> str:
    """One judge prompt, filled from the template constant (s4.2: documents as
    ``[docid]: text`` lines, answers as :func:`judge_answer` gives them)."""
    docs = "\n".join(f"[{d}]: {t}" for d, t in passages)
    b = "{{%s}}" if wording == "paper" else "{%s}"
    return fill(PROMPTS[f"pairwise_{wording}"], {b % "query": query, b % "documents": docs,
                                                 b % "answer_a": answer_a,
                                                 b % "answer_b": answer_b})


def judged_queries(query_ids: Iterable[str], n: int, seed: int) -> list[str]:
    """The judged subset: ``n`` of the *sorted* ids without replacement, seeded (the
    reference used Python's ``random``; ids sorted so the draw is process-independent)."""
    ids = sorted(set(query_ids))
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(ids), size=min(n, len(ids)), replace=False)
    return [ids[i] for i in sorted(pick)]


def _coin(seed: int, *parts: str) -> bool:
    """A seeded coin flip that depends only on ``parts``: the same pair of the same query
    gets the same order whoever else is in the arena."""
    import hashlib
    digest = hashlib.sha256("\x1f".join((str(seed), *parts)).encode()).digest()
    return digest[0] < 128


def pair_prompts(items: Sequence[Mapping], outputs: Mapping[str, Mapping[str, str]],
                 models: Sequence[str], opts: Options = Options()) -> list[dict]:
    """Every pair of the models that answered, on the seeded query subset, each pair in a
    seeded coin-flip presentation order (P L114, s4.3). The flip depends only on the seed,
    the query and the pair (the reference drew it from one stream after shuffling the
    roster): adding a model to the arena then leaves every existing pair's prompt as it was,
    so the cache answers them and only the new pairs are asked.
    ``outputs`` is ``{query_id: {model: output}}``."""
    by_q = {it["query_id"]: it for it in items}
    answered = [q for q in by_q if outputs.get(q)]
    rows = []
    for q in judged_queries(answered, opts.judge_queries, opts.judge_seed):
        it, outs = by_q[q], outputs[q]
        present = sorted(m for m in models if m in outs)
        for a, b in combinations(present, 2):
            if _coin(opts.judge_seed + 1, q, a, b):
                a, b = b, a
            prompt = pair_prompt(it["query"], it["passages"], judge_answer(outs[a], opts),
                                 judge_answer(outs[b], opts), opts.pairwise_prompt)
            rows.append({"item_id": f"{q}|{a}|{b}", "query_id": q, "lang": it.get("lang"),
                         "model_A": a, "model_B": b, "prompt": prompt})
    return rows


_VERDICT_TOKEN = re.compile(r"\[\[\s*([ABC])\s*\]\]")


def parse_pairwise(text: str, opts: Options = Options()) -> str | None:
    """``"A"``, ``"B"``, ``"tie"`` or None (unparsed). Reference: only the last 25
    characters, a later rule winning (tie over B over A; s4.4 item 2); fixed: the last
    ``[[A]]/[[B]]/[[C]]`` token anywhere."""
    text = text or ""
    if opts.ref("pairwise_parse"):
        tail = text[-25:]
        for token, v in (("[[C]]", "tie"), ("[[B]]", "B"), ("[[A]]", "A")):
            if token in tail:
                return v
        return None
    found = _VERDICT_TOKEN.findall(text)
    return {"A": "A", "B": "B", "C": "tie"}[found[-1]] if found else None


def normalize_verdict(v) -> str | None:
    """A stored verdict (``"A"``, ``"B"``, ``"Tie"``/``"C"``, ``[[A]]``…) -> A / B / tie."""
    if not isinstance(v, str):
        return None
    s = v.strip().strip("[]").strip().lower()
    return {"a": "A", "b": "B", "c": "tie", "tie": "tie"}.get(s)


def preferences(judgments: pd.DataFrame, models: Sequence[str]
                ) -> tuple[dict[str, list[tuple[int, int]]], dict[str, int]]:
    """``{query_id: [(winner, loser)]}`` (model indices) from the non-tie verdicts, and the
    counts of every verdict kind: ties and unparsed are counted, never dropped silently.
    Every judged query is a key, even when none of its verdicts is a win."""
    index = {m: i for i, m in enumerate(models)}
    prefs: dict[str, list[tuple[int, int]]] = {}
    counts = Counter({"A": 0, "B": 0, "tie": 0, "unparsed": 0, "unknown_model": 0})
    for q, a, b, v in judgments[["query_id", "model_A", "model_B", "verdict"]].itertuples(
            index=False):
        prefs.setdefault(q, [])
        if a not in index or b not in index:
            counts["unknown_model"] += 1
            continue
        v = v if v in ("A", "B", "tie") else None
        counts[v or "unparsed"] += 1
        if v in ("A", "B"):
            w, l = (a, b) if v == "A" else (b, a)
            prefs[q].append((index[w], index[l]))
    counts["judgments"] = len(judgments)
    return prefs, dict(counts)


# --------------------------------------------------------------------------------------
# Bradley-Terry and the bootstrap (s5)
# --------------------------------------------------------------------------------------

def bt_fit(n: int, prefs: Sequence[tuple[int, int]], alpha: float = 0.0
           ) -> tuple[np.ndarray, bool]:
    """Centred natural-log strengths (P(i beats j) = sigmoid(theta_i - theta_j)) and a
    ``degenerate`` flag. choix's ILSR, falling back to ``opt_pairwise`` (alpha 1e-6 unless
    ``alpha`` is set) when ILSR fails, as the reference does (s5.1); degenerate = that
    fallback, or a model without a win or without a loss (its MLE is infinite)."""
    import choix
    prefs = list(prefs)
    if not prefs:
        return np.zeros(n), True
    wins, losses = np.zeros(n), np.zeros(n)
    for w, l in prefs:
        wins[w] += 1
        losses[l] += 1
    degenerate = bool(((wins == 0) | (losses == 0)).any())
    try:
        with np.errstate(divide="ignore", invalid="ignore"):  # counted as degenerate instead
            theta = choix.ilsr_pairwise(n, prefs, alpha=alpha)
    except (ValueError, RuntimeError):
        theta = choix.opt_pairwise(n, prefs, alpha=alpha or 1e-6)
        degenerate = True
    theta = np.asarray(theta, dtype=float)
    return theta - theta.mean(), degenerate


@dataclass
class Bootstrap:
    """``theta[t, m]`` per tournament, ``draws[t]`` the drawn query ids (with duplicates)."""

    models: tuple[str, ...]
    theta: np.ndarray
    draws: list[list[str]]
    degenerate: int = 0

    def summary(self) -> pd.DataFrame:
        """Mean, 2.5/97.5 percentiles, ``-``/``+`` half-widths and rank (Tables 7/8)."""
        mean = self.theta.mean(axis=0)
        lo, hi = np.percentile(self.theta, [2.5, 97.5], axis=0)
        df = pd.DataFrame({"model_id": self.models, "mean": mean, "ci_low": lo, "ci_high": hi,
                           "ci_minus": mean - lo, "ci_plus": hi - mean})
        df = df.sort_values("mean", ascending=False, kind="stable").reset_index(drop=True)
        df.insert(0, "rank", np.arange(1, len(df) + 1))
        return df


def tournaments(prefs: Mapping[str, Sequence[tuple[int, int]]], models: Sequence[str],
                opts: Options = Options()) -> Bootstrap:
    """``opts.tournaments`` BT fits, each on ``opts.matches`` query ids drawn uniformly with
    replacement from the sorted judged ids (a "match" = one query with all its judgments;
    P L190, s5.2). Seeded with ``numpy.random.default_rng(bootstrap_seed)`` only."""
    ids = sorted(prefs)
    rng = np.random.default_rng(opts.bootstrap_seed)
    idx = rng.integers(0, len(ids), size=(opts.tournaments, opts.matches))
    theta = np.empty((opts.tournaments, len(models)))
    degenerate = 0
    for t, row in enumerate(idx):
        theta[t], bad = bt_fit(len(models), [p for i in row for p in prefs[ids[i]]],
                               opts.bt_alpha)
        degenerate += bad
    return Bootstrap(tuple(models), theta, [[ids[i] for i in row] for row in idx], degenerate)


# --------------------------------------------------------------------------------------
# The surrogate judge (s6)
# --------------------------------------------------------------------------------------

class FeatureTable:
    """Per (query, model) feature values, null read as 0.0 (the reference's ``or 0.0``)."""

    def __init__(self, rows: pd.DataFrame, models: Sequence[str], features: Sequence[str]):
        self.models, self.features = tuple(models), tuple(features)
        self.qids = sorted(set(rows["query_id"]))
        self._q = {q: i for i, q in enumerate(self.qids)}
        m_ix = {m: i for i, m in enumerate(models)}
        f_ix = {f: i for i, f in enumerate(features)}
        self.values = np.zeros((len(self.qids) + 1, len(models), len(features)))  # +1: absent
        for q, m, f, v in rows[["query_id", "model", "feature", "value"]].itertuples(
                index=False):
            if m in m_ix and f in f_ix and v is not None and not pd.isna(v):
                self.values[self._q[q], m_ix[m], f_ix[f]] = float(v)

    def means(self, query_ids: Sequence[str]) -> np.ndarray:
        """``X[m, f] = (1/|Q|) sum_{q in Q} value(q, m, f)`` over the list *with* its
        duplicates; a query without features counts 0 (s6.1)."""
        idx = [self._q.get(q, len(self.qids)) for q in query_ids]
        return self.values[idx].mean(axis=0)


def make_regressor(kind: str, random_state: int | None):
    """Table 3's regressors with library defaults (hyperparameters unpublished, s6.4)."""
    if kind == "random_forest":
        from sklearn.ensemble import RandomForestRegressor
        return RandomForestRegressor(random_state=random_state)
    if kind == "linear":
        from sklearn.linear_model import LinearRegression
        return LinearRegression()
    if kind == "mlp":
        from sklearn.neural_network import MLPRegressor
        return MLPRegressor(random_state=random_state)
    if kind == "svr":
        from sklearn.svm import SVR
        return SVR()
    if kind == "xgboost":
        from xgboost import XGBRegressor  # optional: not a dependency of xling
        return XGBRegressor(random_state=random_state)
    raise ValueError(f"unknown regressor {kind!r}; use one of {REGRESSORS}")


def r2(y: Sequence[float], pred: Sequence[float]) -> float:
    """Coefficient of determination as sklearn's ``r2_score`` (constant ``y``: 1.0 if
    predicted exactly, else 0.0)."""
    y, pred = np.asarray(y, float), np.asarray(pred, float)
    ss_res, ss_tot = ((y - pred) ** 2).sum(), ((y - y.mean()) ** 2).sum()
    if ss_tot == 0:
        return 1.0 if ss_res == 0 else 0.0
    return float(1 - ss_res / ss_tot)


def kendall_tau(a: Sequence[float], b: Sequence[float], opts: Options = Options()) -> float:
    """tau-b of two score vectors aligned by model. Reference: tau of the two
    ``reversed(argsort)`` orders (s6.3), which depends on how models are numbered."""
    from scipy.stats import kendalltau
    a, b = np.asarray(a, float), np.asarray(b, float)
    if opts.ref("kendall_tau"):
        a, b = np.argsort(a)[::-1].astype(float), np.argsort(b)[::-1].astype(float)
    return float(kendalltau(a, b).statistic)


def _split(models: Sequence[str], held_out: Iterable[str]) -> tuple[list[int], list[int]]:
    held = set(held_out)
    return ([i for i, m in enumerate(models) if m not in held],
            [i for i, m in enumerate(models) if m in held])


def surrogate_tournaments(boot: Bootstrap, table: FeatureTable, opts: Options = Options()
                          ) -> dict[str, np.ndarray]:
    """Algorithm 1 (P L128-144): per tournament, X = features averaged over its drawn
    queries, Y = its theta; fit on the train models, R² on the held-out ones (Table 5)."""
    train, test = _split(boot.models, opts.held_out)
    r2_held, r2_train = [], []
    for theta, draws in zip(boot.theta, boot.draws):
        x = table.means(draws)
        reg = make_regressor(opts.surrogate, opts.rf_state).fit(x[train], theta[train])
        r2_train.append(r2(theta[train], reg.predict(x[train])))
        r2_held.append(r2(theta[test], reg.predict(x[test])) if test else float("nan"))
    return {"held_out_r2": np.array(r2_held), "train_r2": np.array(r2_train)}


def surrogate_final(boot: Bootstrap, table: FeatureTable, query_ids: Sequence[str],
                    opts: Options = Options()) -> dict:
    """s6.2: X = feature means over all ``query_ids`` of the language, Y = mean theta; fit on
    the train models, predict all; tau between the judge's and the surrogate's scores."""
    train, test = _split(boot.models, opts.held_out)
    x, y = table.means(query_ids), boot.theta.mean(axis=0)
    reg = make_regressor(opts.surrogate, opts.rf_state).fit(x[train], y[train])
    pred = reg.predict(x)
    imp = getattr(reg, "feature_importances_", None)
    return {"models": boot.models, "judge": y, "surrogate": pred,
            "kendall_tau": kendall_tau(y, pred, opts), "train_r2": r2(y[train], pred[train]),
            "held_out_r2": r2(y[test], pred[test]) if test else float("nan"),
            "importances": dict(zip(table.features, imp)) if imp is not None else {}}


def arena(judgments: pd.DataFrame, features: pd.DataFrame, models: Sequence[str],
          opts: Options = Options(), query_ids: Sequence[str] | None = None) -> dict:
    """One language: BT bootstrap, per-tournament surrogate R², final surrogate and tau."""
    prefs, counts = preferences(judgments, models)
    boot = tournaments(prefs, models, opts)
    table = FeatureTable(features, models, opts.features)
    per_t = surrogate_tournaments(boot, table, opts)
    final = surrogate_final(boot, table, query_ids if query_ids is not None else table.qids,
                            opts)
    return {"bootstrap": boot, "bt": boot.summary(), "counts": counts,
            "degenerate_tournaments": boot.degenerate, "table": table, **per_t,
            "final": final}


def regressor_ablation(theta: Sequence[float], x: np.ndarray, kinds: Sequence[str] = REGRESSORS,
                       n_held_out: int = 4, repeats: int = 50, seed: int = 0,
                       random_state: int | None = 0) -> dict[str, dict[str, float]]:
    """Table 3 (P L196-215): random train/held-out splits of the models (``n_held_out`` held
    out), ``repeats`` times; mean train and held-out R² per regressor."""
    theta = np.asarray(theta, float)
    rng = np.random.default_rng(seed)
    splits = [rng.permutation(len(theta)) for _ in range(repeats)]
    out = {}
    for kind in kinds:
        tr, ho = [], []
        for perm in splits:
            test, train = perm[:n_held_out], perm[n_held_out:]
            reg = make_regressor(kind, random_state).fit(x[train], theta[train])
            tr.append(r2(theta[train], reg.predict(x[train])))
            ho.append(r2(theta[test], reg.predict(x[test])))
        out[kind] = {"train_r2": float(np.mean(tr)), "held_out_r2": float(np.mean(ho))}
    return out


def feature_set_taus(boot: Bootstrap, features: pd.DataFrame, query_ids: Sequence[str],
                     opts: Options = Options()) -> dict[str, float]:
    """Table 4 (P L220-225): the final surrogate's tau with each of ``FEATURE_SETS``."""
    out = {}
    for name, subset in FEATURE_SETS.items():
        o = replace(opts, features=subset)
        out[name] = surrogate_final(boot, FeatureTable(features, boot.models, subset),
                                    query_ids, o)["kendall_tau"]
    return out


# --------------------------------------------------------------------------------------
# Tables in the paper's shapes
# --------------------------------------------------------------------------------------

def table_tau(taus: Mapping[str, float]) -> pd.DataFrame:
    """Table 2: tau per language and their average (last row, ``lang="avg"``)."""
    df = pd.DataFrame({"lang": list(taus), "tau": [float(v) for v in taus.values()]})
    return pd.concat([df, pd.DataFrame({"lang": ["avg"], "tau": [df["tau"].mean()]})],
                     ignore_index=True)


def table_r2(r2s: Mapping[str, Sequence[float]]) -> pd.DataFrame:
    """Table 5: mean held-out R² over the tournaments with the 95% interval as -/+."""
    rows = []
    for lang, vals in r2s.items():
        v = np.asarray(vals, float)
        v = v[~np.isnan(v)]
        mean = v.mean() if len(v) else float("nan")
        lo, hi = np.percentile(v, [2.5, 97.5]) if len(v) else (float("nan"),) * 2
        rows.append({"lang": lang, "mean": mean, "ci_minus": mean - lo, "ci_plus": hi - mean})
    return pd.DataFrame(rows)


def table_bt(bts: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Tables 7/8: ``lang, rank, model_id, mean, ci_minus, ci_plus`` (the CSV's columns)."""
    cols = ["rank", "model_id", "mean", "ci_minus", "ci_plus"]
    return pd.concat([bt[cols].assign(lang=lang)[["lang", *cols]] for lang, bt in bts.items()],
                     ignore_index=True)


def table_feature_sets(taus: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """Table 4: one row per feature set (``#F``), one column per language, and the mean."""
    rows = []
    for name, subset in FEATURE_SETS.items():
        row = {"features": name, "#F": len(subset)}
        row.update({lang: float(t[name]) for lang, t in taus.items()})
        row["mean"] = float(np.mean([t[name] for t in taus.values()]))
        rows.append(row)
    return pd.DataFrame(rows)


def table_regressors(results: Mapping[str, Mapping[str, Mapping[str, float]]]) -> pd.DataFrame:
    """Table 3: rows (split, regressor), one column per language."""
    langs = list(results)
    kinds = list(next(iter(results.values()))) if results else []
    return pd.DataFrame([{"split": split, "regressor": k,
                          **{lang: results[lang][k][split] for lang in langs}}
                         for split in ("train_r2", "held_out_r2") for k in kinds])


def paper_tables(results: Mapping[str, Mapping]) -> dict[str, pd.DataFrame]:
    """Tables 2, 5, 7/8 and the per-model feature means from :func:`arena` results per
    language (plus Tables 3/4 when a result holds ``regressors`` / ``feature_sets``)."""
    out = {"table2": table_tau({l: r["final"]["kendall_tau"] for l, r in results.items()}),
           "table5": table_r2({l: r["held_out_r2"] for l, r in results.items()}),
           "table7_8": table_bt({l: r["bt"] for l, r in results.items()})}
    rows = []
    for lang, r in results.items():
        t = r["table"]
        x = t.means(t.qids)
        rows += [{"lang": lang, "model": m, **dict(zip(t.features, x[i]))}
                 for i, m in enumerate(t.models)]
    out["feature_means"] = pd.DataFrame(rows)
    if all("feature_sets" in r for r in results.values()) and results:
        out["table4"] = table_feature_sets({l: r["feature_sets"] for l, r in results.items()})
    if all("regressors" in r for r in results.values()) and results:
        out["table3"] = table_regressors({l: r["regressors"] for l, r in results.items()})
    return out


# --------------------------------------------------------------------------------------
# Loaders for the published layouts (s1.3)
# --------------------------------------------------------------------------------------

def _filesystem(path: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    if filesystem is not None:
        return filesystem, path
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), str(Path(path).resolve())


def read_split(path: str, lang: str | None = None, split: str = "dev",
               filesystem: pafs.FileSystem | None = None) -> pa.Table:
    """A hub snapshot's ``{lang}/{split}-*.parquet`` (or one Parquet file), local or s3.
    ``dev.small-*`` files beside ``dev-*`` are not read."""
    fs, root = _filesystem(path, filesystem)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        files = [root]
    else:
        base = f"{root.rstrip('/')}/{lang}" if lang else root
        nested = not lang or fs.get_file_info(base).type == pafs.FileType.Directory
        # without a {lang}/ folder only the files directly in root are this language's
        found = fs.get_file_info(pafs.FileSelector(base if nested else root, recursive=nested,
                                                   allow_not_found=True))
        files = sorted(f.path for f in found if f.type == pafs.FileType.File
                       and re.fullmatch(rf"{re.escape(split)}(-.*)?\.parquet", f.base_name))
    if not files:
        raise FileNotFoundError(f"{path}: no {split}-*.parquet for {lang or 'any language'}; "
                                "point at a snapshot of the hub dataset")
    return pa.concat_tables([pq.read_table(f, filesystem=fs) for f in files],
                            promote_options="default")


def load_queries(path: str, lang: str, split: str = "dev",
                 filesystem: pafs.FileSystem | None = None) -> list[dict]:
    """``nthakur/mirage-bench`` rows as items: ``query_id, lang, query, passages
    [(docid, text)], contexts, qrels {docid: 1/0}, prompt, error``."""
    items = []
    for row in read_split(path, lang, split, filesystem).to_pylist():
        parsed = parse_prompt(row.get("prompt") or "")
        qrels = {d: 0 for d in row.get("negative_ids") or []}
        qrels.update({d: 1 for d in row.get("positive_ids") or []})
        items.append({"query_id": str(row["query_id"]), "lang": lang, "query": parsed["query"],
                      "passages": parsed["passages"], "contexts": parsed["contexts"],
                      "qrels": qrels, "prompt": row.get("prompt"), "error": parsed["error"]})
    return items


def load_outputs(path: str, lang: str, split: str = "dev",
                 filesystem: pafs.FileSystem | None = None
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``nthakur/mirage-bench-output``: generations ``query_id, model, output`` (in the
    stored ``outputs`` order) and long feature rows ``query_id, model, feature, value``
    (research column names mapped to the released ones; null kept as NaN)."""
    table = read_split(path, lang, split, filesystem)
    gens, feats = [], []
    feature_cols = [c for c in table.column_names if (c in FEATURES or c in FEATURE_ALIASES
                    or c == "support_contradiction") and pa.types.is_struct(table.schema.field(
                        c).type)]
    for row in table.select(["query_id", "outputs", *feature_cols]).to_pylist():
        q = str(row["query_id"])
        gens += [{"query_id": q, "model": o["model"], "output": o["output"]}
                 for o in row["outputs"] or []]
        for c in feature_cols:
            name = FEATURE_ALIASES.get(c, c)
            feats += [{"query_id": q, "model": m, "feature": name,
                       "value": float("nan") if v is None else float(v)}
                      for m, v in (row[c] or {}).items()]
    return (pd.DataFrame(gens, columns=["query_id", "model", "output"]),
            pd.DataFrame(feats, columns=["query_id", "model", "feature", "value"]))


def load_judgments(path: str, lang: str, split: str = "dev",
                   filesystem: pafs.FileSystem | None = None, opts: Options = Options()
                   ) -> pd.DataFrame:
    """``nthakur/mirage-bench-pairwise-judgments``: ``query_id, model_A, model_B, verdict``
    with verdict normalised to A / B / tie / None; a verdict that is not one of these is
    re-parsed from the raw judge ``output`` when that column exists."""
    df = read_split(path, lang, split, filesystem).to_pandas()
    df["query_id"] = df["query_id"].astype(str)
    raw = df["output"] if "output" in df else pd.Series([None] * len(df), index=df.index)
    df["verdict"] = [normalize_verdict(v) or (parse_pairwise(o, opts) if isinstance(o, str)
                                              else None)
                     for v, o in zip(df["verdict"], raw)]
    return df


# --------------------------------------------------------------------------------------
# The study protocol (jobs/study.py): options, prompt sets, feature inputs and their
# reductions, pair prompts, scoring into metric rows, tables
# --------------------------------------------------------------------------------------

STUDY = "mirage"
SETTING = "rag"  # one setting: the published RAG prompt (P §3.1)
JUDGE_SCOPE = "pairs"  # the judge compares every pair of models (jobs/study.py)
# Which scorer makes which feature (s3); the features stage runs one cell per scorer.
SCORERS = {"lexical": ("citation_MAP@10", "citation_Recall@10", "answer_bleu", "answer_rougeL"),
           "langid": ("target_language", "english_language"),
           "nli": ("support_entailment", "support_neutral"),
           "reranker": ("reranker_score",),
           "llm": ("answer_overlap_score", "fluency_score")}
SOURCES = ("run", "published")
_OPTION_FIELDS = ("pairwise_prompt", "instruction", "reference_model", "judge_queries",
                  "judge_seed", "tournaments", "matches", "bootstrap_seed", "bt_alpha",
                  "held_out", "features", "surrogate", "random_state", *_COMPAT)


def check_options(raw: dict | None) -> dict:
    """``study.options`` checked and completed (a JSON-able dict: cells hash it)::

        data            snapshot of nthakur/mirage-bench ({lang}/dev-*.parquet), local or s3://
        source          run (generate, features, arena in this run) | published (the hub's
                        outputs, features and judgments: needs ``outputs`` and ``judgments``)
        outputs         snapshot of nthakur/mirage-bench-output
        judgments       snapshot of nthakur/mirage-bench-pairwise-judgments
        langs           subset of the 18 languages (default all)
        split           dev
        limit           first N queries per language (tiny runs)
        models          arena roster (default: every model that answered)
        both_orders     ask the judge both presentation orders of a pair; an
                        order-inconsistent pair counts as a tie
        ablations       also Tables 3 and 4
        compat          fixed | reference: every research-code quirk at once (Options)
        + every field of :class:`Options` (a compat item given alone overrides ``compat``)
    """
    raw = dict(raw or {})
    known = {"data", "source", "outputs", "judgments", "langs", "split", "limit", "models",
             "both_orders", "ablations", "compat", *_OPTION_FIELDS}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"study.options: unknown {unknown}; known: {sorted(known)}")
    if not raw.get("data"):
        raise ValueError("study.options.data: the MIRAGE-Bench snapshot (nthakur/mirage-bench: "
                         "{lang}/dev-*.parquet), a local path or s3:// URI")
    source = raw.get("source", "run")
    if source not in SOURCES:
        raise ValueError(f"study.options.source: {source!r}; use run or published")
    if source == "published":
        for key in ("outputs", "judgments"):
            if not raw.get(key):
                raise ValueError(f"study.options.{key}: source: published reads the hub's "
                                 f"{'answers and features' if key == 'outputs' else 'verdicts'}"
                                 f" (nthakur/mirage-bench-{'output' if key == 'outputs' else 'pairwise-judgments'})")
    langs = list(raw.get("langs") or LANGS)
    bad = [l for l in langs if l not in LANGS]
    if bad:
        raise ValueError(f"study.options.langs: {bad} are not MIRAGE-Bench languages "
                         f"({', '.join(LANGS)})")
    compat = raw.get("compat", "fixed")
    if compat not in ("fixed", "reference"):
        raise ValueError(f"study.options.compat: {compat!r}; use fixed or reference")
    fields = {n: compat for n in _COMPAT}
    fields.update({k: raw[k] for k in _OPTION_FIELDS if k in raw})
    for k in ("held_out", "features"):
        if k in fields:
            fields[k] = tuple(fields[k])
    opts = Options(**fields)  # raises on a bad value, naming the option
    limit = raw.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError("study.options.limit: a positive number of queries per language")
    models = raw.get("models")
    if models is not None and (not isinstance(models, list) or len(models) < 2):
        raise ValueError("study.options.models: a list of at least two arena models")
    out = {"data": str(raw["data"]), "source": source, "outputs": raw.get("outputs"),
           "judgments": raw.get("judgments"), "langs": langs, "split": raw.get("split", "dev"),
           "limit": limit, "models": models, "both_orders": bool(raw.get("both_orders", False)),
           "ablations": bool(raw.get("ablations", False)), "compat": compat}
    out.update({k: (list(v) if isinstance(v, tuple) else v)
                for k, v in opts.__dict__.items()})
    return out


def options_of(opts: Mapping) -> Options:
    return Options(**{k: (tuple(opts[k]) if isinstance(opts[k], list) else opts[k])
                      for k in _OPTION_FIELDS if k in opts})


def published(opts: Mapping) -> bool:
    return opts.get("source") == "published"


def prompt_cells(opts: Mapping) -> list[dict]:
    if published(opts):
        return []
    return [{"setting": SETTING, "lang": l} for l in opts["langs"]]


def input_files(opts: Mapping) -> list[str]:
    """The Parquet files the study reads (the cells' inputs, fingerprinted by the runner)."""
    roots = [opts["data"]] + ([opts["outputs"], opts["judgments"]] if published(opts) else [])
    files = []
    for root in roots:
        fs, base = _filesystem(root, None)
        scheme = root.split("://", 1)[0] + "://" if "://" in root else ""
        for lang in opts["langs"]:
            found = fs.get_file_info(pafs.FileSelector(f"{base.rstrip('/')}/{lang}",
                                                       recursive=True, allow_not_found=True))
            names = sorted(f.path for f in found if f.type == pafs.FileType.File and re.fullmatch(
                rf"{re.escape(opts['split'])}(-.*)?\.parquet", f.base_name))
            if not names:
                raise FileNotFoundError(f"{root}: no {lang}/{opts['split']}-*.parquet; point "
                                        "study.options at a snapshot of the hub dataset")
            files += [scheme + n if scheme else n for n in names]
    return files


def parser_for(setting: str) -> str:
    return "mirage_rag"


def parse_rag_output(text: str) -> tuple[dict | None, str | None]:
    """The generate stage's parser: reason, answer and cited ids in order. Never an error:
    an answer out of format is data (it scores low on the features)."""
    parsed = parse_rag_answer(text)
    return {k: (v if isinstance(v, str) else str(v)) for k, v in parsed.items()}, None


def items_of(opts: Mapping, lang: str) -> list[dict]:
    """The language's queries (the first ``limit``, in file order)."""
    items = load_queries(opts["data"], lang, opts["split"])
    return items[:opts["limit"]] if opts.get("limit") else items


def build_prompts(opts: Mapping, setting: str, lang: str, *, translations=None) -> list[dict]:
    """One user message per query: the published prompt, or its instruction replaced
    (``instruction``: paper | api_scripts, s2.2)."""
    rows = []
    for it in items_of(opts, lang):
        row = {"item_id": it["query_id"], "study": STUDY, "setting": setting, "lang": lang,
               "prompt": None, "error": it["error"]}
        if not it["error"]:
            try:
                text = rebuild_prompt(it["prompt"], lang, opts["instruction"])
                row["prompt"] = [{"role": "user", "content": text}]
            except ValueError as e:
                row["error"] = str(e)
        rows.append(row)
    return rows


def _outputs_by_query(gens: Iterable[Mapping]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for g in gens:
        if g.get("output") and not _failed(g):
            out.setdefault(str(g["item_id"]), {})[g["model"]] = g["output"]
    return out


def _failed(g: Mapping) -> bool:
    # a generation the engine could not make (the mirage_rag parser itself never fails)
    return bool(g.get("error")) and not g.get("output")


def pair_rows(opts: Mapping, generations: Sequence[Mapping]) -> list[dict]:
    """The arena's judge prompts for one (setting, lang): every pair of models on the seeded
    query subset, ``item_id = query|model_A|model_B`` (both orders with ``both_orders``).
    The prompts are filled from the template constant for each pair, so every prompt holds
    its own query and answers (the released evaluator's bug, s4.5, cannot happen)."""
    if not generations:
        return []
    o, lang = options_of(opts), generations[0]["lang"]
    setting = generations[0]["setting"]
    outs = _outputs_by_query(generations)
    roster = opts.get("models") or sorted({g["model"] for g in generations})
    rows = []
    for p in pair_prompts(items_of(opts, lang), outs, roster, o):
        pairs = [(p["model_A"], p["model_B"], p["prompt"])]
        if opts.get("both_orders"):
            it = next(i for i in items_of(opts, lang) if i["query_id"] == p["query_id"])
            swapped = pair_prompt(it["query"], it["passages"],
                                  judge_answer(outs[p["query_id"]][p["model_B"]], o),
                                  judge_answer(outs[p["query_id"]][p["model_A"]], o),
                                  o.pairwise_prompt)
            pairs.append((p["model_B"], p["model_A"], swapped))
        for a, b, prompt in pairs:
            rows.append({"item_id": f"{p['query_id']}|{a}|{b}", "study": STUDY,
                         "setting": setting, "lang": lang,
                         "prompt": [{"role": "user", "content": prompt}], "error": None})
    return rows


def judge_parser(opts: Mapping) -> str:
    """The parser of the arena's verdicts (tasks/parsers.py), by ``pairwise_parse``."""
    return "mirage_pairwise" + ("_reference" if opts["pairwise_parse"] == "reference" else "")


def parse_pair_verdict(text: str, compat: str = "fixed") -> tuple[dict | None, str | None]:
    """The judge stage's parser for pair prompts: verdict A / B / tie; nothing -> error."""
    opts = Options.reference() if compat == "reference" else Options()
    v = parse_pairwise(text, opts)
    return ({"verdict": v}, None) if v else (None, "no [[A]], [[B]] or [[C]] verdict")


def merge_orders(judgments: pd.DataFrame) -> pd.DataFrame:
    """Both presentation orders of a pair -> one verdict in the first order's terms: the
    same winner both times stands; a disagreement is a tie; one order unparsed or missing
    leaves the other."""
    rows, seen = [], {}
    for r in judgments.to_dict("records"):
        key = (r["query_id"], frozenset((r["model_A"], r["model_B"])))
        winner = {"A": r["model_A"], "B": r["model_B"], "tie": "tie"}.get(r["verdict"])
        if key not in seen:
            seen[key] = len(rows)
            rows.append({**r, "_winners": [winner]})
        else:
            rows[seen[key]]["_winners"].append(winner)
    for r in rows:
        got = [w for w in r.pop("_winners") if w is not None]
        if not got:
            r["verdict"] = None
        elif len(set(got)) > 1:
            r["verdict"] = "tie"
        else:
            w = got[0]
            r["verdict"] = "tie" if w == "tie" else ("A" if w == r["model_A"] else "B")
    return pd.DataFrame(rows, columns=list(judgments.columns))


def _sentences_for(lang: str, text: str) -> list[str]:
    return _sentences(lang, text)


def feature_inputs(opts: Mapping, scorer: str, lang: str, generations: Sequence[Mapping],
                   ) -> list[dict]:
    """What one scorer is asked about a language's generations: rows ``input_id, item_id,
    model`` plus the scorer's inputs (``premise, hypothesis`` for nli; ``query, passage`` for
    reranker; ``text`` for langid; ``prompt`` and ``kind`` for llm; ``output`` for lexical).
    A generation with nothing to score (no citation, a failed generation, an unknown query)
    is one row with an ``error``: the features stage counts it, and the feature is missing,
    as in the reference."""
    import json

    o = options_of(opts)
    items = {it["query_id"]: it for it in items_of(opts, lang)}
    rows = []
    for g in generations:
        it = items.get(str(g["item_id"]))
        if it is None or it["error"] or _failed(g):
            why = (f"no query {g['item_id']} in {lang}" if it is None else it["error"]
                   or f"no answer to score: {g.get('error')}")
            rows.append({"item_id": str(g["item_id"]), "model": g["model"],
                         "input_id": f"{g['item_id']}|{g['model']}|-", "error": why})
            continue
        q, m, out = it["query_id"], g["model"], g.get("output") or ""
        base = {"item_id": q, "model": m}
        passages = dict(it["passages"])
        if scorer == "lexical":
            ref = next((x.get("output") for x in generations if str(x["item_id"]) == q
                        and x["model"] == o.reference_model and not _failed(x)), None)
            rows.append({**base, "input_id": f"{q}|{m}", "output": out, "label": ref,
                         "qrels": json.dumps(it["qrels"], sort_keys=True), "lang": lang})
        elif scorer == "langid":
            rows.append({**base, "input_id": f"{q}|{m}", "text": langid_text(out, passages)})
        elif scorer in ("nli", "reranker"):
            if scorer == "nli":
                got = [{**base, "input_id": f"{q}|{m}|{i}", **p}
                       for i, p in enumerate(support_pairs(out, passages, lang, o))]
            else:
                got = [{**base, "input_id": f"{q}|{m}|{p['docid']}", "query": p["query"],
                        "passage": p["passage"]}
                       for p in reranker_pairs(out, it["query"], passages, o)]
            # nothing cited: a counted error row (the feature is then missing, as in the
            # reference), so every answer is accounted for and a cell is never empty
            rows += got or [{**base, "input_id": f"{q}|{m}|-",
                             "error": "no valid citation to score"}]
        elif scorer == "llm":
            label = overlap_label([(x["model"], x.get("output") or "") for x in generations
                                   if str(x["item_id"]) == q], o)
            if label is not None and "answer_overlap_score" in o.features:
                rows.append({**base, "input_id": f"{q}|{m}|overlap", "kind": "score",
                             "prompt": answer_overlap_prompt(it["query"], out, label, lang)})
            if "fluency_score" in o.features:
                rows.append({**base, "input_id": f"{q}|{m}|fluency", "kind": "rating",
                             "prompt": fluency_prompt(it["query"], it["contexts"], out, lang)})
        else:
            raise ValueError(f"unknown scorer {scorer!r}; MIRAGE's are {sorted(SCORERS)}")
    return rows


def scorers(opts: Mapping) -> list[str]:
    """The scorers the chosen features need (none when the features are published)."""
    if published(opts):
        return []
    feats = set(opts["features"])
    return [s for s, fs in SCORERS.items() if feats & set(fs)]


def lexical_scores(opts: Mapping, rows: Sequence[Mapping]) -> list[dict]:
    """Features 3, 4, 8, 9 of lexical input rows (``output, label, qrels`` JSON, ``lang``),
    one ``{feature: value}`` per row. The BLEU/ROUGE label is the reference model's answer
    (None without one, so those two features are missing)."""
    import json

    o = options_of(opts)
    out = []
    for r in rows:
        vals = citation_scores(r["output"], json.loads(r["qrels"]), o)
        label = None if r.get("label") is None else overlap_answer(r["label"], o)
        hyp = overlap_answer(r["output"], o)
        vals["answer_bleu"] = None if label is None else bleu(hyp, label)
        vals["answer_rougeL"] = None if label is None else rouge_l(hyp, label, r["lang"])
        out.append(vals)
    return out


def reduce_features(opts: Mapping, scored: Sequence[Mapping]) -> pd.DataFrame:
    """The features stage's scored rows (``scorer, item_id, model, scores {name: value},
    output, kind``) -> long feature rows ``query_id, model, feature, value`` (s3 formulas)."""
    o = options_of(opts)
    by: dict[tuple[str, str, str], list[Mapping]] = {}
    for r in scored:
        if r.get("error"):
            continue
        by.setdefault((r["scorer"], r["item_id"], r["model"]), []).append(r)
    out = []
    for (scorer, q, m), rs in by.items():
        lang = rs[0].get("lang")
        if scorer == "lexical":
            vals = dict(rs[0]["scores"])
        elif scorer == "langid":
            vals = language_features(rs[0]["scores"], lang, o)
        elif scorer == "nli":
            vals = support_features([(r["scores"]["entailment"], r["scores"]["neutral"],
                                      r["scores"]["contradiction"]) for r in rs], o)
        elif scorer == "reranker":
            vals = {"reranker_score": reranker_feature([r["scores"]["score"] for r in rs])}
        else:  # llm
            names = {"score": "answer_overlap_score", "rating": "fluency_score"}
            vals = {names[r["kind"]]: parse_llm_score(r.get("output") or "", r["kind"], o)
                    for r in rs}
        out += [{"query_id": q, "model": m, "feature": f, "value": v}
                for f, v in vals.items() if f in o.features]
    return pd.DataFrame(out, columns=["query_id", "model", "feature", "value"])


def split_pair_id(item_id: str) -> tuple[str, str, str]:
    q, a, b = str(item_id).rsplit("|", 2)
    return q, a, b


def _published_inputs(opts: Mapping, lang: str, o: Options
                      ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    gens, feats = load_outputs(opts["outputs"], lang, opts["split"])
    judg = load_judgments(opts["judgments"], lang, opts["split"], opts=o)
    if opts.get("limit"):
        keep = {it["query_id"] for it in items_of(opts, lang)}
        gens, feats = gens[gens["query_id"].isin(keep)], feats[feats["query_id"].isin(keep)]
        judg = judg[judg["query_id"].isin(keep)]
    return gens, feats, judg


def _run_judgments(judgments: Sequence[Mapping], lang: str) -> pd.DataFrame:
    rows = []
    for j in judgments:
        if j.get("lang") != lang:
            continue
        q, a, b = split_pair_id(j["item_id"])
        rows.append({"query_id": q, "model_A": a, "model_B": b, "judge": j.get("judge"),
                     "verdict": j.get("verdict") if not j.get("error") else None,
                     "error": j.get("error")})
    return pd.DataFrame(rows, columns=["query_id", "model_A", "model_B", "judge", "verdict",
                                       "error"])


def _m(lang, model, metric, value, n=None, lo=None, hi=None) -> dict:
    value = None if value is None or (isinstance(value, float) and math.isnan(value)) \
        else float(value)
    return {"study": STUDY, "setting": SETTING, "lang": lang, "model": model, "metric": metric,
            "value": value, "ci_low": None if lo is None else float(lo),
            "ci_high": None if hi is None else float(hi), "n": n}


def score(opts: dict, generations: list[dict], judgments: list[dict] | None, *,
          features: list[dict] | None = None, **_) -> tuple[list[dict], list[dict]]:
    """Per language: the BT leaderboard with bootstrap intervals (Tables 7/8), the surrogate's
    scores, tau (Table 2) and held-out R² (Table 5), feature means; ``lang="avg"`` the mean
    tau. Items are the judgments as the arena counted them. With ``source: published`` the
    hub's outputs, features and verdicts are read here instead of the run's."""
    o = options_of(opts)
    feats_run = reduce_features(opts, features or []) if not published(opts) else None
    items, metrics, taus = [], [], {}
    for lang in opts["langs"]:
        if published(opts):
            gens, feats, judg = _published_inputs(opts, lang, o)
            gens = gens.rename(columns={"query_id": "item_id"})
        else:
            gens = pd.DataFrame([g for g in generations if g["lang"] == lang],
                                columns=["item_id", "model", "output", "error"])
            judg = _run_judgments(judgments or [], lang)
            if opts.get("both_orders"):
                judg = merge_orders(judg)
            lang_q = {str(q) for q in gens["item_id"]}
            feats = feats_run[feats_run["query_id"].isin(lang_q)]
        roster = list(opts.get("models") or sorted(set(gens["model"])))
        if len(roster) < 2 or judg.empty:
            metrics.append(_m(lang, "all", "judgments", len(judg), n=len(judg)))
            continue
        qids = sorted({str(q) for q in gens["item_id"]})
        res = arena(judg, feats, roster, o, query_ids=qids)
        if opts.get("ablations"):  # Tables 3 and 4
            res["feature_sets"] = feature_set_taus(res["bootstrap"], feats, qids, o)
            kinds = [k for k in REGRESSORS if k != "xgboost" or _has("xgboost")]
            res["regressors"] = regressor_ablation(
                res["bootstrap"].theta.mean(axis=0), res["table"].means(qids), kinds,
                n_held_out=min(4, max(1, len(roster) // 4)), random_state=o.rf_state)
        final, counts, bt = res["final"], res["counts"], res["bt"]
        sur = dict(zip(final["models"], final["surrogate"]))
        sur_rank = {m: i + 1 for i, m in enumerate(sorted(sur, key=lambda m: -sur[m]))}
        fmeans = res["table"].means(res["table"].qids)
        for r in bt.itertuples(index=False):
            i = roster.index(r.model_id)
            metrics += [_m(lang, r.model_id, "bt", r.mean, o.tournaments, r.ci_low, r.ci_high),
                        _m(lang, r.model_id, "bt_rank", r.rank),
                        _m(lang, r.model_id, "surrogate", sur[r.model_id]),
                        _m(lang, r.model_id, "surrogate_rank", sur_rank[r.model_id]),
                        _m(lang, r.model_id, "held_out", float(r.model_id in o.held_out))]
            metrics += [_m(lang, r.model_id, f"feature:{f}", fmeans[i][k], len(qids))
                        for k, f in enumerate(o.features)]
        held = res["held_out_r2"][~np.isnan(res["held_out_r2"])]
        lo, hi = np.percentile(held, [2.5, 97.5]) if len(held) else (None, None)
        metrics += [_m(lang, "all", "kendall_tau", final["kendall_tau"], len(roster)),
                    _m(lang, "all", "held_out_r2", held.mean() if len(held) else None,
                       len(held), lo, hi),
                    _m(lang, "all", "train_r2", final["train_r2"], len(roster)),
                    _m(lang, "all", "judged_queries", judg["query_id"].nunique()),
                    _m(lang, "all", "judgments", counts["judgments"]),
                    _m(lang, "all", "ties", counts["tie"]),
                    _m(lang, "all", "unparsed", counts["unparsed"]),
                    _m(lang, "all", "degenerate_tournaments", res["degenerate_tournaments"],
                       o.tournaments)]
        metrics += [_m(lang, "all", f"rf_importance:{f}", v)
                    for f, v in final["importances"].items()]
        metrics += [_m(lang, "all", f"feature_set_tau:{k}", v)
                    for k, v in res.get("feature_sets", {}).items()]
        metrics += [_m(lang, "all", f"regressor:{kind}:{split}", v)
                    for kind, r in res.get("regressors", {}).items() for split, v in r.items()]
        taus[lang] = final["kendall_tau"]
        items += [{"lang": lang, **{k: (None if isinstance(v, float) and math.isnan(v) else v)
                                    for k, v in r.items()}}
                  for r in judg.to_dict("records")]
    if taus:
        vals = [v for v in taus.values() if not math.isnan(v)]
        metrics.append(_m("avg", "all", "kendall_tau", float(np.mean(vals)) if vals else None,
                          len(vals)))
    return items, metrics


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _f(v, digits=3) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def tables(metrics: Iterable[Mapping]) -> str:
    """Markdown: Table 2 (tau), Table 5 (held-out R²), the arena's counts, and Tables 7/8
    (each language's leaderboard: judge BT score with its 95% interval, surrogate rank)."""
    df = pd.DataFrame(list(metrics))
    if df.empty:
        return "## MIRAGE-Bench\n\nno results\n"
    out = ["## MIRAGE-Bench: Table 2 (Kendall tau, surrogate vs judge) and Table 5 "
           "(held-out R²)\n", "| lang | tau | held-out R² (95% CI) | judgments | ties | "
           "unparsed | degenerate BT fits |", "|---|---|---|---|---|---|---|"]
    allm = df[df["model"] == "all"]
    for lang in dict.fromkeys(allm["lang"]):
        g = allm[allm["lang"] == lang].set_index("metric")

        def v(k, col="value", g=g):
            return g[col].get(k) if k in g.index else None
        r2s = _f(v("held_out_r2"))
        if r2s and v("held_out_r2", "ci_low") is not None:
            r2s += f" ({_f(v('held_out_r2', 'ci_low'))}, {_f(v('held_out_r2', 'ci_high'))})"
        cnt = [("" if v(k) is None else str(int(v(k)))) for k in
               ("judgments", "ties", "unparsed", "degenerate_tournaments")]
        out.append(f"| {lang} | {_f(v('kendall_tau'))} | {r2s} | {' | '.join(cnt)} |")
    for prefix, title in (("feature_set_tau:", "Table 4: surrogate tau by feature set"),
                          ("regressor:", "Table 3: train / held-out R² by regressor")):
        sub = allm[allm["metric"].str.startswith(prefix)]
        if sub.empty:
            continue
        langs = list(dict.fromkeys(sub["lang"]))
        out += ["", f"### {title}\n", "| | " + " | ".join(langs) + " | mean |",
                "|---" * (len(langs) + 2) + "|"]
        for metric in dict.fromkeys(sub["metric"]):
            vals = [sub[(sub["lang"] == l) & (sub["metric"] == metric)]["value"] for l in langs]
            vals = [float(v.iloc[0]) if len(v) and v.iloc[0] is not None else float("nan")
                    for v in vals]
            mean = float(np.nanmean(vals)) if not all(map(math.isnan, vals)) else float("nan")
            out.append(f"| {metric.removeprefix(prefix)} | "
                       + " | ".join(_f(v) for v in vals) + f" | {_f(mean)} |")
    for lang in dict.fromkeys(df.loc[df["metric"] == "bt", "lang"]):
        g = df[(df["lang"] == lang) & (df["model"] != "all")]
        bt = g[g["metric"] == "bt"].set_index("model")
        rank = g[g["metric"] == "bt_rank"].set_index("model")["value"]
        srank = g[g["metric"] == "surrogate_rank"].set_index("model")["value"]
        out += ["", f"### Tables 7/8: {lang} leaderboard (Bradley-Terry, 95% bootstrap CI)\n",
                "| rank | model | score | -CI | +CI | surrogate rank |", "|---|---|---|---|---|---|"]
        for m in rank.sort_values().index:
            r = bt.loc[m]
            out.append(f"| {int(rank[m])} | {m} | {_f(r['value'])} | "
                       f"{_f(r['value'] - r['ci_low'])} | {_f(r['ci_high'] - r['value'])} | "
                       f"{int(srank[m])} |")
    return "\n".join(out) + "\n"


def plot_leaderboards(metrics: Iterable[Mapping], path: str | Path) -> Path | None:
    """One panel per language: each model's BT score with its 95% bootstrap interval, best
    on top (the paper's Figure 4 / Tables 7-8 as a picture). PNG at ``path``."""
    df = pd.DataFrame(list(metrics))
    if df.empty or not (df["metric"] == "bt").any():
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bt = df[df["metric"] == "bt"]
    langs = list(dict.fromkeys(bt["lang"]))
    cols = min(3, len(langs))
    rows_n = math.ceil(len(langs) / cols)
    n_models = bt.groupby("lang").size().max()
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 0.35 * n_models * rows_n + 1.5),
                             squeeze=False)
    for ax, lang in zip(axes.flat, langs):
        g = bt[bt["lang"] == lang].sort_values("value")
        y = np.arange(len(g))
        # a skewed bootstrap can put the mean outside its percentile interval: no bar then
        xerr = [np.maximum(0, g["value"] - g["ci_low"]), np.maximum(0, g["ci_high"] - g["value"])]
        ax.errorbar(g["value"], y, xerr=xerr, fmt="o", capsize=3)
        ax.set_yticks(y, [m.split("/")[-1] for m in g["model"]], fontsize=8)
        ax.set_title(f"{lang}")
        ax.set_xlabel("Bradley-Terry score (95% CI)")
        ax.axvline(0, color="grey", lw=0.5)
    for ax in list(axes.flat)[len(langs):]:
        ax.axis("off")
    fig.suptitle("MIRAGE-Bench arena leaderboards")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(metrics: Iterable[Mapping]) -> dict[str, bytes]:
    """The evaluate stage's figures: ``leaderboard.png`` (see :func:`plot_leaderboards`)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = plot_leaderboards(metrics, Path(d) / "leaderboard.png")
        return {"leaderboard.png": path.read_bytes()} if path else {}
