"""A study folder cannot be corrupted: one writer, a verified ledger, the code it ran, and bad
settings refused before anything is written."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from agents.llm.sampling import SAMPLER
from agents.training.config import TrainConfig
from benchmarks.evidence.records import no_records, read_jsonl
from benchmarks.run import main
from benchmarks.study import coordinator
from cory_common.runlog import FolderBusy, LedgerError, RunLock, code_identity, resume_ledger
from cory_env.data.tokenizer import task_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--tasks", "sentiment", "--methods", "ppo", "--seeds", "0", "--iterations", "3",
        "--batch-size", "4", "--mini-batch-size", "4", "--ppo-epochs", "1", "--max-new-tokens",
        "4", "--eval-every", "3", "--alone-queries", "4", "--final-window", "1", "--no-progress"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny random GPT-2 with the sentiment vocabulary."""
    path = tmp_path_factory.mktemp("lm") / "sentiment"
    tok = task_tokenizer("sentiment")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tok),
                               n_positions=128, eos_token_id=tok.eos_token_id,
                               bos_token_id=tok.eos_token_id)).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def partial(model, tmp_path_factory):
    """A study folder "killed" after 2 of 3 iterations (checkpoint at 2)."""
    out = tmp_path_factory.mktemp("runs") / "partial"
    from benchmarks.run import build_parser, config_from_args

    cfg, _, _ = config_from_args(build_parser().parse_args(
        ARGS + ["--model", model, "--out", str(out)]))
    coordinator.run_benchmark(cfg, out, progress=False, stop_after=2)
    return out


def copy(folder, tmp_path):
    """A private copy of a study folder."""
    return shutil.copytree(folder, tmp_path / "run")


def holder(folder):
    """Another process that holds the folder's lock until killed."""
    code = ("import sys, time; from cory_common.runlog import RunLock; "
            "k = RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


# ------------------------------------------------------------------------------- one writer
def test_a_second_writer_is_refused_and_told_who_holds_the_folder(partial, tmp_path, capsys):
    run = copy(partial, tmp_path)
    before = (run / "metrics.jsonl").read_bytes()
    proc = holder(run)
    try:
        with pytest.raises(SystemExit) as exit_:  # --resume while the run is alive
            main(["--resume", "--out", str(run), "--no-progress"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"in use by process {proc.pid}" in err and str(run) in err
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        proc2 = holder(fresh)  # two fresh runs on one folder: the second is refused
        try:
            with pytest.raises(SystemExit):
                main(ARGS + ["--model", "unused", "--out", str(fresh)])
        finally:
            proc2.kill()
            proc2.wait()
        assert not (fresh / "run_config.json").exists()
    finally:
        proc.send_signal(signal.SIGKILL)  # a killed holder never leaves a stale lock
        proc.wait()
    assert (run / "metrics.jsonl").read_bytes() == before
    RunLock(run).acquire().release()


def test_distributed_refuses_a_fresh_run_on_a_used_folder_and_resume_without_out(tmp_path):
    from agents.distributed.__main__ import parse_args

    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0}\n')
    with pytest.raises(SystemExit):
        parse_args(["--task", "sentiment", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        parse_args(["--task", "sentiment", "--resume"])
    assert (tmp_path / "metrics.jsonl").read_text() == '{"iteration": 0}\n'


# ------------------------------------------------------------------------------- the ledger
def ledger_file(tmp_path, lines):
    """A metrics file of the given lines."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_records_read_from_a_gzipped_copy_equal_the_plain_file(tmp_path):
    lines = [json.dumps({"run": "a", "iteration": i, "reward": i / 3}) for i in range(3)]
    plain = ledger_file(tmp_path, lines)
    records = read_jsonl(plain)
    packed = tmp_path / "packed" / "metrics.jsonl"
    packed.parent.mkdir()
    packed.with_name("metrics.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    assert len(records) == 3 and read_jsonl(packed) == records
    assert no_records(packed.parent) is None  # a folder of gzipped records is a study folder
    packed.write_text(lines[0] + "\n")  # the plain file, where both are, is the one read
    assert read_jsonl(packed) == records[:1]


BROKEN = {  # file -> (what it is replaced by or gets appended, what the error must name)
    "metrics.jsonl": ('{"a": 1}\n', r"metrics.jsonl: record 1 is not a run record, it lacks "
                                     r"task, method, seed, iteration: \{\"a\": 1\}"),
    "alone.jsonl": (None, r"alone.jsonl: record \d+ is not a run record, it lacks agent"),
    "run_config.json": ("[1, 2", r"run_config.json is not valid JSON"),
    "mechanism.json": ("[]", r"mechanism.json holds a list, not a JSON object"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_report_names_a_broken_file_of_its_folder_and_writes_nothing(tmp_path, name):
    """`benchmarks.report` on a folder with a file that is not what a run writes: an error
    naming the file and what is wrong with it, and the folder left byte for byte."""
    from benchmarks.report import markdown

    folder = tmp_path / "tiny"
    shutil.copytree(Path(ROOT) / "docs/fidelity/tiny", folder)
    text, message = BROKEN[name]
    if text is None:  # an alone record without its agent
        record = json.loads((folder / name).read_text().splitlines()[-1])
        del record["agent"]
        text = (folder / name).read_text() + json.dumps(record) + "\n"
    (folder / name).write_text(text)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit, match=message):
        markdown.main([str(folder)])
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_a_resume_into_gzipped_records_is_refused_by_name_and_changes_nothing(partial,
                                                                             tmp_path, capsys):
    run = copy(partial, tmp_path)
    plain = run / "metrics.jsonl"
    packed = run / "metrics.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit):
        main(["--resume", "--out", str(run), "--no-progress"])
    err = capsys.readouterr().err
    assert f"{packed} is gzipped" in err and f"gunzip {packed}" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    plain.write_bytes(gzip.decompress(packed.read_bytes()))  # gunzip, and the resume goes on
    packed.unlink()
    main(["--resume", "--out", str(run), "--no-progress"])
    assert max(r["iteration"] for r in read_jsonl(plain)) == 2


def test_resume_keeps_every_line_before_the_checkpoint_and_drops_only_what_follows(tmp_path):
    rec = lambda run, it, **kw: json.dumps({"run": run, "iteration": it, **kw})  # noqa: E731
    lines = [rec("a", 0), rec("b", 0), rec("a", 1, note="checked by hand"), rec("a", 2),
             rec("a", 3)]
    path = ledger_file(tmp_path, lines)
    with open(path, "a") as f:
        f.write('{"run": "a", "iter')  # torn by a kill
    assert resume_ledger(path, {"run": "a"}, 2) == 3
    assert path.read_text() == "".join(line + "\n" for line in lines[:3])


@pytest.mark.parametrize("edit, message", [
    (lambda ls: [ls[0] + "  # checked", *ls[1:]], "line 1: not a JSON record"),
    (lambda ls: [ls[0], ls[2], ls[3]], r"lack iteration\(s\) 1 before the checkpoint"),
    (lambda ls: [ls[0].replace('"iteration": 0', '"iteration": "0"'), *ls[1:]],
     'line 1: "iteration" must be an integer'),
    (lambda ls: [ls[1], ls[0], *ls[2:]], "out of order"),
])
def test_resume_refuses_records_it_cannot_trust_and_changes_nothing(tmp_path, edit, message):
    lines = [json.dumps({"run": "a", "iteration": i}) for i in range(4)]
    path = ledger_file(tmp_path, edit(lines))
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=message) as err:
        resume_ledger(path, {"run": "a"}, 3)
    assert str(path) in str(err.value) and path.read_bytes() == before


def test_a_benchmark_resume_with_a_hand_edited_record_is_refused(partial, tmp_path, capsys):
    run = copy(partial, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0] + " <- odd", *lines[1:]]) + "\n")
    before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(SystemExit):
        main(["--resume", "--out", str(run), "--no-progress"])
    assert "metrics.jsonl, line 1" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_bytes() == before


# ------------------------------------------------------------------------------- files, code
def test_resume_removes_orphans_and_every_file_honours_the_umask(partial, tmp_path):
    run = copy(partial, tmp_path)
    orphan = run / "ckpt" / ".reviews.pt.ab12cd.tmp"
    orphan.write_bytes(b"half a checkpoint")
    old = os.umask(0o027)
    try:
        main(["--resume", "--out", str(run), "--no-progress"])
    finally:
        os.umask(old)
    assert not orphan.exists() and "interrupted save" in (run / "log.txt").read_text()
    fresh = tmp_path / "fresh"
    old = os.umask(0o022)
    try:
        main(ARGS + ["--model", json.loads((run / "run_config.json").read_text())["train"]
                     ["model"], "--out", str(fresh)])
    finally:
        os.umask(old)
    modes = {p.relative_to(fresh).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in fresh.rglob("*") if p.is_file() and "tb" not in p.parts}
    for name in ("run_config.json", "metrics.csv", "metrics.jsonl", "log.txt", "report.md",
                 "mechanism.json", "alone.jsonl"):
        assert modes[name] == 0o644, (name, oct(modes[name]))
    assert set(modes.values()) == {0o644}, modes


def test_an_edited_plugin_refuses_resume_unless_allowed(model, tmp_path, capsys):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text("VALUE = 1\n")
    run = tmp_path / "run"
    from benchmarks.run import build_parser, config_from_args

    cfg, _, _ = config_from_args(build_parser().parse_args(
        ARGS + ["--model", model, "--import", str(plugin), "--out", str(run)]))
    coordinator.run_benchmark(cfg, run, progress=False, stop_after=1)
    saved = json.loads((run / "run_config.json").read_text())["code"]
    assert saved["imports"][str(plugin)]["sha256"]
    plugin.write_text("VALUE = 2\n")
    with pytest.raises(SystemExit):
        main(["--resume", "--out", str(run), "--no-progress"])
    err = capsys.readouterr().err
    assert "my_plugin.py" in err and "changed since the run started" in err
    assert not (run / "done").exists()
    main(["--resume", "--out", str(run), "--no-progress", "--allow-changed-code"])
    assert "resumed with changed code" in (run / "log.txt").read_text()


def test_a_failed_start_leaves_no_folder_and_the_same_command_then_works(model, tmp_path,
                                                                          monkeypatch, capsys):
    out = tmp_path / "run"

    def broken(cfg):
        raise RuntimeError("the model could not load")

    import benchmarks.study.worker

    monkeypatch.setattr(benchmarks.study.worker, "Trainer", broken)
    with pytest.raises(SystemExit) as exit_:
        main(ARGS + ["--model", model, "--out", str(out)])
    assert exit_.value.code == 1 and "could not load" in capsys.readouterr().err
    assert not out.exists()
    monkeypatch.undo()
    main(ARGS + ["--model", model, "--out", str(out)])
    assert (out / "report.md").exists()


# ------------------------------------------------------------------------------- settings
def folder_with(tmp_path, name, config=None, files=None):
    """A model folder holding a config.json and the given files (by default an empty, valid
    model.safetensors: the folder then looks like a model)."""
    from safetensors.torch import save_file

    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config or {"model_type": "gpt2", "n_embd": 16,
                                                            "n_head": 2, "n_positions": 64}))
    if files is None:
        save_file({"h.0.ln_1.weight": torch.zeros(16)}, str(path / "model.safetensors"))
    for fname, data in (files or {}).items():
        (path / fname).write_bytes(data)
    return str(path)


def test_bad_settings_are_refused_by_name_before_anything_loads(tmp_path):
    from safetensors.torch import save_file

    def refused(match, **kw):
        with pytest.raises(ValueError, match=match):
            TrainConfig(**kw).validate()

    refused(r"seed must be an integer in \[0, 4294967296\), got -1", seed=-1)
    refused(r"models\['llm_1'\] must be a model name or folder.*5", method="cory",
            models={"llm_1": 5})
    refused(r"adapters\['llm_0'\] must be .*3.5", method="cory", shared_base=True,
            adapters={"llm_0": 3.5})
    refused(r"max_new_tokens=100000 must be below", max_new_tokens=100000)
    refused(r"option n_queries='many' must be int", task="reviews",
            task_options={"n_queries": "many"})
    small = folder_with(tmp_path, "small")
    refused(r"64 positions.*n_agents=30", model=small, method="cory", n_agents=30,
            max_new_tokens=8)
    broken = folder_with(tmp_path, "broken", files={"model.safetensors": b"\xff" * 64})
    refused(r"broken.*model.safetensors cannot be read", model=broken)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file({"base_model.model.h.0.attn.c_attn.lora_A.weight": torch.zeros(4, 999)},
              str(adapter / "adapter_model.safetensors"))
    refused(r"adapter.*does not fit the base model.*999", model=small, method="cory",
            shared_base=True, adapters={"llm_0": str(adapter), "llm_1": str(adapter)})


def test_env_seed_and_plugin_reward_errors_say_what_to_fix():
    import cory_env
    from cory_env.core import safe_reward

    env = cory_env.env(task="sentiment")
    with pytest.raises(TypeError, match=r"reset\(seed=...\) must be a non-negative integer.*'a'"):
        env.reset(seed="a")

    class Bad:
        name = "mine"

        def __init__(self, out):
            self.out = out

        def reward(self, queries, texts):
            return self.out

    texts = ["a", "b", "c", "d"]
    for out, got in ((None, "NoneType"), ([None] * 4, "list of length 4 with None"),
                     ([1.0], "list of length 1"), (np.zeros((2, 2)), "ndarray of length 2")):
        with pytest.raises(RuntimeError) as err:
            safe_reward(Bad(out), [None] * 4, texts)
        text = str(err.value)
        assert "'mine'" in text and got in text and "expected a sequence of 4 finite" in text


def test_distributed_records_its_code_and_refuses_a_changed_plugin(tmp_path):
    from argparse import Namespace

    from agents.distributed.__main__ import check_code

    plugin = tmp_path / "p.py"
    plugin.write_text("A = 1\n")
    out = tmp_path / "run"
    out.mkdir()
    args = Namespace(out=str(out), imports=[str(plugin)], resume=False, allow_changed_code=False)
    assert check_code(args) == "" and (out / "code.json").exists()
    plugin.write_text("A = 2\n")
    args.resume = True
    assert "p.py" in check_code(args) and "changed since the run started" in check_code(args)
    args.allow_changed_code = True
    assert check_code(args) == "" and "changed_code" in (out / "changes.jsonl").read_text()


def test_a_run_folder_records_the_commit_of_the_checkout_it_ran_from():
    """run_config.json's code identity names the git commit when the package runs from a
    checkout (a clone or a worktree), so a published folder says which code made it, and
    "-dirty" when tracked files differ from that commit."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True,  # noqa
                                    text=True).stdout.strip()
    head, changed = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    assert head and code_identity()["commit"] == head + ("-dirty" if changed else "")


# ------------------------------------------------------------------------------- merging
def _run(model, out, *extra):
    """A finished tiny study folder (ARGS with `extra` options) at `out`."""
    main(ARGS + ["--model", model, "--out", str(out), *extra])
    return out


def _numbers(folder, name):
    """A folder's records as sorted JSON texts, timings left out."""
    rows = [json.loads(line) for line in (folder / name).read_text().splitlines() if line]
    return sorted(json.dumps({k: v for k, v in r.items() if not k.startswith("time_")},
                             sort_keys=True) for r in rows)


@pytest.fixture(scope="module")
def halves(model, tmp_path_factory):
    """Seed 0 and seed 1 of one setting in two folders, and both seeds in one folder."""
    root = tmp_path_factory.mktemp("halves")
    return (_run(model, root / "a"), _run(model, root / "b", "--seeds", "1"),
            _run(model, root / "both", "--seeds", "0,1"))


def test_every_record_names_what_made_its_draws(halves):
    """Each alone record carries the commit and the draws' makers (decode path, sampler,
    torch), so folders whose draws differ are never read as one arm without a flag."""
    evals = [json.loads(x) for x in (halves[0] / "alone.jsonl").read_text().splitlines() if x]
    assert evals and {e["draws"] for e in evals} == {
        f"decode exact, {SAMPLER}, torch {torch.__version__}"}
    assert all(e["commit"] for e in evals)


def test_merged_folders_equal_one_folder_that_ran_every_run(halves, tmp_path):
    from benchmarks.merge import merge

    a, b, both = halves
    out = tmp_path / "merged"
    assert sorted(merge(out, [a, b])) == ["sentiment-ppo-seed0", "sentiment-ppo-seed1"]
    for name in ("metrics.jsonl", "alone.jsonl"):
        assert _numbers(out, name) == _numbers(both, name)
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["seeds"] == [0, 1] and saved["methods"] == ["ppo"]
    assert sorted(p.name for p in (out / "done").iterdir()) == sorted(
        p.name for p in (both / "done").iterdir())
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == [
        "sentiment-ppo-seed0.pt", "sentiment-ppo-seed1.pt"]
    log = (out / "log.txt").read_text()
    assert f"merged from {a}" in log and f"merged from {b}" in log
    rows = len((out / "metrics.jsonl").read_text().splitlines())
    main(["--resume", "--out", str(out), "--no-progress"])  # nothing left to run
    assert len((out / "metrics.jsonl").read_text().splitlines()) == rows
    assert (out / "report.md").exists()
    assert not [p for p in tmp_path.iterdir() if p.name != "merged"]  # no temporary left


def test_merge_takes_finished_runs_only_and_resume_runs_the_rest(halves, partial, tmp_path):
    from benchmarks.merge import merge

    _, b, _ = halves
    out = tmp_path / "merged"
    assert list(merge(out, [partial, b])) == ["sentiment-ppo-seed1"]
    assert "not merged from" in (out / "log.txt").read_text()
    assert {json.loads(line)["run"] for line in (out / "metrics.jsonl").read_text().splitlines()
            } == {"sentiment-ppo-seed1"}
    main(["--resume", "--out", str(out), "--no-progress"])  # seed 0 runs here, whole
    assert sorted(p.name for p in (out / "done").iterdir()) == [
        "sentiment-ppo-seed0", "sentiment-ppo-seed1"]


@pytest.mark.parametrize("case, message", [
    ("setting", "differs from"), ("twice", "finished in both"), ("out", "already exists"),
    ("empty", "holds no run"), ("code", "ran other code")])
def test_merge_refuses_what_would_mix_two_studies_and_writes_nothing(halves, tmp_path, case,
                                                                     message, capsys):
    from benchmarks.merge import main as merge_main

    a, b, _ = halves
    other, out = shutil.copytree(b, tmp_path / "other"), tmp_path / "merged"
    cfg = json.loads((other / "run_config.json").read_text())
    if case == "setting":
        cfg["train"]["ppo"]["lr"] *= 2
    if case == "code":
        cfg["code"]["imports"] = {"plugin.py": {"path": "plugin.py", "sha256": "0" * 64}}
    (other / "run_config.json").write_text(json.dumps(cfg))
    sources = {"twice": [a, a.parent / "both"], "empty": [a, tmp_path / "nothing"]}.get(
        case, [a, other])
    (tmp_path / "nothing").mkdir()
    if case == "out":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as stop:
        merge_main([*map(str, sources), "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    if case == "setting":
        assert "lr" in err and str(other) in err
    assert (list(out.iterdir()) == [out / "keep.txt"]) if case == "out" else not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["other", "nothing"] + (["merged"] if case == "out" else []))


def test_merge_refuses_a_folder_in_use(halves, tmp_path):
    from benchmarks.merge import merge

    a, b, _ = halves
    with RunLock(b):
        with pytest.raises(FolderBusy, match="in use"):
            merge(tmp_path / "merged", [a, b])
    assert not (tmp_path / "merged").exists()
