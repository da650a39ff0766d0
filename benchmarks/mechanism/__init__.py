"""The mechanism: does a model have CORY's mechanism? Knowledge and cross-role transfer, measured.

`measure` trains and plays the models; `cli` is `python -m benchmarks.mechanism`; how a
measurement is read (summaries, verdicts, merges) is evidence (`benchmarks.evidence.transfer`).
"""
