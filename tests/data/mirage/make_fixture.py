"""Writes the MIRAGE-Bench test fixtures in the three published hub layouts (invented data;
see README.md). Run from the repository root: `.venv/bin/python tests/data/mirage/make_fixture.py`."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent
MODELS = ["gpt-4-azure", "gpt-4o-azure", "meta-llama/Meta-Llama-3-70B-Instruct",
          "meta-llama/Meta-Llama-3-8B-Instruct", "google/gemma-1.1-2b-it"]  # strongest first
QUALITY = [1.0, 0.9, 0.7, 0.5, 0.2]
INSTRUCTION = ("Instruction: Provide an answer to the question using the information provided in "
               "contexts written in {lang}. Additionally, provide a step-by-step explanation of "
               "your reasoning, demonstrating how you arrived at your answer in {lang}. Cite parts "
               "of your reasoning within brackets [] using the IEEE format based on the provided "
               "contexts.\nPlease respond in {lang} using the format: ##Reason: {{reason}} "
               "##Answer: {{answer}}.")
QUERIES = {
    "en": [("Who founded the Halifax Gazette?", "John Bushell", "Letterpress printing"),
           ("When did the New York Times Magazine first appear?", "1896", "The New York Times"),
           ("What is the capital of Finland?", "Helsinki", "Finland"),
           ("Which river flows through Vienna?", "the Danube", "Vienna")],
    "sw": [("Mji mkuu wa Kenya ni upi?", "Nairobi", "Kenya"),
           ("Mlima mrefu zaidi Afrika ni upi?", "Kilimanjaro", "Kilimanjaro"),
           ("Ziwa kubwa zaidi Afrika ni lipi?", "Ziwa Viktoria", "Ziwa Viktoria"),
           ("Nani aliandika Utenzi wa Mwanakupona?", "Mwana Kupona", "Mwana Kupona")],
}
RELEASED = ["target_language", "english_language", "citation_MAP@10", "citation_Recall@10",
            "support_entailment", "support_neutral", "reranker_score", "answer_bleu",
            "answer_rougeL", "answer_overlap_score", "fluency_score"]
RESEARCH = ["language_detection", "en_detection", "citation_MAP@10", "citation_Recall@10",
            "xlni_context_entailment", "xlni_context_neutral", "bge-reranker-v2-m3-score",
            "answer_bleu", "answer_rougeL", "Meta-Llama-3-8B-Instruct-answer-eval",
            "Meta-Llama-3-8B-Instruct-fluency"]


def outputs(lang, k, q, answer):
    d = [f"{3690000 + 100 * k + i}#{i + 2}" for i in range(5)]
    fact = f"{answer} is stated in the contexts" if lang == "en" else f"{answer} imetajwa"
    texts = [  # one citation form per model (s1.4 of the spec): all parse cases
        f"##Reason: {fact} [{d[0]}]. It is confirmed [{d[1]}].\n\n##Answer: {answer} [{d[0]}]",
        f"##Reason: {fact} [{d[0]}, {d[1]}].\n\n##Answer: {answer} [{d[0]},{d[1]}]",
        f"##Reason: {fact} [{d[0]}] [{d[0]}] [{d[2]}]. ##Answer: {answer} 10:30 [{d[0]}]",
        f"##Reason: {fact} [{d[3]}] [99999#1]. ##Answer: {answer}",
        f"I think the answer is {answer} in English [{d[2]}]",  # no format at all
    ]
    return d, [{"model": m, "output": t} for m, t in zip(MODELS, texts)]


def main():
    rng = np.random.default_rng(7)
    for lang, queries in QUERIES.items():
        bench, outs, judg = [], [], []
        for k, (q, answer, title) in enumerate(queries):
            qid = f"{lang}-{k}"
            d, out = outputs(lang, k, q, answer)
            ctx = "\n".join(f"[{x}] {title} - Passage {i} about {title}: {answer if i < 2 else 'x'}."
                            for i, x in enumerate(d))
            name = {"en": "English", "sw": "Swahili"}[lang]
            prompt = f"Question: {q}\n\nContexts:\n{ctx}\n\n" + INSTRUCTION.format(lang=name)
            row = {"query_id": qid, "prompt": prompt, "positive_ids": d[:2],
                   "negative_ids": d[2:]}
            bench.append(row)
            feats = {}
            for col, rel in zip(RESEARCH if lang == "sw" else RELEASED, RELEASED):
                vals = {}
                for m, qual in zip(MODELS, QUALITY):
                    v = float(np.clip(qual + rng.normal(0, 0.05), 0, 1))
                    if rel == "english_language":
                        v = 1 - v
                    if rel in ("answer_overlap_score", "fluency_score"):
                        v = float(round(1 + 4 * v))
                    if rel == "reranker_score":
                        v = 6 * v - 2
                    if rel.startswith("support") and m == MODELS[-1] and k % 2:
                        v = None  # no cited sentence: null (read as 0 by the surrogate)
                    vals[m] = v
                feats[col] = vals
            outs.append({**row, "outputs": out, **feats})
            for i, j in [(i, j) for i in range(5) for j in range(i + 1, 5)]:
                winner = j if (i, j) == (k, k + 1) else i  # one upset per query
                a, b = (i, j) if (i + j + k) % 2 else (j, i)  # presentation order varies
                verdict = "A" if winner == a else "B"
                raw = f"Both answers cite documents. Final verdict: [[{verdict}]]"
                if (k, i, j) == (1, 0, 2):
                    verdict, raw = "Tie", "They are equally good. [[C]]"
                if (k, i, j) == (2, 0, 4):
                    verdict, raw = None, "I cannot decide between the two answers."
                judg.append({"query_id": qid, "model_A": MODELS[a], "model_B": MODELS[b],
                             "verdict": verdict, "judge": "gpt-4o-azure", "output": raw})
        for sub, rows in (("mirage-bench", bench), ("mirage-bench-output", outs),
                          ("mirage-bench-pairwise-judgments", judg)):
            (HERE / sub / lang).mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows), HERE / sub / lang / "dev-00000-of-00001.parquet")
    # a dev.small file beside dev (the hub has both): the loaders must not read it
    pq.write_table(pa.Table.from_pylist([{**bench[0], "query_id": "small-only"}]),
                   HERE / "mirage-bench" / "sw" / "dev.small-00000-of-00001.parquet")


if __name__ == "__main__":
    main()
