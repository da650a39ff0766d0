"""How a mechanism measurement is read: its summaries, verdict and report lines, where it is
saved, the budget it was made at, and the merge of measurements made on disjoint seeds.

The measurements themselves (models answering held-out queries) are `benchmarks.mechanism.measure`;
everything here works on their saved dicts, without a model.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from agents.training.config import TrainConfig
from benchmarks.evidence.intervals import Interval, Ratio, mean_interval, ratio_interval

PRESENT, WEAK = 0.5, 0.3  # cross-role transfer: present >= 0.5, absent < 0.3
PROMPTS = ("full", "empty_answer", "plain")  # the knowledge-transfer split's three prompts


def kt_summary(rows: list[dict]) -> dict:
    """Per-seed rows as the split: what the answer, the instruction and both are worth."""
    full, empty, plain = (np.array([r[k] for r in rows]) for k in PROMPTS)
    return {"per_seed": {k: [r[k] for r in rows] for k in PROMPTS},
            "from_answer": _iv(full - empty), "from_instruction": _iv(empty - plain),
            "total": _iv(full - plain)}


def _iv(values) -> dict:
    """An interval as a JSON-able dict."""
    return asdict(mean_interval([float(v) for v in values]))


def _gains(rows: list[dict], now: str, base: str) -> list[float]:
    """Per-seed gains rows[now] − rows[base]."""
    return [r[now] - r[base] for r in rows]


def cross_role_summary(rows: list[dict]) -> dict:
    """The gains with their intervals and both transfers as ratios of mean gains (Fieller)."""
    ppo = _gains(rows, "alone_ppo", "alone_base")
    obs_alone = _gains(rows, "alone_observer_only", "alone_base")
    pio_obs = _gains(rows, "observer_pioneer_only", "observer_base")
    obs_obs = _gains(rows, "observer_observer_only", "observer_base")
    return {"ratio": asdict(ratio_interval(obs_alone, ppo)),
            "reverse": asdict(ratio_interval(pio_obs, obs_obs)),
            "gain_alone_ppo": _iv(ppo), "gain_alone_observer_only": _iv(obs_alone),
            "gain_as_observer_pioneer_only": _iv(pio_obs),
            "gain_as_observer_observer_only": _iv(obs_obs)}


def summarize(result: dict) -> dict:
    """The cross-role figures recomputed from the saved per-seed rows (a file written under
    older rules gets today's), with the verdict and the ratio as text."""
    cr = result["cross_role"]
    rows = cr.get("per_seed", [])
    keys = ("alone_base", "alone_ppo", "alone_observer_only", "observer_base",
            "observer_pioneer_only", "observer_observer_only")
    fresh = cross_role_summary(rows) if rows and all(k in r for r in rows for k in keys) else cr
    out = {**cr, **fresh, "ratio": _as_ratio(fresh["ratio"]),
           "reverse": _as_ratio(fresh.get("reverse", fresh["ratio"]))}
    out["verdict"] = verdict(out)
    out["ratio_text"] = str(Ratio(**out["ratio"]))
    return out


def _as_ratio(saved: dict) -> dict:
    """A saved ratio as Ratio fields (older files saved an interval of per-seed ratios)."""
    if "value" in saved:
        return saved
    low, high = saved.get("low", math.nan), saved.get("high", math.nan)
    return asdict(Ratio(saved["mean"], low, high, saved.get("n", 0),
                        math.isfinite(low) and math.isfinite(high)))


def verdict(result: dict) -> str:
    """present / weak / absent / inconclusive from the transfer's interval, or undefined when
    PPO's model does not learn measurably (there is no skill to carry over). Takes a whole
    measurement or its summarised `cross_role` part."""
    if "cross_role" in result:
        return summarize(result)["verdict"]
    ppo, r = result.get("gain_alone_ppo"), _as_ratio(result["ratio"])
    if ppo is not None and not (ppo["n"] >= 2 and ppo["low"] > 0) or not r["bounded"]:
        return "undefined"
    if r["low"] >= PRESENT:
        return "present"
    if r["high"] < WEAK:
        return "absent"
    if r["low"] > 0 and r["high"] < PRESENT:
        return "weak"
    return "inconclusive"


def transfer_file(folder: str | Path, task: str) -> Path:
    """Where a folder (a named model's, or a study folder) holds a measurement on `task`."""
    return Path(folder) / f"transfer-{task}.json"


def training_budget(cfg: TrainConfig) -> dict:
    """The training budget a cross-role measurement is made at (recorded in its result)."""
    return {"iterations": cfg.iterations, "batch_size": cfg.batch_size, "lr": cfg.ppo.lr,
            "kl_penalty": cfg.ppo.kl.penalty, "lora": cfg.lora is not None,
            "mixed_precision": cfg.mixed_precision}


def budget_differences(measured: dict, run: dict) -> list[str]:
    """'lora: measured True, run False' for each field of a measurement's budget that differs
    from a run's (a field the measurement does not record is not compared)."""
    return [f"{k}: measured {measured[k]!r}, run {run[k]!r}" for k in run
            if k in measured and measured[k] != run[k]]


def merge_transfers(parts: list[dict], names: list[str] | None = None) -> dict:
    """One measurement from several made at one budget on disjoint seeds (every seed's rows
    are measured on their own, so the merge equals measuring all the seeds at once); a
    ValueError names the part whose task, model, queries, budget or seeds do not fit."""
    names = names or [f"part {i}" for i in range(len(parts))]
    if not parts:
        raise ValueError("nothing to merge: give at least one measurement")
    first, owner, kt_rows, rows, trained = parts[0], {}, [], [], []
    for name, part in zip(names, parts):
        for key in ("task", "model", "queries", "budget"):
            if part.get(key) != first.get(key):
                raise ValueError(f"{name} has {key} {part.get(key)!r}, {names[0]} "
                                 f"{first.get(key)!r}: not one measurement")
        if ("trained_from" in part) != ("trained_from" in first):
            raise ValueError(f"{name} and {names[0]} differ in where their models come from "
                             f"(finished runs' checkpoints or trained by the measurement)")
        per_seed = part["cross_role"].get("per_seed") or []
        if [r.get("seed") for r in per_seed] != list(part["seeds"]):
            raise ValueError(f"{name} has no per-seed rows for its seeds {part['seeds']}")
        kt = part["knowledge_transfer"]["per_seed"]
        for i, (seed, row) in enumerate(zip(part["seeds"], per_seed)):
            if seed in owner:
                raise ValueError(f"seed {seed} is in both {owner[seed]} and {name}")
            owner[seed] = name
            kt_rows.append((seed, {k: kt[k][i] for k in PROMPTS}))
            rows.append(row)
            trained += [part["trained_from"][i]] if "trained_from" in part else []
    order = sorted(range(len(rows)), key=lambda i: rows[i]["seed"])
    rows = [rows[i] for i in order]
    out = {key: first[key] for key in ("task", "model") if key in first}
    out.update(seeds=[r["seed"] for r in rows], queries=first["queries"],
               budget=first["budget"],
               knowledge_transfer=kt_summary([kt_rows[i][1] for i in order]))
    if trained:
        out["trained_from"] = [trained[i] for i in order]
    out["cross_role"] = {"per_seed": rows, **cross_role_summary(rows)}
    out["verdict"] = summarize(out)["verdict"]
    out["seconds"] = sum(part.get("seconds", 0.0) for part in parts)
    out["merged_from"] = list(names)
    return out


def saved_transfer(path: str | Path) -> dict | None:
    """A model folder's transfer.json, if measured."""
    f = Path(path) / "transfer.json"
    return json.loads(f.read_text()) if f.exists() else None


def _fmt(iv: dict) -> str:
    """An interval dict as text."""
    return str(Interval(**iv))


MEANING = {
    "present": "the mechanism is present: most of what a model learns as observer carries over "
               "to answering alone",
    "weak": "the mechanism is weak: part, but less than half, of what a model learns as "
            "observer carries over; read every verdict against it",
    "absent": "the mechanism is absent: little of what a model learns as observer carries over "
              "to answering alone; the paper's claims are still tested below as outcomes, but "
              "the paper's explanation for them (knowledge transfer) does not hold on this "
              "model",
    "inconclusive": "the transfer's interval straddles a threshold: the seeds cannot tell how "
                    "much carries over",
    "undefined": "PPO's model does not learn measurably at this budget, so there is no skill "
                 "to carry over and the mechanism cannot be read at this budget",
}


def _weights(budget: dict) -> str:
    """', LoRA' or ', every weight' where the budget records it."""
    return "" if "lora" not in budget else ", LoRA" if budget["lora"] else ", every weight"


def format_transfer(r: dict) -> list[str]:
    """Report lines: both transfers with their intervals and what they mean."""
    kt, cr = r["knowledge_transfer"], summarize(r)
    b = r["budget"]
    return [
        f"- **Knowledge transfer** (untrained observer, {r['queries']} held-out queries, "
        f"{len(r['seeds'])} seeds): the pioneer's answer is worth {_fmt(kt['from_answer'])} "
        f"reward; the instruction alone {_fmt(kt['from_instruction'])}; both "
        f"{_fmt(kt['total'])}.",
        f"- **Cross-role transfer** ({b['iterations']} iterations × {b['batch_size']} episodes, "
        f"lr {b['lr']:g}{_weights(b)}"
        f"{', read from finished runs' if r.get('trained_from') else ''}): "
        f"answering alone, an observer-only-trained model gains "
        f"{_fmt(cr['gain_alone_observer_only'])} reward over the base and PPO's model "
        f"{_fmt(cr['gain_alone_ppo'])}; the share that carries over (ratio of the mean gains, "
        f"Fieller) is {cr['ratio_text']}.",
        f"- **The reverse**: as observer of the base model, a pioneer-only-trained model gains "
        f"{_fmt(cr['gain_as_observer_pioneer_only'])} and the observer-only one "
        f"{_fmt(cr['gain_as_observer_observer_only'])} (ratio {Ratio(**cr['reverse'])}).",
        f"- **Verdict: {cr['verdict']}** — {MEANING[cr['verdict']]}.",
    ]
