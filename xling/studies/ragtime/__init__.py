"""RAGTIME-shaped cited reports over xling's own retrieval (study.py)."""
