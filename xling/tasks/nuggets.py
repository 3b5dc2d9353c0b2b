"""Nugget evaluation as castorini's nuggetizer runs it: creation over windows of documents,
vital/okay scoring, support assignment; and the citation checks of TREC RAG 2024 (support)
and RAGTIME (Auto-ARGUE attestation). The control flow only: every LLM call goes through
an `ask(messages, attempt, temperature)` coroutine the caller supplies (jobs/nuggets.py:
the run store's cached engine), so a rerun replays the calls it made from the cache.

Reference: castorini/nuggetizer@d00dc3e `src/nuggetizer/models/nuggetizer.py` (NZ below):
windows L134-138, creation L282-322, scoring L369-436, assignment L510-581; prompts in
`nugget_prompts/` (verbatim copies, each naming its source); /work/shared/specs/nuggets.md
s3-s5 and s7 describe them. Where xling departs from NZ, on purpose:

* A reply is parsed as NZ does (strip every ```` ```python ```` and ```` ``` ````, then
  `ast.literal_eval`), and must then be a list of strings (NZ casts whatever parses: a
  string reply would become the "list" of its characters).
* NZ retries a reply that does not parse at temperature 0.2, up to 500 tries; so does this.
  Each retry draws with its own seed (`seed = attempt`), so retries are distinct cache keys
  and a rerun replays the same draws. After the last try NZ keeps the previous nugget list
  (creation), labels the window `okay` (scoring) or `failed` (assignment): a guess. Here the
  topic (creation, scoring) or the answer (assignment) becomes an error row instead, naming
  the window; assignment keeps NZ's `failed` labels on that row, so NZ's scores can still be
  recomputed from it.
* An LLM call that fails (the engine's error) is an error row too; it is not cached, so a
  rerun asks it again.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Awaitable, Callable

PROMPT_DIR = Path(__file__).with_name("nugget_prompts")
# NZ models/nuggetizer.py L23
MAX_TRIALS = 500
RETRY_TEMPERATURE = 0.2
# the cap the creator prompt always renders (NZ L286 never passes the configured one; spec D5)
PROMPT_CAP = 30
ASSIGN_LABELS = {3: ("support", "partial_support", "not_support"), 2: ("support", "not_support")}


@cache
def template(name: str) -> dict:
    """One prompt file of `nugget_prompts/` (`system_message`, `prefix_user`)."""
    import yaml

    data = yaml.safe_load((PROMPT_DIR / f"{name}.yaml").read_text("utf-8"))
    if not isinstance(data, dict) or "prefix_user" not in data:
        raise ValueError(f"{PROMPT_DIR / name}.yaml: no prefix_user")
    return data


def messages(name: str, **values: Any) -> list[dict]:
    """The chat of a prompt file: NZ's system + user pair (template_loader.render), or one
    user message when the file has no system message (the support prompts)."""
    t = template(name)
    user = {"role": "user", "content": t["prefix_user"].format(**values)}
    return [{"role": "system", "content": t["system_message"]}, user] \
        if t.get("system_message") else [user]


def windows(n: int, size: int) -> list[tuple[int, int]]:
    """NZ `_iter_window_bounds`: consecutive, non-overlapping windows of `size`."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def parse_list(text: str | None, n: int | None = None) -> tuple[list[str] | None, str | None]:
    """A reply -> (its list of strings, None) or (None, why not). `n`: the number of labels
    the window needs (NZ's strict zip: a different count is a failure, not a truncation)."""
    if text is None:
        return None, "no reply"
    body = text.replace("```python", "").replace("```", "").strip()
    try:
        value = ast.literal_eval(body)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError) as e:
        return None, f"not a Python literal ({type(e).__name__})"
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None, f"not a list of strings ({type(value).__name__})"
    if n is not None and len(value) != n:
        return None, f"{len(value)} labels for {n} nuggets"
    return value, None


@dataclass(frozen=True)
class Knobs:
    """The settings of the method (nuggets: config section); defaults are NZ's."""

    window: int = 10
    max_nuggets: int = 30
    max_tries: int = MAX_TRIALS
    grades: int = 3
    compat: str = "nuggetizer"  # or "paper": keep the first 20, vital first (spec s4.3)
    top: int = 20
    max_citations: int = 3


@dataclass
class Reply:
    text: str | None
    error: str | None = None
    cached: bool = False


Ask = Callable[[list, int, float | None], Awaitable[Reply]]


@dataclass
class Trace:
    """Every call a topic or answer made (spec s11.17): step, window, attempt, temperature
    (None: the configured one), the reply and whether it came from the cache."""

    calls: list[dict] = field(default_factory=list)

    def add(self, step: str, window: tuple[int, int] | None, attempt: int,
            temperature: float | None, reply: Reply) -> None:
        self.calls.append({"step": step, "window": list(window) if window else None,
                           "attempt": attempt, "temperature": temperature,
                           "output": reply.text, "cached": reply.cached, "error": reply.error})


class Failed(Exception):
    """A window that ended without a usable reply: the row's error."""


async def _retried(ask: Ask, chat: list, parse, knobs: Knobs, trace: Trace, step: str,
                   window: tuple[int, int]):
    """NZ's loop: temperature 0 (the configured sampling), then RETRY_TEMPERATURE, up to
    `max_tries` calls; the parsed value, or Failed."""
    why = ""
    for attempt in range(knobs.max_tries):
        temperature = None if attempt == 0 else RETRY_TEMPERATURE
        reply = await ask(chat, attempt, temperature)
        trace.add(step, window, attempt, temperature, reply)
        if reply.error is not None:
            raise Failed(f"{step} window {window[0]}-{window[1]}: the LLM call failed: "
                         f"{reply.error}")
        value, why = parse(reply.text)
        if why is None:
            return value
    raise Failed(f"{step} window {window[0]}-{window[1]}: no parseable reply in "
                 f"{knobs.max_tries} tries (last: {why})")


async def create(ask: Ask, query: str, documents: list[str], knobs: Knobs,
                 trace: Trace) -> list[str]:
    """NZ `create`: one call per window of `knobs.window` documents with the current list;
    the reply replaces the list, cut to `max_nuggets`. Documents are numbered from [1] in
    each window (prompts/service.py L49-51)."""
    nuggets: list[str] = []
    for s, e in windows(len(documents), knobs.window):
        context = "\n".join(f"[{i + 1}] {d}" for i, d in enumerate(documents[s:e]))
        chat = messages("creator", query=query, context=context, nuggets=nuggets,
                        nuggets_length=len(nuggets), creator_max_nuggets=PROMPT_CAP)
        nuggets = (await _retried(ask, chat, parse_list, knobs, trace, "create",
                                  (s, e)))[:knobs.max_nuggets]
    return nuggets


async def score(ask: Ask, query: str, nuggets: list[str], knobs: Knobs,
                trace: Trace) -> list[dict]:
    """NZ `score`: vital/okay per window of nuggets; labels lower-cased, not validated (a
    label other than vital/okay counts in neither class, spec s6). `compat: paper` then
    keeps the first `top`, vital first, stable (spec s4.3, D1)."""
    out = []
    for s, e in windows(len(nuggets), knobs.window):
        window = nuggets[s:e]
        chat = messages("scorer", query=query, nuggets=window, num_nuggets=len(window))
        labels = await _retried(ask, chat, lambda t, n=len(window): parse_list(t, n), knobs,
                                trace, "score", (s, e))
        out += [{"text": t, "importance": lab.lower()} for t, lab in zip(window, labels)]
    return select(out, knobs)


def select(scored: list[dict], knobs: Knobs) -> list[dict]:
    """The final nugget set: all (nuggetizer) or the first `top`, vital first (paper)."""
    if knobs.compat != "paper":
        return scored
    return sorted(scored, key=lambda n: n["importance"] == "okay")[:knobs.top]


async def assign(ask: Ask, query: str, answer: str, nuggets: list[dict], knobs: Knobs,
                 trace: Trace) -> tuple[list[dict], str | None]:
    """NZ `assign`: each nugget's support by the whole answer text, per window; labels
    lower-cased. Returns (nuggets with `assignment`, error): a window without a usable
    reply gets NZ's `failed` labels and the row an error."""
    template_name = "assigner" if knobs.grades == 3 else "assigner_2grade"
    out, errors = [], []
    for s, e in windows(len(nuggets), knobs.window):
        window = nuggets[s:e]
        texts = [n["text"] for n in window]
        chat = messages(template_name, query=query, context=answer, nuggets=texts,
                        num_nuggets=len(texts))
        try:
            labels = await _retried(ask, chat, lambda t, n=len(texts): parse_list(t, n),
                                    knobs, trace, "assign", (s, e))
        except Failed as f:
            labels, _ = ["failed"] * len(window), errors.append(str(f))
        out += [{**n, "assignment": lab.lower()} for n, lab in zip(window, labels)]
    return out, ("; ".join(errors) or None)


# ---------------------------------------------------------------------------------------
# citation support


def support_label(text: str | None) -> str | None:
    """SUP24's parser: the first of "full support" -> FS, "partial support" -> PS,
    "no support" -> NS found (case-insensitive, in that order); None otherwise."""
    low = (text or "").lower()
    for phrase, label in (("full support", "FS"), ("partial support", "PS"),
                          ("no support", "NS")):
        if phrase in low:
            return label
    return None


def attested(text: str | None) -> bool | None:
    """The ARGUE attestation (3p CitationJudge): 'YES' in the upper-cased reply; None for no
    reply."""
    return None if text is None else "YES" in text.upper()


def citation_text(doc: dict) -> str:
    """SUP24's citation: `title + ": " + segment`; a document without a title (MIRAGE's
    passages carry it in the text) is its text alone."""
    return f"{doc['title']}: {doc['text']}" if doc.get("title") else doc["text"]


async def support(ask: Ask, sentences: list[dict], docs: dict[str, dict], knobs: Knobs,
                  trace: Trace, *, argue: bool) -> list[dict]:
    """Per (sentence, one of its first `max_citations` citations): SUP24's Full / Partial /
    No support (`argue=False`, one call at temperature 0.1) or ARGUE's attestation
    (`argue=True`). A citation of a document the answer was not given is judged NS/not
    attested without a call, and marked `unknown_doc`; an unparseable SUP24 reply is
    `label: None` (counted apart, never retried: SUP24 does not retry)."""
    out = []
    step = "attest" if argue else "support"
    for i, sent in enumerate(sentences):
        for docid in sent["citations"][:knobs.max_citations]:
            doc = docs.get(docid)
            row = {"sentence": i, "docid": docid}
            if doc is None:
                out.append({**row, "label": False if argue else "NS", "unknown_doc": True})
                continue
            if argue:
                chat = messages("attest_argue", sentence=sent["text"], document=doc["text"])
            else:
                chat = messages("support_trec24", statement=sent["text"],
                                citation=citation_text(doc))
            reply = await ask(chat, 0, None if argue else 0.1)
            trace.add(step, (i, i + 1), 0, None if argue else 0.1, reply)
            if reply.error is not None:
                raise Failed(f"{step} of sentence {i}, citation {docid}: the LLM call "
                             f"failed: {reply.error}")
            # the document's human label (qrels), kept for the agreement, never shown to the LLM
            out.append({**row, "label": attested(reply.text) if argue
                        else support_label(reply.text), "unknown_doc": False,
                        "human": doc.get("judgment")})
    return out
