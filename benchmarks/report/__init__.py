"""The report: a study folder's report.md and plots, from its records alone (`python -m
benchmarks.report RUN_DIR` rewrites them).

`markdown` writes report.md (tables, the claims' verdicts, the audit, samples); `plots` draws
the figures.
"""
