"""Compare one method across study folders, e.g. chains of K = 2 and K = 3 agents.

    python -m benchmarks.compare runs/k2 runs/k3 --method cory [--task sentiment]
    python -m benchmarks.compare runs/a runs/b --same   # the same records, field for field?

For each folder it prints, with a 95% interval over seeds: the final alone reward of every
model, their mean and mean Σ KL, and the in-training reward of each chain position over the last
iterations (and the last position's, whatever K); then every later folder's difference from
the first, paired by seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.evidence.intervals import mean_interval
from benchmarks.evidence.records import RunData, curves, final_value, no_records, select
from cory_common import cli
from cory_common.runlog import read_jsonl
from cory_common.threads import configure


def per_seed(data: RunData, task: str, method: str) -> dict[str, dict[int, float]]:
    """Row name -> seed -> value: each model's and the mean final alone reward, and each
    position's final in-training task reward."""
    out: dict[str, dict[int, float]] = {}
    models = data.alone_agents(task, method, None)
    for model in models:
        out[f"alone reward, {model}"] = {s: float(t.reward[-1]) for s, t in
                                        data.trajectories(task, method, None, model).items()}
    if models:
        trajs = {m: data.trajectories(task, method, None, m) for m in models}
        seeds = set.intersection(*(set(t) for t in trajs.values()))
        for name, field in (("alone reward", "reward"), ("alone Σ KL", "kl")):
            out[f"{name}, mean of the models"] = {
                s: float(np.mean([getattr(trajs[m][s], field)[-1] for m in models]))
                for s in seeds}
    roles = data.roles(task, method)
    for role in roles:
        per = curves(data.rows, "task_reward", task=task, method=method, role=role)
        out[f"in training, {role}"] = {s: final_value(c, data.window) for s, c in per.items()}
    if len(roles) > 1:
        out["in training, last position"] = out[f"in training, {roles[-1]}"]
    return out


def lines(folders: Sequence[str], task: str, method: str) -> list[str]:
    """The comparison as markdown lines."""
    tables = []
    for folder in folders:
        data = RunData.load(folder)
        if not select(data.rows, task=task, method=method):
            raise ValueError(f"{folder} has no {method!r} run on {task!r}")
        tables.append(per_seed(data, task, method))
    out = []
    for folder, table in zip(folders, tables):
        out += [f"**{folder}** ({method}, {task})", ""]
        out += [f"- {name}: {mean_interval(list(v.values()))}" for name, v in table.items()]
        out.append("")
    first = tables[0]
    for folder, table in zip(folders[1:], tables[1:]):
        out += [f"**{folder} − {folders[0]}** (paired by seed)", ""]
        for name in (n for n in table if n in first):
            seeds = sorted(set(table[name]) & set(first[name]))
            diff = [table[name][s] - first[name][s] for s in seeds]
            out.append(f"- {name}: {mean_interval(diff)}")
        out.append("")
    return out


WALL_CLOCK = ("time_rollout_s", "time_update_s", "time_cpu_s")  # what reruns differ in
PROVENANCE = ("commit",)  # which code made a record, not what it holds: two commits compare


def same_records(a: str, b: str) -> tuple[bool, list[str]]:
    """Whether two study folders hold the same training and alone records field for field
    (wall-clock fields and the commit aside), with a line per file and the first difference."""
    ok, out = True, []
    for name in ("metrics.jsonl", "alone.jsonl"):
        ra, rb = (read_jsonl(Path(f) / name) for f in (a, b))
        clean = [[{k: v for k, v in r.items() if k not in WALL_CLOCK + PROVENANCE} for r in rows]
                 for rows in (ra, rb)]
        same = clean[0] == clean[1]
        fields = sum(map(len, clean[0]))
        out.append(f"{name}: {len(ra)} vs {len(rb)} records, {fields} fields: "
                   f"{'identical' if same else 'DIFFERENT'}")
        if not same:
            ok = False
            shared = min(map(len, clean))
            first = next((i for i, (x, y) in enumerate(zip(*clean)) if x != y), shared)
            if first < shared:
                x, y = clean[0][first], clean[1][first]
                diff = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
                out.append(f"  record {first + 1} differs in {diff[:8]}")
    return ok, out


def main(argv: list[str] | None = None) -> None:
    """Print the comparison of the study folders given on the command line."""
    p = cli.Parser("python -m benchmarks.compare", description=__doc__)
    p.add_argument("folders", nargs="+", help="study folders (the first is the baseline)")
    p.add_argument("--method", default="cory", help="the method to compare")
    p.add_argument("--task", default="sentiment", help="the task to compare")
    p.add_argument("--same", action="store_true",
                   help="check that two folders hold the same records (exit 1 if not)")
    args = p.parse_args(argv)
    configure()
    for folder in args.folders:
        if why := no_records(folder):
            p.error(why)
    if args.same:
        if len(args.folders) != 2:
            p.error(f"--same compares two folders, got {len(args.folders)}")
        try:
            ok, out = same_records(*args.folders)
        except ValueError as e:
            p.error(str(e))
        print("\n".join(out))
        raise SystemExit(0 if ok else 1)
    try:
        print("\n".join(lines(args.folders, args.task, args.method)))
    except ValueError as e:
        p.error(str(e))


if __name__ == "__main__":
    main()
