"""MIRAGE-Bench (Thakur et al., NAACL 2025): a multilingual RAG arena with a surrogate judge.
The study class is `study.MIRAGE`; README.md has the design notes."""
