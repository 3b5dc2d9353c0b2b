"""Output parsers for generations, named in configs (`generate.prompts[].parser`).

A parser maps an LLM output to (parsed, error): `parsed` is a flat dict of strings (stored
in the generations' `parsed` struct), `error` says why the output is unusable (the row is
kept, with its raw output, and counted). These are the generic ones; a study registers its
own through `Study.parsers()`, and `xling.studies.registry.find_parser` looks in both.
"""

from __future__ import annotations

import json
import re
from typing import Callable

Parsed = tuple[dict | None, str | None]


def parse_none(text: str) -> Parsed:
    return {"answer": text.strip()}, None


def parse_answer_tag(text: str) -> Parsed:
    """`<answer> ... </answer>` (XRAG's output format); a missing tag is an error."""
    m = re.search(r"<answer>(.*?)(?:</answer>|$)", text, re.DOTALL | re.IGNORECASE)
    if not m or not m.group(1).strip():
        return None, "no <answer> tag in the output"
    return {"answer": m.group(1).strip()}, None


def parse_json(text: str) -> Parsed:
    """A JSON object, tolerating ```json fences and text around it; values as strings."""
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip(), flags=re.IGNORECASE)
    m = re.search(r"\{.*\}", body, re.DOTALL)
    if not m:
        return None, "no JSON object in the output"
    try:
        obj = json.loads(m.group(0))
    except ValueError as e:
        return None, f"invalid JSON in the output: {e}"
    if not isinstance(obj, dict):
        return None, "the output's JSON is not an object"
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in obj.items()}, None


PARSERS: dict[str, Callable[[str], Parsed]] = {
    "none": parse_none, "answer_tag": parse_answer_tag, "json": parse_json}


def parse_verdict(text: str) -> Parsed:
    from xling.tasks.judge import parse_verdict as parse

    return parse(text)


PARSERS["verdict"] = parse_verdict  # judge panels (tasks/judge.py)
