"""LLM reranking algorithms: listwise sliding windows (RankGPT / RankZephyr) and pairwise
ranking prompting (PRP) with bubble-sort passes, run over many queries in lockstep.

Both are pure control flow around a `complete(prompts) -> outputs` function (one output
string per prompt, None for a failed call), so that:
- every LLM call is a full batch: all queries advance their windows (listwise) or their
  bubble-sort step (pairwise) together, and one call serves all of them;
- a scripted judge can test the control flow (tests/unit/test_rerank.py), and the rerank stage
  plugs in a real engine (jobs/rerank.py).

Prompts are the LLM-CLIR paper's Figures 3 and 4 (Appendix A), read from
`rerank_prompts.yaml` next to this module, which cites the figure lines. Where the paper's
implementations differ from the figures (rank_llm for listwise, ielab/llm-rankers for PRP),
the difference is an option, never a silent change:
- PRP `prompt_style="llm_rankers"`: llm-rankers' quoted prompt; answers: the engine
  continues " Passage:" by one token (`parse_passage_token`, the rerank stage's default
  `prp_answer: passage_token`, as the paper ran it; an encoder-decoder such as Aya-101
  continues its decoder's "Passage" by two tokens, `parse_decoded_passage`, llm-rankers'
  T5 reading), or free generation (`parse_choice`, `prp_answer: generate`);
- PRP `restore_tail`: llm-rankers returns the sorted top-k, then every other candidate in
  its first-stage order (not in the order the bubble passes left it);
- listwise `fit`: rank_llm shrinks the passages until the window's prompt fits the context
  (`fit_listwise`) instead of sending a prompt the engine must refuse.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

Complete = Callable[[list], list[Optional[str]]]


@lru_cache(maxsize=1)
def prompt_templates() -> dict:
    """The templates of rerank_prompts.yaml (LLM-CLIR Figures 3 and 4)."""
    import yaml

    return yaml.safe_load(Path(__file__).with_name("rerank_prompts.yaml").read_text("utf-8"))


LISTWISE_SYSTEM = prompt_templates()["listwise"]["system"]
PASSAGE_PREFIX = prompt_templates()["pairwise"]["answer_prefix"]  # " Passage:"
DECODER_PREFIX = prompt_templates()["pairwise"]["decoder_prefix"]  # "Passage" (T5)


@dataclass
class Candidates:
    """One query's first-stage list, best first; `texts` already truncated for the prompt."""

    query_id: str
    query: str
    doc_ids: list[str]
    texts: list[str]


@dataclass
class Reranked:
    query_id: str
    doc_ids: list[str]  # the new order, best first (same set as the input)
    calls: int = 0  # prompts sent for this query
    malformed: int = 0  # outputs that needed repair (duplicates, missing, unknown ids)
    unparseable: int = 0  # outputs with no usable answer: the window / pair was left as it was
    failed: int = 0  # calls that returned no output (engine or endpoint error)
    cached: int = 0  # pairwise: comparisons answered from earlier in the same query
    shrunk: int = 0  # listwise: windows whose passages were cut further to fit the context
    stats: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# listwise


def listwise_prompt(query: str, passages: list[str]) -> list[dict]:
    """LLM-CLIR Figure 3 (RankZephyr's RankGPT prompt): a system and a user message."""
    t = prompt_templates()["listwise"]
    n = len(passages)
    body = "\n".join(t["passage"].format(rank=i + 1, passage=p) for i, p in enumerate(passages))
    user = "\n\n".join([t["prefix"].format(num=n, query=query), body,
                         t["query"].format(query=query), t["suffix"].format(num=n)])
    return [{"role": "system", "content": t["system"]}, {"role": "user", "content": user}]


def fit_listwise(query: str, passages: list[str], *, n_tokens: Callable[[list], int],
                 budget: int, truncate: Callable[[list[str], int], list[str]], limit: int,
                 prompt=listwise_prompt) -> tuple[list, int | None]:
    """A window's prompt that fits `budget` tokens, shrinking every passage as rank_llm does.

    rank_llm (`create_prompt`, the framework LLM-CLIR ran RankZephyr in, llm-clir.txt L103)
    renders the window, counts its tokens, and while the prompt is longer than the context
    minus the answer's tokens lowers the per-passage length by the excess divided over the
    passages, then renders again. Here the length is in the model's tokens (`truncate`, the
    unit `doc_tokens` uses), starting from `limit`. Returns (prompt, the passage length it
    took, or None when the first rendering fitted). At one token a passage it stops and
    returns the shortest prompt, which the engine then refuses or cuts (its `too_long`).
    """
    out = prompt(query, passages)
    n = n_tokens(out)
    cut = None
    while n > budget and (cut is None or cut > 1):
        cut = max(1, (limit if cut is None else cut) - max(1, (n - budget) // max(1, len(passages))))
        out = prompt(query, truncate(passages, cut))
        n = n_tokens(out)
    return out, cut


def parse_permutation(text: str | None, n: int) -> tuple[list[int], str]:
    """An LLM's ranking of n passages -> a permutation of range(n) and how it went.

    Identifiers are read as `[k]` (or bare numbers when no bracket appears), 1-based.
    Out-of-range ids and repeats are dropped; ids never named are appended in their original
    order; an answer with no usable id falls back to the original order. Returns
    (permutation, status) with status "ok", "repaired" or "unparseable".
    """
    if not text:
        return list(range(n)), "unparseable"
    found = re.findall(r"\[\s*(\d+)\s*\]", text) or re.findall(r"\d+", text)
    seen, order, bad = set(), [], False
    for tok in found:
        k = int(tok) - 1
        if not 0 <= k < n or k in seen:
            bad = True
            continue
        seen.add(k)
        order.append(k)
    if not order:
        return list(range(n)), "unparseable"
    missing = [k for k in range(n) if k not in seen]
    return order + missing, ("repaired" if bad or missing else "ok")


def listwise_windows(n: int, window: int, step: int) -> list[tuple[int, int]]:
    """The windows [start, end) a list of n is reranked in, from the bottom up.

    rank_llm's schedule: the last window is clamped to start at 0, so the top is always
    reranked (RankGPT's original loop stops early when n - window is not a multiple of step).
    """
    if n <= 1:
        return []
    if n <= window:
        return [(0, n)]
    out, end = [], n
    while True:
        start = max(0, end - window)
        out.append((start, end))
        if start == 0:
            return out
        end -= step


def n_listwise_calls(n: int, window: int = 20, step: int = 10) -> int:
    """Windows per query: 1 + ceil((n - window) / step) for n > window."""
    return 0 if n <= 1 else (1 if n <= window else 1 + math.ceil((n - window) / step))


def listwise_rerank(queries: list[Candidates], complete: Complete, *, window: int = 20,
                    step: int = 10, prompt=listwise_prompt, fit=None) -> list[Reranked]:
    """Sliding-window listwise reranking of every query, windows advancing in lockstep.

    `fit(query, passages) -> (prompt, shrunk)` replaces `prompt` where given (the rerank
    stage's `fit_listwise` with the engine's tokenizer); shrunk windows are counted."""
    if window < 2 or not 1 <= step <= window:
        raise ValueError(f"need window >= 2 and 1 <= step <= window (got {window}, {step})")
    order = [list(range(len(q.doc_ids))) for q in queries]
    out = [Reranked(q.query_id, []) for q in queries]
    schedules = [listwise_windows(len(q.doc_ids), window, step) for q in queries]
    for t in range(max((len(s) for s in schedules), default=0)):
        active = [i for i, s in enumerate(schedules) if t < len(s)]
        prompts = []
        for i in active:
            lo, hi = schedules[i][t]
            texts = [queries[i].texts[k] for k in order[i][lo:hi]]
            if fit is None:
                prompts.append(prompt(queries[i].query, texts))
            else:
                p, shrunk = fit(queries[i].query, texts)
                prompts.append(p)
                out[i].shrunk += bool(shrunk)
        answers = complete(prompts)
        for i, answer in zip(active, answers):
            lo, hi = schedules[i][t]
            out[i].calls += 1
            if answer is None:
                out[i].failed += 1
                continue
            perm, status = parse_permutation(answer, hi - lo)
            out[i].malformed += status == "repaired"
            out[i].unparseable += status == "unparseable"
            window_ids = order[i][lo:hi]
            order[i][lo:hi] = [window_ids[k] for k in perm]
    for i, q in enumerate(queries):
        out[i].doc_ids = [q.doc_ids[k] for k in order[i]]
    return out


# ---------------------------------------------------------------------------------------
# pairwise (PRP)


def pairwise_prompt(query: str, passage_a: str, passage_b: str,
                    style: str = "figure") -> list[dict]:
    """LLM-CLIR Figure 4 (PRP, Qin et al.) as one user message; `style="llm_rankers"` is
    llm-rankers' character-exact variant (quotes, blank lines)."""
    t = prompt_templates()["pairwise"][style]
    return [{"role": "user",
             "content": t.format(query=query, document1=passage_a, document2=passage_b)}]


def parse_choice(text: str | None) -> str | None:
    """'A', 'B' or None from a PRP answer ("Passage A", "A", "**Passage B**"...)."""
    if not text:
        return None
    m = re.search(r"passage\s*([AB])\b", text, re.IGNORECASE)
    if m:
        return m.group(1).upper()
    m = re.match(r"\W*([AB])\b", text.strip())
    return m.group(1) if m else None


def parse_passage_token(text: str | None) -> str | None:
    """The one token generated after " Passage:" -> 'A', 'B' or None, as llm-rankers reads
    it: stripped, upper-cased and compared with "Passage A" / "Passage B"."""
    if text is None:
        return None
    return {"A": "A", "B": "B"}.get(text.strip().upper())


def parse_decoded_passage(text: str | None) -> str | None:
    """An encoder-decoder's answer after the decoder prefix "Passage" -> 'A', 'B' or None,
    as llm-rankers reads a T5's: the decoded output, prefix included, must be exactly
    "Passage A" or "Passage B" (the engine returns what the new tokens add: " A")."""
    if text is None:
        return None
    return {" A": "A", " B": "B"}.get(text)


def n_pairwise_calls_bound(n: int, passes: int) -> int:
    """PRP-Sliding-K's worst case: 2 * sum_{i<k} (n - 1 - i) prompts per query."""
    return 2 * sum(max(0, n - 1 - i) for i in range(min(passes, n)))


def pairwise_rerank(queries: list[Candidates], complete: Complete, *, passes: int = 10,
                    prompt=pairwise_prompt, parse=parse_choice,
                    restore_tail: bool = True) -> list[Reranked]:
    """PRP-Sliding-K: `passes` bubble-sort passes from the bottom of each list up.

    Pass i walks j = n-2 ... i and asks about (j, j+1) in both orders; the lower passage
    moves up only when both orders prefer it, so a position-biased judge changes nothing.
    After pass i, position i holds the best of positions i..n-1, so `passes` passes sort the
    top-`passes`. Each step of a pass is one batched call over every query still walking.
    A pair met again (the same two documents) reuses its verdict instead of asking again,
    and a pass that swaps nothing ends the query: every later pass would ask the same pairs.

    The result is the sorted top-`passes`, then, with `restore_tail` (llm-rankers, which the
    LLM-CLIR paper ran, llm-clir.txt L414), every other candidate in its first-stage order;
    without it, in the order the passes left them. `parse` reads an answer ('A', 'B', None).
    """
    if passes < 1:
        raise ValueError(f"passes must be >= 1 (got {passes})")
    order = [list(range(len(q.doc_ids))) for q in queries]
    out = [Reranked(q.query_id, []) for q in queries]
    memo: list[dict[tuple[int, int], bool]] = [{} for _ in queries]
    live = [len(q.doc_ids) > 1 for q in queries]
    for p in range(passes):
        swapped = [False] * len(queries)
        # All queries walk pass p together; a query's j runs n-2 .. p.
        steps = max((len(q.doc_ids) - 1 - p for i, q in enumerate(queries) if live[i]), default=0)
        for s in range(steps):
            asks, prompts = [], []
            for i, q in enumerate(queries):
                j = len(q.doc_ids) - 2 - s
                if not live[i] or j < p:
                    continue
                up, down = order[i][j], order[i][j + 1]  # `down` is the lower-ranked one
                if (up, down) in memo[i]:
                    out[i].cached += 1
                    if memo[i][(up, down)]:
                        order[i][j], order[i][j + 1] = down, up
                        swapped[i] = True
                    continue
                qt, tu, td = q.query, q.texts[up], q.texts[down]
                asks.append((i, j, up, down))
                prompts += [prompt(qt, tu, td), prompt(qt, td, tu)]
            if not prompts:
                continue
            answers = complete(prompts)
            for k, (i, j, up, down) in enumerate(asks):
                first, second = answers[2 * k], answers[2 * k + 1]
                out[i].calls += 2
                verdicts = []
                for answer in (first, second):
                    if answer is None:
                        out[i].failed += 1
                    choice = parse(answer)
                    if answer is not None and choice is None:
                        out[i].unparseable += 1
                    verdicts.append(choice)
                # (up, down) first: B is `down`; swapped order: A is `down`.
                wins = verdicts[0] == "B" and verdicts[1] == "A"
                memo[i][(up, down)] = wins
                if wins:
                    order[i][j], order[i][j + 1] = down, up
                    swapped[i] = True
        for i in range(len(queries)):
            if live[i] and not swapped[i]:
                live[i] = False
        if not any(live):
            break
    for i, q in enumerate(queries):
        if restore_tail:
            top = order[i][:passes]
            chosen = set(top)
            order[i] = top + [k for k in range(len(q.doc_ids)) if k not in chosen]
        out[i].doc_ids = [q.doc_ids[k] for k in order[i]]
    return out
