"""Run files of the RAG tracks, written and checked: RAGTIME 2025's report JSONL (one line
per topic) and its checks as the track's validators make them (/work/shared/specs/nuggets.md
s2.3: hltcoe/rag-run-validator@81c8565 `data/default.json`, the TREC AutoJudge report model
`trec_auto_judge/report.py`@03349f4 for cited ids == references and confidences in [0, 100];
length = NFKC characters of the joined response texts, at most the topic's `limit`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping

DEFAULT_LIMIT = 2000  # NeuCLIR-2024 request files (argue-viz neuclir24-test-request.jsonl)


def ragtime_line(team_id: str, run_id: str, topic_id: str, sentences: list[dict]) -> dict:
    """One topic's report from an answer's sentences ([{text, citations: [docid]}])."""
    refs = list(dict.fromkeys(c for s in sentences for c in s["citations"]))
    return {"metadata": {"team_id": team_id, "run_id": run_id, "topic_id": str(topic_id)},
            "responses": [{"text": s["text"], "citations": list(s["citations"])}
                          for s in sentences],
            "references": refs}


def check_ragtime(lines: Iterable[str], limits: Mapping[str, int] | None = None) -> list[str]:
    """The errors of a RAGTIME run file's lines (empty: accepted): JSON objects with
    `metadata` {team_id, run_id, topic_id} strings, one run_id, one line per topic,
    `responses` [{text, citations}] (citations a list of docids or docid -> number in
    [0, 100]), `references` a list of docids equal to the set cited, and the NFKC character
    length of the joined texts within the topic's limit."""
    errors, seen, runs = [], set(), set()
    for n, line in enumerate(lines, 1):
        where = f"line {n}"
        try:
            obj = json.loads(line)
        except ValueError as e:
            errors.append(f"{where}: not JSON ({e})")
            continue
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k), str) and meta[k]
                                                 for k in ("team_id", "run_id", "topic_id")):
            errors.append(f"{where}: metadata needs team_id, run_id and topic_id strings")
            continue
        topic = meta["topic_id"]
        runs.add(meta["run_id"])
        if topic in seen:
            errors.append(f"{where}: topic {topic} has more than one line")
        seen.add(topic)
        responses, refs = obj.get("responses"), obj.get("references")
        if not isinstance(responses, list) or not isinstance(refs, list) or not all(
                isinstance(r, str) for r in refs):
            errors.append(f"{where}: responses must be a list and references a list of docids")
            continue
        cited: set[str] = set()
        for i, r in enumerate(responses):
            cits = r.get("citations") if isinstance(r, dict) else None
            if not isinstance(r, dict) or not isinstance(r.get("text"), str):
                errors.append(f"{where}: responses[{i}] needs a text")
                continue
            if isinstance(cits, dict):
                bad = [k for k, v in cits.items() if not isinstance(v, (int, float))
                       or not 0 <= v <= 100]
                if bad:
                    errors.append(f"{where}: responses[{i}] confidences of {bad} not in [0, 100]")
                cited |= set(cits)
            elif isinstance(cits, list) and all(isinstance(c, str) for c in cits):
                cited |= set(cits)
            else:
                errors.append(f"{where}: responses[{i}].citations must be a list of docids or "
                              "docid -> confidence")
        if cited != set(refs):
            errors.append(f"{where}: references {sorted(set(refs))} are not the cited ids "
                          f"{sorted(cited)}")
        limit = (limits or {}).get(topic, DEFAULT_LIMIT)
        length = len(unicodedata.normalize("NFKC", " ".join(
            r.get("text", "") for r in responses if isinstance(r, dict))))
        if length > limit:
            errors.append(f"{where}: {length} characters, over topic {topic}'s limit {limit}")
    if len(runs) > 1:
        errors.append(f"more than one run_id: {sorted(runs)}")
    return errors


_BRACKET = re.compile(r"\[[^\]]*\]")


def cited_sentences(text: str, lang: str) -> list[dict]:
    """A cited answer as the tracks' sentences: `[{text, citations}]`, each sentence's ids
    from its ``[id]`` / ``[id1, id2]`` marks (in order, once each), the marks taken out of
    the text; sentences cut by tasks/text.sentences in the answer's language."""
    from xling.tasks.text import sentences

    out = []
    for sent in sentences(text.strip(), lang) if text and text.strip() else []:
        ids = [i.strip() for group in _BRACKET.findall(sent) for i in group[1:-1].split(",")]
        clean = re.sub(r"\s+([.,;:!?])", r"\1",
                       re.sub(r"\s+", " ", _BRACKET.sub("", sent))).strip()
        if clean:
            out.append({"text": clean, "citations": list(dict.fromkeys(i for i in ids if i))})
    return out
