"""How often the claims' verdicts are wrong: synthetic runs whose truth is known by construction,
decided by the real claim code (`benchmarks.evidence.claims`), many times over.

    python -m benchmarks.calibrate                           # the table in docs/benchmark.md
    python -m benchmarks.calibrate --replicates 50 --seeds 5 --write runs/world  # and one folder

Every world is a set of methods walking reward–KL frontiers f(e·KL) = BASE + GAIN·(1 − e^(−e·KL/2))
(e: the method's KL efficiency) on an exact-match task (reward scale 1), each seed at its own
speed (log-normal, sd SPEED_SD), every alone point with evaluation noise (reward sd NOISE, KL
relative sd KL_NOISE; a two-model method averages two independently noised models), c = KL_COEF.
A PPO *collapse* D takes D off its reward linearly over the second half of the run.

The truth of each claim in a world is computed from its noise-free curves (`truths`); a verdict
is **false** when it is *supported* where the claim is false or on its boundary, or
*contradicted* where the claim is true or on its boundary. Nominal: 2.5% per direction.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agents.learners.registry import ablation_methods
from benchmarks.evidence import claims as cl
from benchmarks.evidence import verdicts as vd
from benchmarks.evidence.frontier import LEVELS
from benchmarks.evidence.records import RunData
from benchmarks.evidence.stats import change
from benchmarks.evidence.trajectories import MEANINGFUL, gather
from cory_common import cli
from cory_common.files import atomic_write
from cory_common.threads import configure

TASK = "arithmetic"
ITERATIONS = list(range(0, 33, 3))  # 11 evaluation points, as the studies' presets
BASE, GAIN, SCALE_KL = 0.2, 0.6, 2.0
NOISE, KL_NOISE, SPEED_SD, KL_COEF = 0.05, 0.05, 0.15, 0.3
METHODS = ("ppo", "cory", "cory-no-kt", "cory-no-re")
CLAIMS = ("(1)", "(1a)", "(1b)", "(2)", "(3)", "(4)")


@dataclass(frozen=True)
class Walk:
    """One method's path: efficiency e on the frontier, KL reached at the end of the run (at
    speed 1), and a collapse of the reward over the second half."""

    efficiency: float = 1.0
    kl_end: float = 4.0
    collapse: float = 0.0
    learns: bool = True

    def curve(self, u: np.ndarray, speed: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(reward, KL) at run fractions u, noise-free."""
        kl = self.kl_end * speed * u
        gain = GAIN * (1 - np.exp(-self.efficiency * kl / SCALE_KL)) if self.learns else 0 * u
        drop = self.collapse * np.clip((u - 0.5) / 0.5, 0, 1)
        return BASE + gain - drop, kl


@dataclass(frozen=True)
class World:
    """Methods' walks (the ablations walk as CORY unless given) and whether it is a null."""

    name: str
    null: bool
    walks: dict[str, Walk] = field(default_factory=dict)

    def walk(self, method: str) -> Walk:
        """A method's walk (ablations: CORY's unless the world names them)."""
        return self.walks.get(method) or self.walks["cory"]


PPO = Walk()
WORLDS = (
    World("one frontier, CORY at half PPO's speed", True, {"ppo": PPO, "cory": Walk(1, 2)}),
    World("identical methods", True, {"ppo": PPO, "cory": PPO}),
    World("no learning", True, {"ppo": Walk(learns=False), "cory": Walk(learns=False, kl_end=2)}),
    World("CORY 2x KL-efficient", False, {"ppo": PPO, "cory": Walk(2, 2)}),
    World("CORY 2.5x KL-efficient", False, {"ppo": PPO, "cory": Walk(2.5, 1.6)}),
    World("CORY 3x, ablations 1.5x", False, {"ppo": PPO, "cory": Walk(3, 4 / 3),
                                             "cory-no-kt": Walk(1.5, 8 / 3),
                                             "cory-no-re": Walk(1.5, 8 / 3)}),
    World("PPO collapses by 0.2", False, {"ppo": Walk(collapse=0.2), "cory": Walk(1, 2)}),
    World("PPO collapses by 0.4", False, {"ppo": Walk(collapse=0.4), "cory": Walk(1, 2)}),
    World("CORY 10x and slow, PPO collapses by 0.4", False,
          {"ppo": Walk(collapse=0.4), "cory": Walk(10, 0.2)}),
)


# ------------------------------------------------------------------------------- truth
def _side(theta: float, at: float) -> str:
    """true / false / boundary of "theta > at"."""
    return "boundary" if abs(theta - at) < 1e-9 else ("true" if theta > at else "false")


def _both(*parts: str) -> str:
    """The truth of an "and" of parts."""
    return "false" if "false" in parts else ("boundary" if "boundary" in parts else "true")


def truths(world: World) -> dict[str, str]:
    """Each claim's truth in the world, from its noise-free curves at speed 1."""
    u = np.linspace(0, 1, 401)
    curve = {m: world.walk(m).curve(u) for m in METHODS}
    if not world.walk("ppo").learns:
        return dict.fromkeys(CLAIMS, "untestable")
    delta = MEANINGFUL  # the reward scale of an exact-match task is 1
    (rp, kp), (rc, kc) = curve["ppo"], curve["cory"]
    ep, ec = world.walk("ppo").efficiency, world.walk("cory").efficiency
    ratio = math.log(ec / ep)
    budgets = [f * min(kp[-1], kc[-1]) for f in LEVELS]
    frontier = lambda w, k: BASE + GAIN * (1 - math.exp(-w.efficiency * k / SCALE_KL))  # noqa: E731
    gap = float(np.mean([frontier(world.walk("cory"), k) - frontier(world.walk("ppo"), k)
                         for k in budgets]))
    half = u >= 0.5
    late = lambda y: change(u[half], y[half])  # noqa: E731
    final_gap, final_ratio = rc[-1] - rp[-1], math.log(kp[-1] / kc[-1])
    ablation = np.mean([math.log(ec / world.walk(m).efficiency) for m in ablation_methods()])
    return {
        "(1)": _both("true" if abs(final_gap) < delta else "false",
                     _side(final_ratio, math.log(cl.KL_RATIO))),
        "(1a)": _side(ratio, math.log(cl.KL_RATIO)),
        "(1b)": _side(gap, 0.0),
        "(2)": _both(_side(-late(rp), delta), _side(late(rc), -delta)),
        "(3)": _side(ablation, 0.0),
        "(4)": _both(_side(late(rc - KL_COEF * kc), delta), _side(-late(rp - KL_COEF * kp), delta)),
    }


# ------------------------------------------------------------------------------- records
def records(world: World, seeds: int, rng: np.random.Generator) -> RunData:
    """One synthetic study folder's records (metrics rows and alone rows) for the world."""
    its = np.array(ITERATIONS, dtype=np.float64)
    u = its / its[-1]
    alone, metrics = [], []
    for method in METHODS:
        models = ("llm_0",) if method == "ppo" else ("llm_0", "llm_1")
        for seed in range(seeds):
            reward, kl = world.walk(method).curve(u, float(rng.lognormal(0, SPEED_SD)))
            metrics.append({"task": TASK, "method": method, "seed": seed, "swept_kl_coef": None,
                            "iteration": 0, "agent": "llm_0", "role": "pioneer"})
            for model in models:
                r = reward + rng.normal(0, NOISE, len(u))
                k = kl * (1 + rng.normal(0, KL_NOISE, len(u)))
                alone += [{"task": TASK, "method": method, "seed": seed, "swept_kl_coef": None,
                           "iteration": int(i), "agent": model, "task_reward": float(a),
                           "kl": float(b), "combined_reward": float(a - KL_COEF * b),
                           "report_kl_coef": KL_COEF}
                          for i, a, b in zip(ITERATIONS, r, k)]
    return RunData(metrics, alone, window=1)


def verdicts(data: RunData) -> dict[str, str]:
    """The status of each claim, keyed by its number."""
    return {c.name.split(" ")[0]: c.status for c in cl.all_claims(data)}


# ------------------------------------------------------------------------------- rates
def rates(world: World, seeds: int, replicates: int, seed: int = 0) -> dict[str, dict]:
    """Per claim: the share of replicates supported and contradicted, the truth, and the false
    verdicts' rate (per direction)."""
    rng = np.random.default_rng([seed, seeds, sum(map(ord, world.name))])
    truth = truths(world)
    counts = {c: {vd.SUPPORTED: 0, vd.CONTRADICTED: 0} for c in CLAIMS}
    learned = dict.fromkeys(("ppo", "cory"), 0)
    for _ in range(replicates):
        data = records(world, seeds, rng)
        for c, status in verdicts(data).items():
            if status in counts.get(c, {}):
                counts[c][status] += 1
        gains = gather(data, TASK, None, list(learned)).gains
        for m in learned:
            learned[m] += gains[m].above(0)
    out = {"gate": {"truth": "true" if world.walk("ppo").learns else "false",
                    **{m: k / replicates for m, k in learned.items()}}}
    for c in CLAIMS:
        s, x = (counts[c][v] / replicates for v in (vd.SUPPORTED, vd.CONTRADICTED))
        false_s = s if truth[c] in ("false", "boundary", "untestable") else 0.0
        false_x = x if truth[c] in ("true", "boundary", "untestable") else 0.0
        out[c] = {"truth": truth[c], "supported": s, "contradicted": x,
                  "false_supported": false_s, "false_contradicted": false_x}
    return out


def table(results: dict, replicates: int) -> list[str]:
    """The calibration as markdown: a row per world and seed count, a cell per claim."""
    se = 0.5 / math.sqrt(replicates)
    lines = [f"Each claim's cell: supported / contradicted in % of {replicates} replicates (Monte "
             f"Carlo standard error at most {100 * se:.1g} points), the claim's truth in the "
             f"world in brackets; **bold** marks a false verdict's rate. *learned*: how often "
             f"the learning gate passed for PPO / CORY.", "",
             "| world | seeds | learned | " + " | ".join(CLAIMS) + " |",
             "|---|---|---|" + "---|" * len(CLAIMS)]
    for (name, seeds), per in results.items():
        g = per["gate"]
        gate = " / ".join(f"{100 * g[m]:.1f}" for m in ("ppo", "cory"))
        cells = [f"**{gate}**" if g["truth"] == "false" and max(g["ppo"], g["cory"]) else gate]
        for c in CLAIMS:
            r = per[c]
            s, x = (f"{100 * r[v]:.1f}" for v in ("supported", "contradicted"))
            s = f"**{s}**" if r["false_supported"] else s
            x = f"**{x}**" if r["false_contradicted"] else x
            cells.append(f"{s} / {x} ({r['truth']})")
        lines.append(f"| {name} | {seeds} | " + " | ".join(cells) + " |")
    return lines


def worst(results: dict) -> float:
    """The largest false-verdict rate in any direction (a passed gate in a world where no
    method learns counts as one)."""
    gate = [max(p["gate"]["ppo"], p["gate"]["cory"]) for p in results.values()
            if p["gate"]["truth"] == "false"]
    return max([max(r["false_supported"], r["false_contradicted"])
                for per in results.values() for c, r in per.items() if c != "gate"] + gate)


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.calibrate`: the verdict rates of every claim in every world."""
    p = cli.Parser("python -m benchmarks.calibrate", description=main.__doc__)
    p.add_argument("--replicates", type=int, default=400)
    p.add_argument("--seeds", default="3,5,10", help="seed counts, comma-separated")
    p.add_argument("--worlds", default="", help="names' prefixes, comma-separated (default all)")
    p.add_argument("--write", default="", help="also write one replicate's folder per world here")
    p.add_argument("--json", default="", help="also write the rates as JSON here")
    a = p.parse_args(argv)
    configure(restart=__name__ == "__main__")
    try:
        counts = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds takes whole numbers separated by commas, got {a.seeds!r}")
    if a.replicates < 1 or any(n < 1 for n in counts):
        p.error(f"--replicates and --seeds must be at least 1, got {a.replicates} and {a.seeds}")
    chosen = [w for w in WORLDS if not a.worlds or any(w.name.startswith(x)
                                                       for x in a.worlds.split(","))]
    if not chosen:
        p.error(f"no world starts with {a.worlds!r}; worlds: {[w.name for w in WORLDS]}")
    t0, results = time.perf_counter(), {}
    for w in chosen:
        for n in counts:
            results[(w.name, n)] = rates(w, n, a.replicates)
        if a.write:
            write_folder(Path(a.write) / w.name.replace(" ", "_"), records(
                w, counts[-1], np.random.default_rng(0)))
    print("\n".join(table(results, a.replicates)))
    print(f"\nlargest false-verdict rate: {100 * worst(results):.1f}% "
          f"({time.perf_counter() - t0:.0f} s)")
    if a.json:
        atomic_write(a.json, json.dumps({f"{k[0]}|{k[1]}": v for k, v in results.items()},
                                        indent=1))


def write_folder(folder: Path, data: RunData) -> None:
    """A replicate as a study folder (`python -m benchmarks.report FOLDER` renders it)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("metrics.jsonl", data.rows), ("alone.jsonl", data.evals)):
        atomic_write(folder / name, "".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
