"""Offline task assets: synthetic corpora, tiny tokenizers and a sentiment scorer.

Kept import-light on purpose: import ``corpus``, ``build`` or ``cache`` directly.
"""
