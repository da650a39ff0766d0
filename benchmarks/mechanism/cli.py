"""Command line of the mechanism measurement: does a model have CORY's mechanism?

    python -m benchmarks.mechanism --measure sentiment  # knowledge + cross-role transfer, 3 seeds
    python -m benchmarks.mechanism --measure reviews --model smollm2-135m --lora \\
        --mixed-precision bf16 --batch-size 16 --iterations 30 --lr 5e-4 --seeds 0,1,2,3,4
    python -m benchmarks.mechanism --measure reviews --queries 256 \\
        --ppo-checkpoints runs/x/ckpt/reviews-ppo-seed0.pt,... \\
        --observer-only-checkpoints runs/x/ckpt/reviews-cory-no-re-seed0.pt,...
    python -m benchmarks.mechanism --checkpoint runs/x/ckpt/reviews-cory-seed0.pt,... \\
        --observer llm_1 --pioneer llm_0 --queries 256 --out kt-trained.json
    python -m benchmarks.mechanism --merge runs/x/transfer-s01.json,runs/x/transfer-s2.json \\
        --out runs/x/transfer-reviews.json

`--measure` takes any task and model (`--import` for plug-in tasks) and every training
setting of `agents.training.config.TrainConfig` as an option: the budget at which PPO and
cory-no-re are trained for the cross-role transfer (docs/offline-models.md, "Measuring a
model"). `--checkpoint` measures the knowledge-transfer split of trained models instead: each
checkpoint's observer reading its pioneer's answers, one checkpoint per seed. `--merge` joins
measurements of one budget made on disjoint seeds (each seed as its runs finish, or on other
machines) into the one that measuring every seed at once gives. What is measured and how it
is read: `benchmarks.mechanism.measure`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from agents.refmodels import SIZES, reference_lm, resolve_size
from agents.training.config import add_train_options, train_config_from
from benchmarks.evidence.transfer import format_transfer, merge_transfers
from benchmarks.mechanism.measure import QUERIES, checkpoint_knowledge_transfer, measure_transfer
from cory_common import cli
from cory_common.files import atomic_write
from cory_common.threads import configure, started_as
from cory_env import offline_model
from cory_env.data.tokenizer import TASKS


def main(argv: Sequence[str] | None = None) -> int:
    """Measure a model's knowledge and cross-role transfer, or trained observers' split."""
    parser, paths = _parser()
    args = parser.parse_args(argv)
    configure(restart=started_as("benchmarks.mechanism"))
    if args.merge:
        return _merge(parser, args)
    if args.checkpoint:
        return _checkpoint_split(parser, args)
    if args.measure:
        return _measure(parser, args, paths)
    parser.error("give --measure TASK, --checkpoint PATHS or --merge PATHS")
    return 2


def _parser() -> tuple[argparse.ArgumentParser, dict]:
    """The command line's parser and the paths of its training options."""
    parser = cli.Parser("python -m benchmarks.mechanism", description=__doc__,
                                     argument_default=argparse.SUPPRESS)
    parser.add_argument("--measure", metavar="TASK", default=None,
                        help="measure knowledge transfer and cross-role transfer of a task's "
                             "model (--model; default: the offline LM, about 4 minutes)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of --measure (default: 0,1,2)")
    parser.add_argument("--queries", type=int, default=QUERIES,
                        help="answers of each evaluation, one per held-out query (cycling "
                             "over the split when it holds fewer; default: %(default)s)")
    parser.add_argument("--out", default=None,
                        help="the JSON file (--measure's default: the model folder's "
                             "transfer.json, or transfer-TASK.json for a model that is not the "
                             "offline LM)")
    parser.add_argument("--lm-size", default=None, choices=sorted(SIZES),
                        help="the offline LM's training preset, when --measure builds it")
    parser.add_argument("--checkpoint", default=None, metavar="PATHS", nargs="+",
                        help="a learner's checkpoints, one per seed (commas or spaces): "
                             "measure the knowledge-transfer split of their trained observer")
    parser.add_argument("--ppo-checkpoints", default=None, metavar="PATHS", nargs="+",
                        help="with --measure: finished PPO runs' checkpoints, one per seed "
                             "(commas or spaces), measured instead of training PPO here")
    parser.add_argument("--observer-only-checkpoints", default=None, metavar="PATHS", nargs="+",
                        help="with --measure: the same seeds' finished cory-no-re checkpoints")
    parser.add_argument("--merge", default=None, metavar="PATHS", nargs="+",
                        help="--measure results of one budget on disjoint seeds (commas or "
                             "spaces): write them as one measurement to --out")
    parser.add_argument("--observer", default="llm_1", help="--checkpoint's observer agent")
    parser.add_argument("--pioneer", default="llm_0", help="--checkpoint's pioneer agent")
    paths = add_train_options(parser, skip=("task", "method", "seed"))
    return parser, paths


def _checkpoint_split(parser, args) -> int:
    """--checkpoint: the knowledge-transfer split of trained observers, printed and saved."""
    files = _files(parser, "--checkpoint", args.checkpoint)
    if args.queries < 1:
        parser.error(f"--checkpoint needs --queries >= 1, got {args.queries}")
    t0 = time.perf_counter()
    result = checkpoint_knowledge_transfer(files, args.observer, args.pioneer, args.queries)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(result, indent=2)
    if args.out:
        atomic_write(Path(args.out), text)
    print(text)
    return 0


def _merge(parser, args) -> int:
    """--merge: several measurements on disjoint seeds as one, saved to --out."""
    files = _files(parser, "--merge", args.merge)
    if not args.out:
        parser.error("--merge needs --out, the file of the merged measurement")
    parts = []
    for f in files:
        try:
            parts.append(json.loads(Path(f).read_text()))
        except json.JSONDecodeError as err:
            parser.error(f"--merge: {f} is not a JSON measurement ({err})")
    try:
        result = merge_transfers(parts, files)
    except (KeyError, TypeError) as err:
        parser.error(f"--merge: a file lacks a measurement's fields ({err!r}): {files}")
    except ValueError as err:
        parser.error(f"--merge: {err}")
    result["file"] = str(args.out)
    atomic_write(Path(args.out), json.dumps(result, indent=2))
    print("\n".join(format_transfer(result)))
    print(f"[cory lm] {len(result['seeds'])} seeds merged; saved to {args.out}")
    return 0


def _measure(parser, args, paths: dict) -> int:
    """--measure TASK: knowledge transfer and cross-role transfer of a task's model."""
    try:
        cfg = train_config_from(args, paths, task=args.measure)
        trained = None
        if args.ppo_checkpoints or args.observer_only_checkpoints:
            trained = tuple(_files(parser, opt, value) for opt, value in (
                ("--ppo-checkpoints", args.ppo_checkpoints),
                ("--observer-only-checkpoints", args.observer_only_checkpoints)))
        if cfg.model is None and offline_model(args.measure) is None and not trained:
            raise ValueError(f"--measure {args.measure}: the task has no offline reference "
                             f"LM ({', '.join(TASKS)} have); give --model")
        try:
            seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--seeds must be a comma list of integers, got "
                             f"{args.seeds!r}") from None
        if not seeds or args.queries < 1:
            raise ValueError(f"--measure needs at least one seed and one query, got "
                             f"--seeds {args.seeds!r} --queries {args.queries}")
    except ValueError as err:
        parser.error(str(err))
    if cfg.model is None and trained is None:
        reference_lm(offline_model(args.measure), size=resolve_size(args.lm_size))
    try:
        result = measure_transfer(args.measure, model=cfg.model, cfg=cfg, seeds=seeds,
                                  n=args.queries, out=args.out, checkpoints=trained)
    except ValueError as err:
        if trained is None:
            raise
        parser.error(str(err))
    print("\n".join(format_transfer(result)))
    print(f"[cory lm] measured in {result['seconds']:.0f}s; saved to {result['file']}")
    return 0


def _files(parser, option: str, value: list[str] | None) -> list[str]:
    """Existing files (commas or spaces between them), or a parser error naming the missing."""
    files = [p.strip() for v in value or [] for p in v.split(",") if p.strip()]
    missing = [p for p in files if not Path(p).is_file()]
    if not files or missing:
        parser.error(f"{option} needs a list of existing files: missing "
                     f"{missing or 'all (none given)'}")
    return files

