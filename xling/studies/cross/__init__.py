"""CROSS on mLongRR-V2 (Bagheri Nezhad & Agrawal, "CROSS: Analyzing the trade-offs in
long-context cross-lingual retrieval"): needles in long monolingual haystacks, queried in
another language, answered from the whole context or from the top k sentences a sentence
embedder ranks. The study is `study.CROSS`; README.md holds the design notes."""
