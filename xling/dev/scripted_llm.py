"""A scripted OpenAI-compatible LLM server for the offline demo's MIRAGE-Bench arena.

`python -m xling.dev.scripted_llm --port 8977` serves `/v1/models` and
`/v1/chat/completions` on 127.0.0.1. Its models stand in for API models that the demo cannot
call:
- `scripted-best` / `scripted-good` / `scripted-fair` / `scripted-poor`: RAG answers in
  MIRAGE's `##Reason: ... ##Answer: ...` format citing the first passage (best, good) or
  nothing (fair, poor), each with a `QUALITY=<n>` marker (four strengths, so that the demo
  can hold out two models and still train the surrogate on three, with the tiny model);
- `scripted-judge`: the arena judge. On a pair prompt it prefers the answer with the higher
  marker (an answer without one, such as the tiny model's, counts 0) and says `[[C]]` on a
  tie, except on about a third of the questions (by a hash of the question), where it
  prefers the weaker answer: a judge that is never wrong makes Bradley-Terry's estimate
  infinite. On the pointwise prompts it gives a fixed score and rating;
- `scripted-nuggets`: a stand-in for the nugget judge (jobs/nuggets.py) on the nuggetizer's
  and the support prompts: nuggets are the first words of each document, labels alternate
  vital/okay, a nugget is supported when its words are in the answer, a citation when the
  sentence shares words with it. Well-formed replies, so that the demo's nugget tables have
  numbers to show; the tiny vLLM model is what the stage's tests run;
- `scripted-reporter`: a RAGTIME-shaped report (studies/ragtime): one sentence per listed
  document, its first words, citing it;
- `cross-perfect` / `cross-unanswerable`: CROSS readers. The perfect one answers the largest
  7-digit number between `#CONTEXT` and `#ENDCONTEXT` (so it is right exactly when the
  target needle was in what it was shown); the other always answers UNANSWERABLE.

It exists so that `make demo` runs the whole arena (generate -> features -> judge ->
evaluate) through the real HTTP client, the cache and the Ray actor pools, offline.
"""

from __future__ import annotations

import argparse
import hashlib
import re

QUALITY = {"scripted-best": 4, "scripted-good": 3, "scripted-fair": 2, "scripted-poor": 1}


CROSS_READERS = ("cross-perfect", "cross-unanswerable")


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if len(w) > 3}


def nugget_reply(prompt: str) -> str:
    """scripted-nuggets' reply to a nuggetizer, TREC 2024 support or attestation prompt."""
    import ast

    if "Updated Nugget List:" in prompt:
        ctx = prompt.split("Context:\n", 1)[1].split("\nSearch Query:", 1)[0]
        old = ast.literal_eval(prompt.split("Initial Nugget List: ", 1)[1].split("\n", 1)[0])
        new = [" ".join(line.split("] ", 1)[-1].split()[:6]) for line in ctx.splitlines()]
        return repr(list(dict.fromkeys(old + new))[:8])
    nuggets = ast.literal_eval(prompt.split("Nugget List: ", 1)[1].split("\n", 1)[0]) \
        if "Nugget List: " in prompt else []
    if "either a vital or okay" in prompt:
        return repr(["vital" if i % 2 == 0 else "okay" for i in range(len(nuggets))])
    if "Passage: " in prompt:
        passage = _words(prompt.split("Passage: ", 1)[1].split("\nNugget List:", 1)[0])
        labels = []
        for n in nuggets:
            share = len(_words(n) & passage) / max(1, len(_words(n)))
            labels.append("support" if share >= 0.8 else "partial_support" if share > 0
                          else "not_support")
        return repr(labels)
    if "Statement: " in prompt:
        st = _words(prompt.split("Statement: ", 1)[1].split("\n\nCitation:", 1)[0])
        ci = _words(prompt.split("Citation: ", 1)[1])
        share = len(st & ci) / max(1, len(st))
        return "Full Support" if share >= 0.5 else "Partial Support" if share else "No Support"
    if "Sentence: " in prompt:
        body = prompt.rsplit("Sentence: ", 1)[1]
        st, doc = body.split("\nDocument: ", 1)
        return "YES" if _words(st) & _words(doc) else "NO"
    return "[]"


def report_reply(prompt: str) -> str:
    """scripted-reporter: each listed document's first words as a sentence citing it."""
    block = prompt.split("Documents:\n", 1)[-1].split("\n\nReport:", 1)[0]
    out = []
    for line in block.splitlines()[:3]:
        m = re.match(r"^\[([^\]]+)\]\s*(.*)$", line)
        if m:
            out.append(f"{' '.join(m.group(2).split()[:10]).rstrip('.')} [{m.group(1)}].")
    return " ".join(out)


def reply(prompt: str, model: str) -> str:
    if model == "scripted-reporter":
        return report_reply(prompt)
    if model == "scripted-nuggets":
        return nugget_reply(prompt)
    if model == "cross-perfect":
        ctx = prompt.split("#CONTEXT", 1)[-1].split("#ENDCONTEXT", 1)[0]
        numbers = [int(n) for n in re.findall(r"(?<![0-9])[0-9]{7}(?![0-9])", ctx)]
        return str(max(numbers)) if numbers else "UNANSWERABLE"
    if model == "cross-unanswerable":
        return "UNANSWERABLE"
    if model in QUALITY:
        ctx = prompt.split("Contexts:", 1)[-1]
        first = re.search(r"^\[([^\]]+)\]\s*(.*)$", ctx.strip(), re.M)
        cite = f" [{first.group(1)}]" if first and QUALITY[model] >= 3 else ""
        # the best model also restates the passage it cites (so that the nugget demo's
        # judges have words to match); the others only point at it
        said = " ".join(first.group(2).split()[:12]).rstrip(".") if first and \
            QUALITY[model] == 4 else "See the first context"
        return (f"##Reason: The contexts answer the question{cite}.\n"
                f"##Answer: {said}{cite}. QUALITY={QUALITY[model]}")
    if "Assistant A's Answer]" in prompt:
        def quality(side: str) -> int:
            part = prompt.split(f"[The Start of Assistant {side}'s Answer]", 1)[1].split(
                f"[The End of Assistant {side}'s Answer]", 1)[0]
            m = re.search(r"QUALITY=(\d)", part)
            return int(m.group(1)) if m else 0
        a, b = quality("A"), quality("B")
        question = prompt.split("[User Question]", 1)[1].split("[Reference Documents]", 1)[0]
        if int(hashlib.md5(question.strip().encode()).hexdigest(), 16) % 3 == 1:
            a, b = b, a  # an upset
        return "Scripted comparison. " + ("[[A]]" if a > b else "[[B]]" if b > a else "[[C]]")
    if "##Rating" in prompt:
        return "##Rating: 4 ##Explanation: scripted."
    return "Score: [[3]] Justification: scripted."


def serve(port: int, host: str = "127.0.0.1") -> None:
    from aiohttp import web

    models = [*QUALITY, "scripted-judge", "scripted-nuggets", "scripted-reporter",
              *CROSS_READERS]

    async def list_models(request):
        return web.json_response({"object": "list",
                                  "data": [{"id": m, "object": "model"} for m in models]})

    async def complete(request):
        body = await request.json()
        model = body.get("model")
        if model not in models:
            return web.json_response({"error": {"message": f"model {model} does not exist"}},
                                     status=404)
        prompt = body["messages"][-1]["content"]
        text = reply(prompt, model)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        return web.json_response({"id": "scripted", "model": model, "usage": usage, "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": text}}]})

    app = web.Application()
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", complete)
    web.run_app(app, host=host, port=port, print=None)


def wait(port: int, timeout: float = 30.0) -> None:
    """Return once a server answers on the port (the demo starts it in the background)."""
    import time
    import urllib.request

    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
            return
        except OSError:
            if time.time() > deadline:
                raise SystemExit(f"no scripted LLM server on 127.0.0.1:{port}")
            time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8977)
    p.add_argument("--wait", action="store_true", help="only wait until a server answers")
    args = p.parse_args()
    wait(args.port) if args.wait else serve(args.port)


if __name__ == "__main__":
    main()
