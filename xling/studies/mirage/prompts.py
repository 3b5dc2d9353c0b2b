"""MIRAGE-Bench's prompt texts (prompts.yaml beside this file): the RAG prompt as published
(Figure 10) and its instruction variants, reading query and passages back out of it, and
the pointwise (Figures 11, 12) and pairwise (Figure 13) judge prompts."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from xling.studies.mirage.options import Knobs
from xling.studies.mirage.parse import judge_answer, llm_answer
from xling.tasks.languages import get_language

PROMPT_FILE = Path(__file__).with_name("prompts.yaml")


def _load_prompts() -> dict[str, str]:
    import yaml  # PyYAML is a dependency of the config layer already
    return yaml.safe_load(PROMPT_FILE.read_text("utf-8"))


PROMPTS: dict[str, str] = _load_prompts()


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


def instruction(lang: str, which: str) -> str:
    """The RAG prompt's instruction: the paper's (Figure 10, P L570-585) or the API
    scripts' (s2.2)."""
    if which == "api_scripts":
        return fill(PROMPTS["rag_instruction_api_scripts"], {"{language}": language_name(lang)})
    return "Instruction:\n" + fill(PROMPTS["rag_instruction_paper"],
                                   {"{{language}}": language_name(lang)})


def rebuild_prompt(prompt: str, lang: str, which: str = "published") -> str:
    """The published prompt (``published``) or its text before the first ``Instruction:``
    followed by another instruction, as the API scripts did (s2.2)."""
    if which == "published":
        return prompt
    start = prompt.find("Instruction:")
    if start < 0:
        raise ValueError("prompt has no 'Instruction:' to replace")
    return prompt[:start] + instruction(lang, which)


def parse_prompt(prompt: str) -> dict:
    """Query, passages ``[(docid, text)]`` and the raw Contexts block out of a published
    prompt. Two rules (s1.3) must agree, else ``error`` is set: the released code's (query up
    to ``\\n\\nContexts:``, passages cut at each line-initial ``[docid]``, so a passage may
    span lines) and the research code's (query up to the first blank line, one passage per
    line)."""
    out = {"query": "", "passages": [], "contexts": "", "error": None}
    question = prompt.find("Question:")
    contexts = prompt.find("\n\nContexts:", question + 1)
    if question < 0 or contexts < 0:
        out["error"] = "prompt: no 'Question:' ... 'Contexts:'"
        return out
    out["query"] = prompt[question + len("Question:"):contexts].strip()
    dump_query = prompt[question + len("Question:"):].strip().split("\n\n")[0].strip()
    end = prompt.find("\n\nInstruction", contexts)
    block = prompt[contexts + len("\n\nContexts:"):end if end >= 0 else len(prompt)].strip("\n")
    out["contexts"] = block.strip()
    starts = list(_PASSAGE_START.finditer(block))
    ends = [s.start() for s in starts[1:]] + [len(block)]
    out["passages"] = [(start.group(1).strip(), block[start.end():stop].strip())
                       for start, stop in zip(starts, ends)]
    dump = [(line.split("]")[0].replace("[", "").strip('"').strip(),
             line.split("]", 1)[1].lstrip('"').strip()) for line in block.split("\n")
            if line.strip() and "]" in line]
    if dump_query != out["query"] or dump != out["passages"]:
        out["error"] = "prompt: the released and the research parsing rules disagree"
    if end < 0:
        out["error"] = "prompt: no 'Instruction' after the contexts"
    return out


# --------------------------------------------------------------------------------------
# The judges' prompts (s3.7, s3.8, s4.2)
# --------------------------------------------------------------------------------------

def answer_overlap_prompt(query: str, response: str, label: str, lang: str,
                          wording: str = "reference") -> str:
    """Feature 10's pointwise prompt (s3.7; ``paper`` = Figure 11)."""
    return fill(PROMPTS[f"answer_overlap_{wording}"], {
        "{{language}}": language_name(lang), "{{Question}}": query,
        "{{Label}}": llm_answer(label), "{{Response}}": llm_answer(response)})


def fluency_prompt(query: str, contexts: str, output: str, lang: str,
                   wording: str = "reference") -> str:
    """Feature 11's pointwise prompt (s3.8; ``paper`` = Figure 12)."""
    return fill(PROMPTS[f"fluency_{wording}"], {
        "{{language}}": language_name(lang), "{{Question}}": query,
        "{{Documents}}": contexts, "{{Summary}}": judge_answer(output, Knobs.reference())})


def pair_prompt(query: str, passages: Sequence[tuple[str, str]], answer_a: str, answer_b: str,
                wording: str = "reference") -> str:
    """One judge prompt, filled from the template constant (s4.2: documents as
    ``[docid]: text`` lines, answers as :func:`judge_answer` gives them)."""
    docs = "\n".join(f"[{docid}]: {text}" for docid, text in passages)
    braces = "{{%s}}" if wording == "paper" else "{%s}"
    return fill(PROMPTS[f"pairwise_{wording}"], {
        braces % "query": query, braces % "documents": docs, braces % "answer_a": answer_a,
        braces % "answer_b": answer_b})
