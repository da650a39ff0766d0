"""Every shell command of the README and docs/, checked as written (CI runs this after the tests).

    python tools/doc_commands.py            # every command; exit 1 naming each one that fails
    python tools/doc_commands.py --list     # the commands and how each is checked

The commands are the lines of the ```bash blocks (continuation lines joined, comments cut).
Each is checked as far as it can be without its hours of compute, GPU or earlier study folder:
- `python -m benchmarks.run ...` runs as written with `--plan`: every setting is resolved and
  validated and the runs are listed, nothing loaded or written (a `--resume` whose folder does
  not exist yet, e.g. runs/X, and a command for another machine, a CUDA device or an absolute
  path this one lacks, fall back to the next rule);
- any other `python -m MODULE ...` or `python path.py ...` (also behind torchrun or accelerate
  launch): `--help` exits 0 and names every option the command uses;
- `make TARGET`: the Makefile has the target (`make -n`);
- the lines named in QUICK run in full.
Run from the repository root with the project's Python on PATH (`make` activates .venv).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
QUICK = {"python -m benchmarks.run --quick"}  # run in full: the smoke run, about a minute
SKIP = ("pip ",)  # installs reach the network


def commands(text: str) -> list[str]:
    """The commands of a markdown text's ```bash blocks, continuation lines joined, comments
    and prompts cut."""
    out = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
        line = ""
        for raw in block.splitlines():
            part = raw.strip()
            if part.endswith("\\"):
                line += part[:-1].rstrip() + " "
                continue
            line = (line + part).split(" #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
            line = ""
    return out


def module_of(words: list[str]) -> list[str] | None:
    """The Python program a command runs (`-m MODULE` or a .py file, also behind torchrun or
    accelerate launch), or None."""
    for i, w in enumerate(words[:-1]):
        if w == "-m":
            return ["-m", words[i + 1]]
    return next(([w] for w in words if w.endswith(".py")), None)


def how(cmd: str) -> str:
    """How a command is checked: run, plan, help, make or skip."""
    words = shlex.split(cmd)
    if cmd in QUICK:
        return "run"
    if cmd.startswith(SKIP) or not words:
        return "skip"
    if words[0] == "make":
        return "make"
    target = module_of(words)
    if target is None:
        return "skip"
    if target == ["-m", "benchmarks.run"]:
        if "--resume" in words and not (ROOT / words[words.index("--out") + 1]).exists():
            return "help"
        return "help" if elsewhere(words) else "plan"
    return "help"


def elsewhere(words: list[str]) -> bool:
    """Whether a command is for another machine: a CUDA device where none is, or an absolute
    path (a model, a dataset, shared storage) this machine lacks."""
    if "cuda" in " ".join(words) and shutil.which("nvidia-smi") is None:
        return True
    if any(re.search(r":PORT\b", w) for w in words):  # an address the docs leave to the reader
        return True
    paths = [p for w in words for p in re.split(r"[=,]", w) if p.startswith("/")]
    return any(not Path(p).exists() for p in paths)


def check(cmd: str) -> str | None:
    """Check one command; None if it passes, else what went wrong."""
    words, kind = shlex.split(cmd), how(cmd)
    py = [sys.executable]
    if kind == "skip":
        return None
    if kind == "make":
        args = ["make", "-n", *[w for w in words[1:] if "=" not in w][:1]]
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        return None if p.returncode == 0 else f"make -n: {p.stderr.strip()[-300:]}"
    if kind == "run":
        p = subprocess.run(py + words[1:], cwd=ROOT, capture_output=True, text=True)
        return None if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-500:]}"
    target = module_of(words)
    if kind == "plan":
        start = words.index("-m")
        p = subprocess.run(py + words[start:] + ["--plan"], cwd=ROOT, capture_output=True,
                           text=True)
        return None if p.returncode == 0 else f"--plan: {p.stderr.strip()[-500:]}"
    p = subprocess.run(py + target + ["--help"], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        return f"--help exit {p.returncode}: {p.stderr.strip()[-300:]}"
    at = words.index(target[-1]) + 1
    used = {w.split("=")[0] for w in words[at:]  # not a quoted value of options ("--a b")
            if re.fullmatch(r"--[A-Za-z][\w-]*(=.*)?", w)}
    missing = sorted(o for o in used if not re.search(rf"{re.escape(o)}\b", p.stdout))
    return f"options not in --help: {missing}" if missing else None


def main() -> None:
    """Check (or list) every command of the README and docs/."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the commands and stop")
    args = parser.parse_args()
    failed, seen = 0, set()
    for doc in DOCS:
        for cmd in commands((ROOT / doc).read_text()):
            if cmd in seen:
                continue
            seen.add(cmd)
            if args.list:
                print(f"{how(cmd):5} {doc}: {cmd}")
                continue
            error = check(cmd)
            failed += error is not None
            print(f"{'FAIL' if error else 'ok':4} {how(cmd):5} {doc}: {cmd}" +
                  (f"\n     {error}" if error else ""), flush=True)
    if failed:
        sys.exit(f"{failed} documented command(s) fail as written")


if __name__ == "__main__":
    main()
