"""LLM-CLIR (Zuo et al.): cross-lingual retrieval with LLM reranking, scored by the evaluate
stage's IR cells; this package renders the paper's tables. See README.md."""
