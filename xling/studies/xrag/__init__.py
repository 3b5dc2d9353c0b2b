"""XRAG (Liu et al., Findings of EMNLP 2025, arXiv:2505.10089): questions in German,
Spanish, Chinese and Arabic answered from English and X-language news articles. The study is
`study.XRAG`; README.md holds the design notes."""
