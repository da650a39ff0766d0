"""Command line: compare methods on tasks over seeds, then write metrics, plots and a report.

    python -m benchmarks.run                      # ppo vs cory on sentiment + arithmetic, 3 seeds
    python -m benchmarks.run --quick              # a smoke run of about a minute
    python -m benchmarks.run --methods ppo,cory,cory-no-kt,cory-no-re --tasks arithmetic
    python -m benchmarks.run --eta-sweep --tasks arithmetic          # + a Pareto plot
    python -m benchmarks.run --preset gsm8k       # the paper's GPU setting (hub access needed)
    python -m benchmarks.run --resume --out runs/X                  # continue a killed run

Every setting of `benchmarks.BenchConfig` is an option (`--batch-size`, `--lr`, ...); a
preset fills them first, `--quick` shrinks them, explicit options win. `--resume` alone
continues with the folder's saved settings; settings given with it must equal those.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import PAPER_ETAS, PRESETS, BenchConfig, RunFolder, resolve_config, run_benchmark
from benchmarks import check_resume as _check_resume


def comma_list(text: str) -> list[str]:
    """'a,b' -> ['a', 'b'] (empty items dropped)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def int_list(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]."""
    try:
        return [int(x) for x in comma_list(text)]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected integers like 0,1,2, got {text!r}") from err


def float_list(text: str) -> list[float]:
    """'1e-3,1e-2' -> [0.001, 0.01]; 'paper' -> the paper's η values."""
    if text == "paper":
        return list(PAPER_ETAS)
    try:
        return [float(x) for x in comma_list(text)]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected numbers like 1e-3,1e-2, got {text!r}") \
            from err


def literal(text: str):
    """A Python literal if the text is one (3, 0.5, True, None), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def key_values(text: str) -> dict:
    """'a=1,b=x' -> {'a': 1, 'b': 'x'}."""
    out = {}
    for item in comma_list(text):
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = literal(value.strip())
    return out


def optional(kind):
    """A converter that maps 'none' to None."""
    return lambda text: None if text.lower() == "none" else kind(text)


CONVERTERS = {"int": int, "float": float, "str": str, "list[str]": comma_list,
              "list[int]": int_list, "list[float]": float_list, "dict[str, float]": key_values,
              "dict[str, str]": key_values, "int | None": optional(int),
              "str | None": optional(str), "float | None": optional(float)}


def build_parser() -> argparse.ArgumentParser:
    """An option per BenchConfig field (defaults left out, so explicit ones are known)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     argument_default=argparse.SUPPRESS)
    defaults = BenchConfig()
    for f in dataclasses.fields(BenchConfig):
        flag, help_ = "--" + f.name.replace("_", "-"), f.metadata.get("help", "")
        help_ += f" (offline default: {getattr(defaults, f.name)!r})"
        if f.name == "quick":
            parser.add_argument(flag, action="store_true", help=help_)
        elif f.name == "preset":
            parser.add_argument(flag, choices=sorted(PRESETS), help=help_)
        elif f.name == "eta_sweep":
            parser.add_argument(flag, nargs="?", const="paper", type=float_list, help=help_)
        elif f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_)
        else:
            parser.add_argument(flag, type=CONVERTERS[f.type], help=help_)
    parser.add_argument("--out", help="run folder (default runs/<timestamp>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the killed run in --out (same settings)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def config_from_args(args: argparse.Namespace) -> tuple[BenchConfig, Path, bool]:
    """The resolved settings, the run folder and the resume flag; raises ValueError."""
    given = dict(vars(args))
    out, resume = given.pop("out", None), given.pop("resume", False)
    given.pop("no_progress", None)
    if resume and not out:
        raise ValueError("--resume needs --out, the folder of the run to continue")
    out = Path(out or Path("runs") / time.strftime("%Y-%m-%d_%H-%M-%S"))
    if resume and not given:
        return RunFolder(out).saved_config().validate(), out, True
    cfg = resolve_config(given.pop("preset", "offline"), given.pop("quick", False), **given)
    if resume:
        _check_resume(cfg, RunFolder(out).saved_config())
    return cfg, out, resume


def main(argv: list[str] | None = None) -> Path:
    """Parse the command line, run the benchmark, print where the report is."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg, out, resume = config_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    path = run_benchmark(cfg, out, resume=resume, progress=not getattr(args, "no_progress", False))
    print(f"report: {path}")
    return path


if __name__ == "__main__":
    main()
