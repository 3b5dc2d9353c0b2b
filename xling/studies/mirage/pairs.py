"""MIRAGE-Bench's arena (s4): which queries are judged, every pair of models on them in a
seeded presentation order, the judge stage's pair rows, and counting the verdicts into
Bradley-Terry preferences (both presentation orders merged when asked)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations

import numpy as np
import pandas as pd

from xling.studies.mirage.constants import STUDY
from xling.studies.mirage.data import items_of, outputs_by_query
from xling.studies.mirage.options import Knobs, Options
from xling.studies.mirage.parse import judge_answer
from xling.studies.mirage.prompts import pair_prompt


def judged_queries(query_ids: Iterable[str], count: int, seed: int) -> list[str]:
    """The judged subset: ``count`` of the *sorted* ids without replacement, seeded (the
    reference used Python's ``random``; ids sorted so the draw is process-independent)."""
    ids = sorted(set(query_ids))
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(ids), size=min(count, len(ids)), replace=False)
    return [ids[i] for i in sorted(pick)]


def _coin(seed: int, *parts: str) -> bool:
    """A seeded coin flip that depends only on ``parts``: the same pair of the same query
    gets the same order whoever else is in the arena."""
    digest = hashlib.sha256("\x1f".join((str(seed), *parts)).encode()).digest()
    return digest[0] < 128


def pair_prompts(items: Sequence[Mapping], outputs: Mapping[str, Mapping[str, str]],
                 models: Sequence[str], knobs: Knobs = Knobs()) -> list[dict]:
    """Every pair of the models that answered, on the seeded query subset, each pair in a
    seeded coin-flip presentation order (P L114, s4.3). The flip depends only on the seed,
    the query and the pair (the reference drew it from one stream after shuffling the
    roster): adding a model to the arena then leaves every existing pair's prompt as it was,
    so the cache answers them and only the new pairs are asked.
    ``outputs`` is ``{query_id: {model: output}}``."""
    by_query = {item["query_id"]: item for item in items}
    answered = [query_id for query_id in by_query if outputs.get(query_id)]
    rows = []
    for query_id in judged_queries(answered, knobs.judge_queries, knobs.judge_seed):
        item, outs = by_query[query_id], outputs[query_id]
        present = sorted(m for m in models if m in outs)
        for model_a, model_b in combinations(present, 2):
            if _coin(knobs.judge_seed + 1, query_id, model_a, model_b):
                model_a, model_b = model_b, model_a
            prompt = pair_prompt(item["query"], item["passages"],
                                 judge_answer(outs[model_a], knobs),
                                 judge_answer(outs[model_b], knobs), knobs.pairwise_prompt)
            rows.append({"item_id": f"{query_id}|{model_a}|{model_b}", "query_id": query_id,
                         "lang": item.get("lang"), "model_A": model_a, "model_B": model_b,
                         "prompt": prompt})
    return rows


def pair_rows(opts: Options, generations: Sequence[Mapping]) -> list[dict]:
    """The arena's judge prompts for one (setting, lang): every pair of models on the seeded
    query subset, ``item_id = query|model_A|model_B`` (both orders with ``both_orders``).
    The prompts are filled from the template constant for each pair, so every prompt holds
    its own query and answers (the released evaluator's bug, s4.5, cannot happen)."""
    if not generations:
        return []
    knobs, lang = Knobs.of(opts), generations[0]["lang"]
    setting = generations[0]["setting"]
    outs = outputs_by_query(generations)
    roster = opts.models or sorted({g["model"] for g in generations})
    items = items_of(opts, lang)
    rows = []
    for pair in pair_prompts(items, outs, roster, knobs):
        query_id, model_a, model_b = pair["query_id"], pair["model_A"], pair["model_B"]
        asked = [(model_a, model_b, pair["prompt"])]
        if opts.both_orders:
            item = next(i for i in items if i["query_id"] == query_id)
            swapped = pair_prompt(item["query"], item["passages"],
                                  judge_answer(outs[query_id][model_b], knobs),
                                  judge_answer(outs[query_id][model_a], knobs),
                                  knobs.pairwise_prompt)
            asked.append((model_b, model_a, swapped))
        for first, second, prompt in asked:
            rows.append({"item_id": f"{query_id}|{first}|{second}", "study": STUDY,
                         "setting": setting, "lang": lang,
                         "prompt": [{"role": "user", "content": prompt}], "error": None})
    return rows


def split_pair_id(item_id: str) -> tuple[str, str, str]:
    """``query|model_A|model_B`` -> its three parts."""
    query_id, model_a, model_b = str(item_id).rsplit("|", 2)
    return query_id, model_a, model_b


def preferences(judgments: pd.DataFrame, models: Sequence[str]
                ) -> tuple[dict[str, list[tuple[int, int]]], dict[str, int]]:
    """``{query_id: [(winner, loser)]}`` (model indices) from the A/B verdicts, and the
    counts of every verdict kind. Ties, unparsed verdicts and pairs with a model outside
    ``models`` do not enter the Bradley-Terry fit (the reference code leaves ties out too;
    the paper says nothing); each is counted (``tie``, ``unparsed``, ``unknown_model``) and
    the tables show the counts. Every judged query is a key, even when none of its
    verdicts is a win. ``query_id`` is one language's (ids repeat across languages)."""
    index = {m: i for i, m in enumerate(models)}
    prefs: dict[str, list[tuple[int, int]]] = {}
    counts = Counter({"A": 0, "B": 0, "tie": 0, "unparsed": 0, "unknown_model": 0})
    for query_id, model_a, model_b, verdict in judgments[
            ["query_id", "model_A", "model_B", "verdict"]].itertuples(index=False):
        prefs.setdefault(query_id, [])
        if model_a not in index or model_b not in index:
            counts["unknown_model"] += 1
            continue
        verdict = verdict if verdict in ("A", "B", "tie") else None
        counts[verdict or "unparsed"] += 1
        if verdict in ("A", "B"):
            winner, loser = (model_a, model_b) if verdict == "A" else (model_b, model_a)
            prefs[query_id].append((index[winner], index[loser]))
    counts["judgments"] = len(judgments)
    return prefs, dict(counts)


def merge_orders(judgments: pd.DataFrame) -> pd.DataFrame:
    """Both presentation orders of a pair -> one verdict in the first order's terms: the
    same winner both times stands; a disagreement is a tie; one order unparsed or missing
    leaves the other."""
    rows, seen = [], {}
    for row in judgments.to_dict("records"):
        key = (row["query_id"], frozenset((row["model_A"], row["model_B"])))
        winner = {"A": row["model_A"], "B": row["model_B"], "tie": "tie"}.get(row["verdict"])
        if key not in seen:
            seen[key] = len(rows)
            rows.append({**row, "_winners": [winner]})
        else:
            rows[seen[key]]["_winners"].append(winner)
    for row in rows:
        winners = [w for w in row.pop("_winners") if w is not None]
        if not winners:
            row["verdict"] = None
        elif len(set(winners)) > 1:
            row["verdict"] = "tie"
        else:
            winner = winners[0]
            row["verdict"] = ("tie" if winner == "tie"
                              else ("A" if winner == row["model_A"] else "B"))
    return pd.DataFrame(rows, columns=list(judgments.columns))
