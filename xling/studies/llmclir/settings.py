"""The settings the LLM-CLIR paper ran, as data, and a config's settings beside them.

Each entry cites llm-clir.txt (../shared/papers/llm-clir.txt) by line. The rerank stage's
defaults are these settings; this table shows a reader where a config departs from them.
"""

from __future__ import annotations

from typing import Any, Mapping

# (what, the paper's value, citation) per setting, by where it lives in a config
PAPER: dict[str, list[tuple[str, Any, str]]] = {
    "retrieve": [("depth", 100, "L91, L93: the top 100 documents per query")],
    "bm25": [("k1", 0.9, "L91: k1 = 0.9"), ("b", 0.4, "L91: b = 0.4")],
    "listwise": [("window", 20, "L103: sliding window 20"), ("step", 10, "L103: step 10"),
                 ("depth", 100, "L143: reranking the top 100")],
    "pairwise": [("passes", 10, "L105: k = 10 passes"), ("depth", 100, "L143"),
                 ("prp_answer", "passage_token", "L105: generation mode, 'Passage A' or "
                  "'Passage B', in llm-rankers (L414): ' Passage:' and one token (a T5 such "
                  "as Aya-101: the decoder's 'Passage' and two)")],
    "translate": [("model", "facebook/nllb-200-1.3B", "L111 (Section 3.3)"),
                  ("max_input_tokens", 128, "L111: maximum input sequence length 128"),
                  ("beam_size", 1, "L111: greedy decoding")],
}


def _rows(kind: str, name: str, entry: Mapping) -> list[list[str]]:
    rows = []
    for key, paper, cite in PAPER[kind]:
        if key not in entry:
            continue
        ours = entry[key]
        mark = "" if ours == paper else " ≠"
        rows.append([name, key, f"{ours}{mark}", str(paper), cite])
    return rows


def beside_paper(config: Mapping) -> list[list[str]]:
    """[config entry, setting, this config's value (≠ where it differs), the paper's, line]
    for the retrieval depth, BM25 runs, rerank runs and translation of a config (a dict of its
    sections as `model_dump(mode="json")` writes them)."""
    rows: list[list[str]] = []
    retrieve = config.get("retrieve") or {}
    if retrieve:
        rows += _rows("retrieve", "retrieve", retrieve)
    for run in retrieve.get("runs") or []:
        if run.get("engine") == "bm25":
            rows += _rows("bm25", f"retrieve {run.get('name')}", run)
    for run in (config.get("rerank") or {}).get("runs") or []:
        rows += _rows(run.get("method", "listwise"), f"rerank {run.get('name')}", run)
    if config.get("translate"):
        rows += _rows("translate", "translate", config["translate"])
    return rows
