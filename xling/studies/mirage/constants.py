"""MIRAGE-Bench's fixed names: languages, the 19 arena models, the eleven features and their
aliases on the hub, Table 3's regressors, and which scorer makes which feature."""

from __future__ import annotations

STUDY = "mirage"
SETTING = "rag"  # one setting: the published RAG prompt (P §3.1)

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
REGRESSORS = ("random_forest", "linear", "mlp", "xgboost", "svr")  # Table 3's rows

# The research-code quirks, each "fixed" (default) or "reference" (README.md's table).
COMPAT_ITEMS = ("answer_parts", "comma_citations", "citation_ranking", "citation_scope",
                "en_detection", "nli_rounding", "overlap_label", "llm_parse_failure",
                "pairwise_parse", "seeds", "kendall_tau")

# Which scorer makes which feature (s3); the features stage runs one cell per scorer.
SCORERS = {"lexical": ("citation_MAP@10", "citation_Recall@10", "answer_bleu", "answer_rougeL"),
           "langid": ("target_language", "english_language"),
           "nli": ("support_entailment", "support_neutral"),
           "reranker": ("reranker_score",),
           "llm": ("answer_overlap_score", "fluency_score")}
SOURCES = ("run", "published")
