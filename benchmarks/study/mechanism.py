"""A study folder's mechanism.json: the model's knowledge and cross-role transfer per task,
measured once per offline reference LM, or taken from a measurement at the run's budget."""

from __future__ import annotations

import json
from pathlib import Path

from agents.refmodels import reference_lm
from agents.training.config import TrainConfig
from benchmarks.evidence.transfer import (
    budget_differences,
    saved_transfer,
    training_budget,
    transfer_file,
)
from benchmarks.mechanism.measure import measure_transfer
from benchmarks.settings.config import BenchConfig, RunSpec, train_config
from benchmarks.study.folder import StudyFolder
from cory_common.files import atomic_write
from cory_common.pretrained import resolve_model
from cory_env import offline_model


def mechanism(cfg: BenchConfig, folder: StudyFolder, tasks: list[str] | None = None) -> dict:
    """Per task (default: every task of cfg), the model's knowledge and cross-role transfer
    (`benchmarks.mechanism.measure`): measured once per offline reference LM (about 4 minutes,
    then cached in its folder)."""
    out = {}
    for task in cfg.tasks if tasks is None else tasks:
        model = cfg.model_for(task)
        if model is not None or offline_model(task) is None:
            out[task] = saved_mechanism(cfg, folder, task)
            continue
        path = reference_lm(offline_model(task))
        saved = saved_transfer(path)
        if saved is None and cfg.quick:
            out[task] = {"not_measured": f"a quick run does not measure it (python -m "
                                         f"benchmarks.mechanism --measure {task})"}
            continue
        if saved is None:
            folder.log(f"{task}: measuring the model's knowledge and cross-role transfer")
            saved = measure_transfer(task, cfg=TrainConfig(device=cfg.train.device),
                                     progress=folder.log)
        out[task] = saved
    return out


def refresh_mechanism(cfg: BenchConfig, folder: StudyFolder) -> None:
    """Write the folder's mechanism.json once; on resume, fill in a task "not measured" before
    whose measurement has since been saved (in the folder or beside its model), or say anew why
    it is still not, and follow a new measurement saved in the folder itself."""
    if not folder.mechanism.exists():
        atomic_write(folder.mechanism, json.dumps(mechanism(cfg, folder), indent=2))
        return
    old = json.loads(folder.mechanism.read_text())
    missing = [t for t, m in old.items() if "not_measured" in m]
    own = [t for t in old if t not in missing and transfer_file(folder.path, t).exists()]
    fresh = mechanism(cfg, folder, missing + own) if missing or own else {}
    changed = {t: m for t, m in fresh.items()
               if m != old[t] and (t in missing or "not_measured" not in m)}
    filled = [t for t, m in changed.items() if "not_measured" not in m]
    if filled:
        folder.log("mechanism.json: filled in " + ", ".join(filled))
    if changed:
        atomic_write(folder.mechanism, json.dumps({**old, **changed}, indent=2))


def saved_mechanism(cfg: BenchConfig, folder: StudyFolder, task: str) -> dict:
    """A measurement of a named model at this run's budget: the study folder's
    transfer-<task>.json, else the one `benchmarks.mechanism --measure` saved beside the model;
    one at another budget (LoRA or not, lr, iterations, ...) is not used, and the answer says
    why (and how to measure it from what this folder has)."""
    model = cfg.model_for(task)
    run = training_budget(train_config(cfg, RunSpec(task, "ppo", cfg.seeds[0])))
    own = transfer_file(folder.path, task)
    beside = resolve_model(model) if model else None
    files = [own] + ([transfer_file(beside, task)] if beside and Path(beside).is_dir() else [])
    other = []
    for file in (f for f in files if f.exists()):
        measured = json.loads(file.read_text())
        differ = budget_differences(measured.get("budget", {}), run)
        if not differ:
            return measured
        other.append(f"{file} was measured at another budget ({'; '.join(differ)})")
    has = {m for m in ("ppo", "cory-no-re") if m in cfg.methods}
    if has == {"ppo", "cory-no-re"}:
        how = (f"measure it at this run's budget with python -m benchmarks.mechanism --measure "
               f"{task} --ppo-checkpoints ... --observer-only-checkpoints ... (this folder's ppo "
               f"and cory-no-re checkpoints) --out {own}, then --resume")
    else:
        grown = ",".join([*cfg.methods, *sorted({"ppo", "cory-no-re"} - has)])
        how = (f"measure it at this run's budget with python -m benchmarks.mechanism --measure "
               f"{task} --out {own} (it trains ppo and cory-no-re at this budget), or run them "
               f"here first (--resume --methods {grown}) and read their checkpoints "
               f"(--ppo-checkpoints, --observer-only-checkpoints), then --resume")
    return {"not_measured": "; ".join(other + [how]) if other else
            f"the model is not an offline reference LM; {how}"}
