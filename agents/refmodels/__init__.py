"""The offline reference LMs: small GPT-2s pretrained by the project on each task's corpus.

    from agents.refmodels import reference_lm
    path = reference_lm("sentiment")       # an HF folder (model + tokenizer + report.json)

`data` assembles the training sequences as the env assembles prompts, `pretrain` trains and
caches the models, `measure` writes their pre-RL report, and `python -m agents.refmodels` is
the command line. docs/offline-models.md has what the models are and what was measured.
"""

from .measure import build_report, format_report, repeated_gap
from .pretrain import model_dir, rebuild, reference_lm, resolve_size
from .sizes import RECIPES, SIZES, VERSIONS, LMRecipe, LMSize

__all__ = ["SIZES", "RECIPES", "VERSIONS", "LMSize", "LMRecipe", "build_report",
           "format_report", "model_dir", "rebuild", "reference_lm", "repeated_gap",
           "resolve_size"]
