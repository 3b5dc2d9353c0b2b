"""BordIRLines (Li et al., arXiv:2410.01171): which country owns a disputed territory, asked
in each claimant's language with retrieved passages. The study is `study.BordIRLines`;
README.md holds the design notes."""
