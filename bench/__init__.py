"""Benchmarks: ``python -m bench [CASE ...]`` (``make bench``) prints one JSON line per
measurement and a summary line per case. Each run starts a private local stack on free ports."""
