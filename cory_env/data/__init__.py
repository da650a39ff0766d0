"""The offline tasks' data: generated corpora, their BPE tokenizers and the sentiment scorer.

Kept import-light on purpose: import ``corpus``, ``tokenizer``, ``scorer`` or ``cache``.
Everything is built from code in seconds and cached under ``$CORY_CACHE`` (``cache.py``).
"""
