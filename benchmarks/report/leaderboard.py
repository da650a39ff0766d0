"""The leaderboard's page, README block and performance-profile plot, from a plan's records
(`benchmarks.evidence.leaderboard`); the same records give the same bytes."""

from __future__ import annotations

import hashlib
import io
import json
import math
from pathlib import Path

from benchmarks.evidence.leaderboard import (
    TAUS,
    Board,
    Entry,
    improvement,
    is_finite,
    pair_improvements,
    profiles,
    progress,
)
from benchmarks.evidence.placement import Placement
from benchmarks.evidence.plan import Row
from cory_common.files import atomic_write

README_START = "<!-- leaderboard:start (python -m benchmarks.leaderboard render) -->"
README_END = "<!-- leaderboard:end -->"
PROFILE_PLOT = "profiles.png"
PLOT_TAG = "cory leaderboard profiles "  # + the digest of the curves, in the PNG's Description


def _iv(x: tuple | None, digits: int = 2) -> str:
    """'0.84 [0.51, 1.10]', or '–'."""
    if x is None or not is_finite(x[0]):
        return "–"
    if not (is_finite(x[1]) and is_finite(x[2])):
        return f"{x[0]:.{digits}f}"
    return f"{x[0]:.{digits}f} [{x[1]:.{digits}f}, {x[2]:.{digits}f}]"


def _num(x: float | None, fmt: str = ".2f") -> str:
    """A number, or '–'."""
    return "–" if x is None or not is_finite(x) else format(x, fmt)


def _gap(iv) -> str:
    """A reward-at-matched-KL interval, or '–'."""
    if iv is None or not is_finite(iv.mean):
        return "–"
    return f"{iv.mean:+.2f} [{iv.low:+.2f}, {iv.high:+.2f}]"


def ranking(board: Board, table: list[Entry], placed: tuple[str, ...] = ()) -> list[str]:
    """The ranking table: every method's aggregate, per-task means, KL and spend (`placed`
    methods marked so)."""
    tasks = [s.task for s in board.studies]
    head = ["#", "method", "IQM [95%]", "mean [95%]", f"P(> {board.reference}) [95%]",
            *[f"{t} (mean)" for t in tasks], "final ΣKL",
            *[f"reward at matched KL − {board.reference}, {t}" for t in tasks],
            "optimizer steps", "rows / step", "generated tokens", "CPU min / run", "seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, e in enumerate(table, 1):
        means = [_num(sum(v) / len(v)) if v else "–" for v in (e.scores[t] for t in tasks)]
        name = f"`{e.method}`" + (" (placed)" if e.method in placed else "")
        cells = [str(i) if e.iqm else "–", name, _iv(e.iqm), _iv(e.mean),
                 "(reference)" if e.method == board.reference else _iv(e.p_over_reference),
                 *means, _num(e.final_kl), *[_gap(e.matched_gap[t]) for t in tasks],
                 _num(e.spent.get("optimizer steps"), ".0f"),
                 _num(e.spent.get("rows per optimizer step"), ".0f"),
                 _num(e.spent.get("generated tokens"), ".0f"),
                 _num(e.cpu_s / 60 if e.cpu_s else None, ".1f"), str(e.seeds)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def pairs_table(board: Board, table: list[Entry], rows: list[Row]) -> list[str]:
    """For each learner: alone and on CORY's structure, P(cory-X > X) and its planned rows."""
    by = {e.method: e for e in table}
    lines = ["| learner alone | IQM | on CORY's structure | IQM | P(CORY's > alone) [95%] | "
             "pre-stated rows (verdict) |", "|---|---|---|---|---|---|"]
    for a, b, p in pair_improvements(board, table):
        cited = [f"{r.hypothesis.id} ({r.verdict(board.plan.alpha)})" for r in rows
                 if {r.hypothesis.a.method, r.hypothesis.b.method} == {a, b}]
        lines.append(f"| `{b}` | {_iv(by[b].iqm)} | `{a}` | {_iv(by[a].iqm)} | {_iv(p)} | "
                     f"{'; '.join(cited) or '–'} |")
    return lines


def headline(board: Board, table: list[Entry], rows: list[Row]) -> list[str]:
    """The summary's sentences, each read off the tables below."""
    alpha = board.plan.alpha
    ranked = [e for e in table if e.iqm]
    out = []
    if ranked:
        top = ranked[0]
        tied = [e.method for e in ranked[1:] if e.iqm[2] >= top.iqm[1]]
        out.append(f"- **Leading on {board.model}** (descriptive): `{top.method}`, IQM "
                   f"{_iv(top.iqm)}; its interval overlaps "
                   + (", ".join(f"`{m}`" for m in tied) if tied else "no other method's")
                   + f" ({len(tied)} of {len(ranked) - 1}).")
    cory = [r for r in rows if r.hypothesis.id.startswith("C-")]
    if cory:
        decided = [r for r in cory if r.complete and r.p_holm < alpha]
        helped = [r.hypothesis.id for r in decided if r.estimate > 0]
        hurt = [r.hypothesis.id for r in decided if r.estimate < 0]
        open_ = [r.hypothesis.id for r in cory if r.complete and r not in decided]
        waiting = len([r for r in cory if not r.complete])
        out.append(f"- **Does CORY's structure help a learner learn alone?** Helps: "
                   f"{', '.join(helped) or 'no row decided so'}; hurts: "
                   f"{', '.join(hurt) or 'no row decided so'}; undecided: "
                   f"{', '.join(open_) or 'none'}"
                   + (f"; {waiting} of {len(cory)} rows wait for their seeds" if waiting
                      else "") + ".")
    for rid in ("N2r", "N4r"):
        r = next((r for r in rows if r.hypothesis.id == rid), None)
        if r is not None:
            out.append(f"- **{rid}** ({r.hypothesis.claim}): {r.verdict(alpha)}.")
    return out


def page(board: Board, table: list[Entry], saved: dict | None, hypotheses: str,
         rows: list[Row], plot_link: str) -> str:
    """The whole page (docs/leaderboard.md) of the board's `entries`."""
    state = progress(board)
    commit = (saved or {}).get("commit", "")[:12] or "not started"
    scale = ", ".join(f"{t} {v:g}" for t, v in board.scale.items())
    lines = [f"# Leaderboard: every learner on {board.model}", "",
             f"<!-- generated by python -m benchmarks.leaderboard render {board.path}; "
             f"edit the plan or the renderer, not this page -->", "",
             f"Plan: `{board.path}` (written {board.plan.written}), every run at commit "
             f"`{commit}`. {'**In progress:** ' if not state.complete else ''}"
             f"{state.line()}.", "",
             "## Summary", "", *headline(board, table, rows), "",
             "## Ranking", "",
             f"A run's score is its alone gain (the mean over its evaluation points of the "
             f"held-out reward answered alone, minus the base model's) over the task's stated "
             f"scale ({scale}: the factor study's PPO mean), so the base model scores 0. IQM "
             f"and mean pool every task's seeds, the tasks weighted equally (a task's scores "
             f"repeated to the seed counts' least common multiple); their 95% intervals are "
             f"stratified bootstrap "
             f"(seeds resampled within each task, 2,000 resamples). P(> {board.reference}) is "
             f"the probability that a run of the method beats a run of {board.reference} on "
             f"the same task, averaged over tasks. Reward at matched KL: the method's alone "
             f"reward minus {board.reference}'s at the ΣKL levels both reached, paired by "
             f"seed (a method that scores more only by moving further from the reference has "
             f"not learned more). Spend is per model, averaged over tasks and seeds.", "",
             *ranking(board, table), "",
             "## CORY's structure, learner by learner", "", *pairs_table(board, table, rows),
             "", "## Pre-stated hypotheses", "", hypotheses.rstrip("\n"), "",
             "## Performance profiles", "",
             f"![The fraction of runs scoring above each threshold, per method]"
             f"({plot_link})", "",
             "## Setting", "", f"Tuning: {board.tuning}", ""]
    for s in board.studies:
        lines.append(f"- `{s.task}`: preset `{s.preset}`, seeds {s.seeds[0]}–{s.seeds[-1]} "
                     f"({len(s.seeds)}), folder `{s.folder}`.")
    lines += ["", f"Your own method beside these runs: run it with a study's preset, then "
              f"`python -m benchmarks.leaderboard place {board.path} FOLDER`."]
    return "\n".join(lines) + "\n"


def placement_page(placing: Placement, table: list[Entry], saved: dict | None) -> str:
    """The page of methods placed on a board (`benchmarks.evidence.placement`): the ranking
    over the tasks they cover, and each one's probability of improvement over every method."""
    board, by = placing.board, {e.method: e for e in table}
    commit = (saved or {}).get("commit", "")[:12] or "not started"
    lines = [f"# {', '.join(f'`{m}`' for m in placing.methods)} on the leaderboard of "
             f"{board.model}", "",
             f"The plan `{board.path}`: its runs at commit `{commit}`, "
             f"{progress(placing.origin).line()}. Read over "
             f"{' and '.join(f'`{s.task}`' for s in board.studies)} only: the tasks the placed "
             f"folders run.", ""]
    lines += [f"- `{m}` (placed): from {', '.join(f'`{f}`' for f in placing.folders[m])}, "
              f"{by[m].seeds} finished runs, at commit "
              f"{', '.join(f'`{c}`' for c in placing.commits[m]) or '–'}." for m in placing.methods]
    lines += ["", "The plan's hypotheses do not name a placed method: what follows is "
              "descriptive, with 95% intervals and no verdict. Scores, aggregates and spend are "
              "read as on the leaderboard's page.", "",
              *ranking(board, table, placing.methods), "",
              "## Probability of improvement", "",
              "| method | " + " | ".join(f"P(`{m}` >) [95%]" for m in placing.methods) + " |",
              "|---|" + "---|" * len(placing.methods)]
    for e in table:
        if e.method in placing.methods:
            continue
        cells = [_iv(improvement(by[m], e)) for m in placing.methods]
        lines.append(f"| `{e.method}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def readme_block(board: Board, table: list[Entry], plot_link: str) -> str:
    """The README's short leaderboard: the top methods of the board's `entries`, their IQM and
    P(> reference)."""
    table = [e for e in table if e.iqm]
    state = progress(board)
    lines = [README_START, "",
             f"Every learner alone and on CORY's structure, {board.model}, "
             f"{' and '.join(f'`{s.task}`' for s in board.studies)} "
             f"([docs/leaderboard.md](docs/leaderboard.md); {state.line()}):", ""]
    if table:
        lines += [f"| method | IQM of normalized alone gain [95%] | P(> {board.reference}) |",
                  "|---|---|---|"]
        lines += [f"| `{e.method}` | {_iv(e.iqm)} | "
                  f"{'–' if e.method == board.reference else _iv(e.p_over_reference)} |"
                  for e in table[:6]]
        lines += ["", f"![Performance profiles]({plot_link})"]
    else:
        lines.append("No method has finished runs on every task yet.")
    return "\n".join(lines + ["", README_END])


def plot_profiles(table: list[Entry], path: Path) -> None:
    """The performance profiles of the board's `entries` (fraction of runs above τ, with 95%
    bands) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = profiles(table)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (method, points) in enumerate(curves.items()):
        y = [p[0] for p in points]
        low = [p[1] if not math.isnan(p[1]) else p[0] for p in points]
        high = [p[2] if not math.isnan(p[2]) else p[0] for p in points]
        style = "-" if method.startswith("cory") else "--"
        line, = ax.plot(TAUS, y, style, label=method, color=f"C{i % 10}")
        ax.fill_between(TAUS, low, high, color=line.get_color(), alpha=0.12)
    ax.set_xlabel("normalized alone gain τ (base model 0, the task's scale 1)")
    ax.set_ylabel("fraction of runs scoring above τ")
    if curves:
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "no method has finished runs on every task yet", ha="center",
                transform=ax.transAxes)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110,
                metadata={"Software": None, "Description": PLOT_TAG + profiles_digest(curves)})
    plt.close(fig)
    atomic_write(path, png.getvalue())


def profiles_digest(curves: dict[str, list[tuple[float, float, float]]]) -> str:
    """The sha256 of performance profiles' numbers (`profiles`, 6 decimals), which the plot
    carries in its Description: the same records give the same digest whatever draws the PNG."""
    rounded = {m: [[round(v, 6) if math.isfinite(v) else None for v in p] for p in points]
               for m, points in curves.items()}
    return hashlib.sha256(json.dumps(rounded, sort_keys=True).encode()).hexdigest()


def plotted_digest(path: Path) -> str | None:
    """The digest a profile plot written by `plot_profiles` carries (None: not such a plot)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            text = image.text.get("Description", "")
    except (OSError, ValueError):
        return None
    return text[len(PLOT_TAG):] if text.startswith(PLOT_TAG) else None
