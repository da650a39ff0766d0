"""The benchmark CLI: files it writes, the report's numbers and claims, resume, bad values."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch
from helpers import mechanism_measurement
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import benchmarks
import benchmarks.study.worker
import cory_env
from benchmarks import StudyFolder, resolve_config, run_benchmark
from benchmarks.evidence import claims as cl
from benchmarks.evidence import records as rec
from benchmarks.run import build_parser, config_from_args, main
from cory_env.data.tokenizer import task_tokenizer

TASKS = ("sentiment", "arithmetic")
TINY = ["--iterations", "2", "--batch-size", "4", "--mini-batch-size", "4", "--ppo-epochs", "1",
        "--max-new-tokens", "5", "--eval-problems", "2", "--eval-samples", "2", "--pass-k", "2",
        "--final-window", "1", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """Tiny random GPT-2s, one per offline task, with that task's vocabulary; '{task}' path."""
    root = tmp_path_factory.mktemp("tinylm")
    for task in TASKS:
        tok = task_tokenizer(task)
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tok), n_positions=256,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
        GPT2LMHeadModel(cfg).save_pretrained(root / task)
    return str(root / "{task}")


def numbers(rows):
    """Records without wall-clock timings, for exact comparison."""
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]


# ------------------------------------------------------------------------------- end to end
def test_quick_run_writes_metrics_tensorboard_plots_and_report(tiny_lm, tmp_path):
    out = tmp_path / "run"
    report = main(["--quick", "--model", tiny_lm, "--out", str(out), *TINY,
                   "--tasks", "sentiment,arithmetic"])
    rows = rec.read_jsonl(out / "metrics.jsonl")
    # 2 tasks x (ppo: 1 agent + cory: 2 agents) x 2 iterations
    assert len(rows) == 12
    assert {(r["task"], r["method"], r["agent"]) for r in rows} == {
        (t, m, a) for t in TASKS for m, a in [("ppo", "llm_0"), ("cory", "llm_0"),
                                              ("cory", "llm_1")]}
    assert all(isinstance(r["task_reward"], float) and isinstance(r["samples"], list)
               for r in rows)
    assert all("copy_rate" in r for r in rows if r["method"] == "cory" and r["role"] == "observer")
    with open(out / "metrics.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 12 and {"task_reward", "kl", "combined_reward"} <= set(table[0])
    runs = sorted(p.name for p in (out / "tb").iterdir())
    assert runs == sorted(f"{t}-{m}-seed0" for t in TASKS for m in ("ppo", "cory"))
    assert all(any(f.name.startswith("events.out.tfevents") for f in (out / "tb" / r).iterdir())
               for r in runs)
    for task in TASKS:
        for kind in ("curves", "alone", "frontier"):
            png = out / "plots" / f"{kind}_{task}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    alone = rec.read_jsonl(out / "alone.jsonl")  # every model alone at iterations 0, 1, 2
    assert {(e["task"], e["method"], e["agent"], e["iteration"]) for e in alone} == {
        (t, m, a, i) for t in TASKS for m, a in [("ppo", "llm_0"), ("cory", "llm_0"),
                                                 ("cory", "llm_1")] for i in (0, 1, 2)}
    maths = [e for e in alone if e["task"] == "arithmetic"]
    assert all(0 <= e["pass@1"] <= e["pass@k"] <= 1 for e in maths)
    assert all(("greedy" in e) == (e["iteration"] == 2) for e in maths)
    text = report.read_text()
    for line in ("| ppo | llm_0 |", "| cory | llm_0 |", "| cory | llm_1 |",
                 "| cory | pioneer |", "### Contribution audit", "Test-split pass@k",
                 "| base | – |", "Every model answering alone"):
        assert line in text, line
    # the mechanism section comes first; a model of the user's own is not measured
    assert text.index("CORY's mechanism?") < text.index("## The paper's claims")
    assert "not an offline reference LM" in text
    claims = [ln for ln in text.splitlines() if ln.startswith("- **(")]
    from benchmarks.report.summary import shared_reasons

    shared, said = shared_reasons(cl.all_claims(rec.RunData.load(out)))
    expected = [c.line() for c in said]
    assert sorted(claims) == sorted(expected) and len(claims) == 11  # 1 1a 1b 3 4 x2, 2
    # one seed, two iterations: every claim is inconclusive and says why, a reason several
    # share said once above them
    numbered = {f"reason {s.split('. ', 1)[0]} above": s.split(". ", 1)[1].rstrip(".")
                for s in shared if s[:1].isdigit()}
    for said_once, reason in numbered.items():  # each claim as it reads with its reasons
        claims = [c.replace(said_once, reason) for c in claims]
    assert all("**inconclusive** (" in c for c in claims)
    assert all("too few seeds: 1 < 3" in c for c in claims if "not run" not in c)
    assert any("(3)" in c and "not run" in c for c in claims)  # no ablations were run
    assert json.loads((out / "run_config.json").read_text())["train"]["iterations"] == 2


def test_alone_evaluation_is_paired_and_leaves_training_untouched(tiny_lm, tmp_path):
    args = ["--tasks", "sentiment", "--methods", "ppo,cory", "--seeds", "0", "--model", tiny_lm,
            *TINY,
            "--iterations", "3", "--alone-queries", "6", "--eval-batch-size", "4"]
    every, rare = tmp_path / "every", tmp_path / "rare"
    main([*args, "--eval-every", "1", "--out", str(every)])
    main([*args, "--eval-every", "50", "--out", str(rare)])
    # training is the same whether or not the models were evaluated in between
    assert numbers(rec.read_jsonl(every / "metrics.jsonl")) == numbers(
        rec.read_jsonl(rare / "metrics.jsonl"))
    alone = rec.read_jsonl(every / "alone.jsonl")
    assert sorted({e["iteration"] for e in alone}) == [0, 1, 2, 3]
    assert sorted({e["iteration"] for e in rec.read_jsonl(rare / "alone.jsonl")}) == [0, 3]
    # before any update every model is the base: same queries, same sampler -> same answers
    first = [e for e in alone if e["iteration"] == 0]
    assert len(first) == 3 and len({(e["task_reward"], e["kl"]) for e in first}) == 1
    assert all(abs(e["kl"]) < 1e-5 and e["n_queries"] == 6 for e in first)
    for e in alone:
        expected = e["task_reward"] - e["report_kl_coef"] * e["kl"]
        assert e["combined_reward"] == pytest.approx(expected)
        assert e["report_kl_coef"] == 0.3  # the initial KL coefficient, fixed
    # one definition of the combined reward: training records use the same fixed eta while
    # beta adapts (the current beta is the record's "kl_coef")
    trained = rec.read_jsonl(every / "metrics.jsonl")
    assert any(r["kl_coef"] != 0.3 for r in trained)
    for r in trained:
        assert r["report_kl_coef"] == 0.3
        assert r["combined_reward"] == pytest.approx(r["task_reward"] - 0.3 * r["kl"], abs=1e-5)
    later = {(e["agent"], e["method"]): e["role"] for e in alone if e["iteration"] == 1}
    assert later == {("llm_0", "ppo"): "pioneer", ("llm_0", "cory"): "pioneer",
                     ("llm_1", "cory"): "observer"}


def test_one_policy_playing_both_roles_is_evaluated_alone_once_per_point(tiny_lm, tmp_path,
                                                                        monkeypatch):
    calls = []
    real = benchmarks.study.evaluate.evaluate_policy
    monkeypatch.setattr(benchmarks.study.evaluate, "evaluate_policy",
                        lambda policy, *a, **k: calls.append(id(policy)) or real(policy, *a, **k))
    main(["--tasks", "sentiment", "--methods", "cory-shared", "--seeds", "0", "--model", tiny_lm,
          *TINY, "--alone-queries", "6", "--eval-batch-size", "4", "--eval-every", "1",
          "--out", str(tmp_path / "run")])
    alone = rec.read_jsonl(tmp_path / "run" / "alone.jsonl")
    assert len(calls) == 3 and len(set(calls)) == 1  # iterations 0, 1, 2: one model each time
    by_point = {}
    for e in alone:
        by_point.setdefault(e["iteration"], {})[e["agent"]] = e
    assert sorted(by_point) == [0, 1, 2]
    for point in by_point.values():
        assert sorted(point) == ["llm_0", "llm_1"]
        same = [{k: v for k, v in e.items() if k not in ("agent", "role")} for e in point.values()]
        assert same[0] == same[1]
    assert by_point[2]["llm_1"]["kl"] > 0  # trained: the record is the model's, not the base's


def test_group_learners_run_through_the_benchmark_alone_and_under_cory(tiny_lm, tmp_path):
    methods = ["grpo", "dr-grpo", "rloo", "reinforce-pp", "cory-grpo", "cory-reinforce-pp",
               "rloo/cory-no-kt"]  # any learner on any structure is a method too
    out = tmp_path / "run"
    report = main(["--quick", "--model", tiny_lm, "--out", str(out), *TINY, "--tasks",
                   "sentiment", "--methods", ",".join(methods)])
    rows = rec.read_jsonl(out / "metrics.jsonl")
    assert {(r["method"], r["agent"]) for r in rows} == {
        (m, a) for m in methods for a in (["llm_0", "llm_1"] if "cory" in m else ["llm_0"])}
    assert (out / "done" / "sentiment-rloo@cory-no-kt-seed0").exists()
    assert all(math.isfinite(r["task_reward"]) and r["skipped_batches"] == 0 for r in rows)
    text = report.read_text()
    for m in methods:
        assert f"| {m} |" in text, m


def test_resume_after_a_kill_equals_an_uninterrupted_run(tiny_lm, tmp_path):
    args = ["--tasks", "sentiment", "--methods", "cory", "--t-rex", "1", "--seeds", "3",
            "--model", tiny_lm, *TINY, "--iterations", "3", "--eval-every", "1",
            "--alone-queries", "4"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    cfg, _, _ = config_from_args(build_parser().parse_args(args + ["--out", str(full)]))
    run_benchmark(cfg, full, progress=False)
    run_benchmark(cfg, cut, progress=False, stop_after=2)  # "killed" after 2 iterations
    head = rec.read_jsonl(cut / "metrics.jsonl")
    assert {r["iteration"] for r in head} == {0, 1}
    stray = [dict(r, iteration=2, task_reward=123.0) for r in head if r["iteration"] == 1]
    with open(cut / "metrics.jsonl", "a") as f:  # a line written after the last checkpoint
        f.write("".join(json.dumps(r) + "\n" for r in stray) + '{"torn')
    main(["--resume", "--out", str(cut), "--no-progress"])
    assert numbers(rec.read_jsonl(cut / "metrics.jsonl")) == numbers(
        rec.read_jsonl(full / "metrics.jsonl"))
    assert rec.read_jsonl(cut / "alone.jsonl") == rec.read_jsonl(full / "alone.jsonl")
    with open(cut / "metrics.csv") as a, open(full / "metrics.csv") as b:
        drop = {"time_rollout_s", "time_update_s"}
        assert [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(a)] == \
            [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(b)]
    assert (cut / "report.md").exists()
    before = (cut / "metrics.jsonl").read_text()
    main(["--resume", "--out", str(cut), "--no-progress"])  # finished runs are skipped
    assert (cut / "metrics.jsonl").read_text() == before
    from benchmarks.compare import same_records

    ok, lines_ = same_records(str(full), str(cut))
    assert ok and lines_[0].startswith("metrics.jsonl: ") and "identical" in lines_[0]
    rows = rec.read_jsonl(cut / "metrics.jsonl")
    rows[-1]["kl"] += 1e-9  # one field of one record
    (cut / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok, lines_ = same_records(str(full), str(cut))
    assert not ok and f"record {len(rows)} differs in ['kl']" in "\n".join(lines_)


def test_resume_refuses_other_settings(tmp_path):
    cfg = resolve_config("offline", iterations=5)
    StudyFolder(tmp_path).start(cfg)
    args = build_parser().parse_args(["--resume", "--out", str(tmp_path), "--iterations", "7"])
    with pytest.raises(ValueError, match="iterations: saved 5, given 7"):
        config_from_args(args)
    same = build_parser().parse_args(["--resume", "--out", str(tmp_path), "--iterations", "5"])
    assert config_from_args(same)[0].train.iterations == 5
    assert config_from_args(build_parser().parse_args(["--resume", "--out", str(tmp_path)]))[2]
    with pytest.raises(ValueError, match="already holds a run"):
        StudyFolder(tmp_path).start(cfg)


def test_a_resume_adds_seeds_and_methods_equal_to_a_run_started_with_them(tiny_lm, tmp_path):
    args = ["--tasks", "sentiment", "--model", tiny_lm, *TINY, "--alone-queries", "4"]
    whole, grown = tmp_path / "whole", tmp_path / "grown"
    main([*args, "--methods", "ppo,cory", "--seeds", "0,1", "--out", str(whole)])
    main([*args, "--methods", "ppo", "--seeds", "0", "--out", str(grown)])
    before = (grown / "metrics.jsonl").read_text()
    main(["--resume", "--out", str(grown), "--seeds", "0,1", "--methods", "ppo,cory",
          "--no-progress"])
    assert (grown / "metrics.jsonl").read_text().startswith(before)  # saved runs untouched

    def key(r):
        return r["run"], r["iteration"], r.get("agent"), r.get("role") or ""
    for name in ("metrics.jsonl", "alone.jsonl"):
        assert sorted(numbers(rec.read_jsonl(grown / name)), key=key) == \
            sorted(numbers(rec.read_jsonl(whole / name)), key=key), name
    saved = json.loads((grown / "run_config.json").read_text())
    assert saved["seeds"] == [0, 1] and saved["methods"] == ["ppo", "cory"]
    assert "resume adds seeds [1], methods ['cory']" in (grown / "log.txt").read_text()
    assert "| cory |" in (grown / "report.md").read_text()
    config = (grown / "run_config.json").read_text()
    for typed, dropped in ((["--seeds", "1"], "[0]"), (["--methods", "cory"], "['ppo']")):
        parsed = build_parser().parse_args(["--resume", "--out", str(grown), *typed])
        with pytest.raises(ValueError, match=re.escape(f"drops {dropped} (a resume may add")):
            config_from_args(parsed)
    with pytest.raises(ValueError, match="seeds: saved"):  # the folder's own check
        run_benchmark(resolve_config("offline", seeds=[1], methods=["ppo", "cory"],
                                     tasks=["sentiment"], model=tiny_lm, iterations=2), grown,
                      resume=True, progress=False)
    assert (grown / "run_config.json").read_text() == config


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "sentiment,mnist"], "unknown task 'mnist'"),
    (["--methods", "ppo,sac"], "unknown method 'sac'"),
    (["--preset", "huge"], "invalid choice: 'huge'"),
    (["--batch-size", "12", "--mini-batch-size", "8"], "batch_size=12 must be divisible"),
    (["--iterations", "0"], "iterations must be a positive integer, got 0"),
    (["--max-tokens-per-pass", "-5"], "--max-tokens-per-pass (PPOConfig.max_tokens_per_pass) "
                                      "must be None or a positive int"),
    (["--old-logprobs", "decode"], "--old-logprobs (PPOConfig.old_logprobs) must be one of "
                                   "('auto', 'sampler', 'recompute'), got 'decode'"),
    (["--kl-coef-sweep", "1e-3,-1"], "kl_coef_sweep values must be positive"),
    (["--eval-samples", "2", "--pass-k", "4"], "pass_k 4 exceeds eval_samples 2"),
    (["--task-options", "reward_model=x", "--tasks", "arithmetic"], "task option 'reward_model'"),
    (["--resume"], "--resume needs --out"),
    (["--iteration", "2"], "unrecognized arguments: --iteration"),  # no abbreviations
    (["--mixed-precision", "fp16"], "mixed_precision must be one of ('auto', 'bf16', None), got "
                                    "'fp16'"),
    (["--seeds", "0,0"], "seeds lists 0 more than once ([0, 0])"),
    (["--tasks", "reasoning", "--quick"], "task 'reasoning' has no offline reference LM: give a "
                                          "model (--model"),
    (["--methods", "ppo,cory,ppo"], "methods lists ppo more than once"),
    (["--lora", "--lora-r", "0"], "--lora-r (LoraSettings.r) must be a positive integer, got 0"),
    (["--lr", "-1e-4"], "--lr (PPOConfig.lr) must be > 0, got -0.0001"),
    (["--n-agents", "0"], "--n-agents (TrainConfig.n_agents) must be a positive integer, got 0"),
    (["--import", "./notes.txt"], "--import './notes.txt': no such file"),
])
def test_bad_values_fail_before_any_model_loads(argv, message, capsys, monkeypatch):
    def no_training(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(benchmarks.study.worker, "Trainer", no_training)
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert message in err and "chains of" not in err, err


def test_an_import_that_is_no_python_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not code")
    for spec in ("notes.txt", "./notes.txt", str(tmp_path / "notes.txt")):
        with pytest.raises(SystemExit):
            main(["--import", spec, "--quick", "--plan"])
        err = capsys.readouterr().err
        assert err.startswith(f"python -m benchmarks.run: error: --import {spec!r}: ") \
            and "Traceback" not in err and len(err.splitlines()) == 2, err


def test_presets_resolve_to_the_papers_settings():
    cpu = {"device": "cpu"}  # the GPU presets ask for cuda; resolve them here on the CPU
    imdb = resolve_config("imdb", **cpu)
    t = imdb.train
    assert (t.model, t.batch_size, t.ppo.mini_batch_size, t.iterations) == \
        ("gpt2-large", 256, 256, 100)
    assert t.sampling.repetition_penalty == 1.1 and t.ppo.kl.penalty == "full" \
        and t.ppo.kl.adaptive
    assert t.task_options["reward_model"] == "lvwerra/distilbert-imdb"
    assert resolve_config("imdb-xl", **cpu).train.model == "gpt2-xl"
    gsm = resolve_config("gsm8k", **cpu)
    spec = benchmarks.RunSpec("gsm8k", "ppo", 0)
    tc_ppo, tc_cory = (benchmarks.train_config(gsm, benchmarks.RunSpec("gsm8k", m, 0))
                       for m in ("ppo", "cory"))
    assert (tc_ppo.ppo.lr, tc_cory.ppo.lr) == (1e-5, 1e-4) and spec.key == "gsm8k-ppo-seed0"
    assert tc_cory.load_in_4bit and tc_cory.lora is not None and tc_cory.report_kl_coef == 0.01
    assert (tc_cory.ppo.mini_batch_size, tc_cory.ppo.grad_accum_steps) == (2, 16)
    assert resolve_config("gsm8k", lr=3e-5, **cpu).lr_by_method == {}  # --lr: one shared lr
    quick = resolve_config("quick")
    assert quick.quick and len(quick.seeds) == 1 and quick.train.iterations <= 5
    sweep = resolve_config("offline", kl_coef_sweep=[1e-3])
    tc = benchmarks.train_config(sweep, benchmarks.run_specs(sweep)[0])
    assert tc.ppo.kl.coef == 1e-3 and not tc.ppo.kl.adaptive and tc.report_kl_coef == 1e-3
    capped = resolve_config("offline", max_tokens_per_pass=512, old_logprobs="sampler")
    tc = benchmarks.train_config(capped, benchmarks.run_specs(capped)[0])
    assert tc.ppo.max_tokens_per_pass == 512 and tc.ppo.mini_batch_size == 32
    assert tc.ppo.old_logprobs == "sampler"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_preset_without_a_gpu_fails_before_loading():
    with pytest.raises(ValueError, match="device='cuda' but 0 CUDA device"):
        resolve_config("gsm8k")
    with pytest.raises(ValueError, match="model folder '/nowhere/sentiment'"):
        resolve_config("offline", model="/nowhere/{task}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available()
                    or importlib.util.find_spec("bitsandbytes") is None,
                    reason="needs a CUDA GPU and bitsandbytes")
def test_gsm8k_preset_runs_in_4bit_on_cuda(tmp_path):
    """The paper's GSM8K preset (nf4 base + LoRA, per-method lr) end to end, shrunk by --quick,
    on a tiny random Llama over the offline arithmetic task (no download)."""
    tok = task_tokenizer("arithmetic")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    ).save_pretrained(tmp_path / "llama")
    out = tmp_path / "run"
    main(["--preset", "gsm8k", "--quick", "--tasks", "arithmetic", "--model",
          str(tmp_path / "llama"), "--out", str(out), "--no-progress"])
    rows = rec.read_jsonl(out / "metrics.jsonl")
    assert {(r["method"], r["agent"]) for r in rows} == {
        ("ppo", "llm_0"), ("cory", "llm_0"), ("cory", "llm_1")}
    assert all(r["skipped_batches"] == 0 and math.isfinite(r["loss"]) for r in rows)
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["load_in_4bit"] and saved["lora"] and saved["device"] == "cuda"


def test_kl_coef_sweep_without_values_is_one_grid_resolved_and_recorded():
    args = build_parser().parse_args(["--kl-coef-sweep"])
    assert args.kl_coef_sweep == "paper"  # resolved once the tasks are known
    assert build_parser().parse_args(["--kl-coef-sweep", "0.1,0.2"]).kl_coef_sweep == [0.1, 0.2]
    exact = resolve_config("offline", tasks=["arithmetic"], kl_coef_sweep="paper")
    assert exact.kl_coef_sweep == [1e-5, 1e-4, 1e-3, 1e-2]  # the grid itself is the setting
    assert {s.kl_coef for s in benchmarks.run_specs(exact)} == {1e-5, 1e-4, 1e-3, 1e-2}
    sentiment = resolve_config("offline", tasks=["sentiment"], kl_coef_sweep="paper")
    assert sentiment.kl_coef_sweep == [0.03, 0.1, 0.3, 1.0]  # the sentiment reward's scale
    with pytest.raises(ValueError, match=r"one grid for every task.*\['arithmetic'\].*"
                                         r"\['sentiment'\]"):
        resolve_config("offline", tasks=["sentiment", "arithmetic"], kl_coef_sweep="paper")
    given = resolve_config("offline", tasks=["sentiment", "arithmetic"], kl_coef_sweep=[0.1])
    assert {(s.task, s.kl_coef) for s in benchmarks.run_specs(given)} == {
        ("sentiment", 0.1), ("arithmetic", 0.1)}  # a given grid runs as given on every task


def test_study_preset_runs_the_arms_long_enough_to_decide():
    cfg = resolve_config("study")
    assert len(cfg.seeds) >= 3 and cfg.train.iterations >= 40 and cfg.tasks == ["sentiment"]
    assert {"ppo", "cory", "cory-official", "ppo-2x", "ppo-sampled-kl"} <= set(cfg.methods)
    points = sum(benchmarks.study.evaluate.evaluation_due(cfg, i)
                 for i in range(cfg.train.iterations + 1))
    assert points >= 10
    default = resolve_config("offline")
    assert sum(benchmarks.study.evaluate.evaluation_due(default, i) for i in range(21)) >= 5
    real, math_ = resolve_config("real"), resolve_config("real-math")
    for c in (real, math_):  # the real model's studies: 5 seeds, >= 10 points, one budget
        assert len(c.seeds) >= 5 and c.train.model == "smollm2-135m" and c.train.lora
        assert sum(benchmarks.study.evaluate.evaluation_due(c, i)
                   for i in range(c.train.iterations + 1)) >= 10
        assert (c.train.batch_size, c.train.iterations, c.train.ppo.lr) == (16, 30, 5e-4)
    assert real.alone_queries >= 256 and set(real.methods) >= {
        "ppo", "cory", "cory-no-kt", "cory-no-re", "cory-official", "ppo-2x"}
    assert math_.tasks == ["reasoning"] and cory_env.make_task("reasoning").exact_match
    assert math_.eval_problems >= 69 and {"ppo", "cory"} <= set(math_.methods)
    # the KL controller's horizon follows the batch: 10000 x 32 / 256
    assert default.train.ppo.kl_horizon(default.train.batch_size) == 1250
    raw = resolve_config("offline", scale_kl_horizon=False)
    assert raw.train.ppo.kl_horizon(raw.train.batch_size) == 10000
    imdb = resolve_config("imdb", device="cpu")
    tc = benchmarks.train_config(imdb, benchmarks.run_specs(imdb)[0])
    assert tc.ppo.kl_horizon(tc.batch_size) == 10000  # batch 256: the paper's own


# ------------------------------------------------------------------------------- helpers
def rows_for(method, rewards, kls, seed, role=None, agent="llm_0", task="t"):
    """Synthetic metric records of one seed's curve."""
    return [{"task": task, "method": method, "seed": seed, "swept_kl_coef": None, "agent": agent,
             "role": role or "pioneer", "iteration": i, "task_reward": r, "kl": k}
            for i, (r, k) in enumerate(zip(rewards, kls))]


def test_mean_std_and_final_values_over_seeds():
    s = rec.mean_std([1.0, 2.0, 3.0])
    assert s.mean == 2.0 and s.std == pytest.approx(1.0) and s.n == 3
    assert rec.mean_std([5.0]) == rec.Stat(5.0, 0.0, 1)
    rows = rows_for("ppo", [0, 0, 1, 3], [0] * 4, seed=0) + rows_for("ppo", [0, 0, 3, 5], [0] * 4,
                                                                        seed=1)
    st = rec.final_stat(rows, "task_reward", 2, method="ppo")  # finals 2 and 4
    assert (st.mean, st.std, st.n) == (3.0, pytest.approx(math.sqrt(2)), 2)
    assert str(st) == "3 ± 1.41"


def test_pass_at_k_matches_hand_values():
    assert rec.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert rec.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert rec.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert rec.pass_at_k(8, 0, 4) == 0.0 and rec.pass_at_k(5, 4, 2) == 1.0
    with pytest.raises(ValueError):
        rec.pass_at_k(4, 5, 1)


def test_copy_rate():
    assert cory_env.copy_rate(["a b", "c", "d"], ["a b ", "x", "d"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="not aligned"):
        cory_env.copy_rate(["a"], ["a", "b"])


def test_run_py_works_as_a_script():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    for option in ("--tasks", "--methods", "--seeds", "--iterations", "--batch-size",
                   "--kl-coef-sweep", "--device", "--out", "--resume", "--quick", "--preset"):
        assert option in done.stdout


def test_n_agents_runs_chains_and_reports_every_position(tiny_lm, tmp_path):
    out = tmp_path / "chain"
    report = main(["--quick", "--model", tiny_lm, "--out", str(out), *TINY, "--tasks",
                   "sentiment", "--methods", "ppo,cory,cory-mappo", "--n-agents", "3",
                   "--t-rex", "1"])
    rows = rec.read_jsonl(out / "metrics.jsonl")
    assert {r["agent"] for r in rows if r["method"] == "ppo"} == {"llm_0"}  # K is for chains
    for method in ("cory", "cory-mappo"):
        mine = [r for r in rows if r["method"] == method]
        assert {r["agent"] for r in mine} == {"llm_0", "llm_1", "llm_2"}
        for r in mine:  # the rotation puts llm_{(k + r) % 3} at position k
            assert r["agent"] == f"llm_{(r['position'] + r['rotation']) % 3}"
            assert r["rotation"] == r["iteration"] % 3
            assert ("copy_rate" in r) == (r["position"] > 0)
    text = (out / "report.md").read_text()
    assert "| cory | observer_2 − observer_1 |" in text
    assert "| cory-mappo | observer_1 − pioneer |" in text
    assert (out / "plots" / "positions_sentiment.png").exists()
    assert {r["agent"] for r in rec.read_jsonl(out / "alone.jsonl") if r["method"] == "cory"} \
        == {"llm_0", "llm_1", "llm_2"}
    assert Path(report) == out / "report.md" and Path(report).stat().st_size > 0
    from benchmarks.compare import lines

    two = tmp_path / "two"
    main(["--quick", "--model", tiny_lm, "--out", str(two), *TINY, "--tasks", "sentiment",
          "--methods", "cory"])
    compared = "\n".join(lines([str(two), str(out)], "sentiment", "cory"))
    assert "alone reward, llm_2" in compared and "in training, observer_2" in compared
    diff = compared.split("(paired by seed)")[1]
    assert "in training, last position" in diff and "llm_2" not in diff
    with pytest.raises(ValueError, match="has no 'ppo' run"):
        lines([str(two)], "sentiment", "ppo")


def test_runs_are_ordered_so_a_study_stopped_early_decides_the_most_claims():
    cfg = resolve_config("real")
    order = [(s.method, s.seed) for s in benchmarks.run_specs(cfg)]
    seeds = cfg.seeds
    assert order[:2 * len(seeds)] == [(m, s) for s in seeds for m in ("ppo", "cory")]
    ablations = order[2 * len(seeds):4 * len(seeds)]
    assert ablations == [(m, s) for s in seeds for m in ("cory-no-kt", "cory-no-re")]
    assert {m for m, _ in order[4 * len(seeds):]} == {"cory-official", "ppo-2x"}


def test_resume_fills_in_a_mechanism_measured_after_the_run_started(tiny_lm, tmp_path):
    import shutil

    from benchmarks.evidence.transfer import training_budget
    from benchmarks.settings.config import RunSpec, train_config

    model = tmp_path / "lm"
    shutil.copytree(tiny_lm.format(task="sentiment"), model)
    out = tmp_path / "run"
    args = ["--tasks", "sentiment", "--methods", "ppo", "--seeds", "0", "--model", str(model),
            *TINY, "--iterations", "1", "--out", str(out)]
    main(args)
    assert "not_measured" in json.loads((out / "mechanism.json").read_text())["sentiment"]
    elsewhere = mechanism_measurement()  # measured at 20 iterations x 32 episodes
    (model / "transfer-sentiment.json").write_text(json.dumps(elsewhere))
    main(["--resume", "--out", str(out), "--no-progress"])
    why = json.loads((out / "mechanism.json").read_text())["sentiment"]["not_measured"]
    assert "at another budget (iterations: measured 20, run 1; batch_size: measured 32, " \
           "run 4" in why and f"--out {out / 'transfer-sentiment.json'}" in why
    run = training_budget(train_config(StudyFolder(out).saved_config(),
                                       RunSpec("sentiment", "ppo", 0)))
    measured = {**elsewhere, "budget": run}
    (model / "transfer-sentiment.json").write_text(json.dumps(measured))  # at the run's budget
    metrics = (out / "metrics.jsonl").read_text()
    main(["--resume", "--out", str(out), "--no-progress"])
    assert json.loads((out / "mechanism.json").read_text())["sentiment"] == measured
    assert (out / "metrics.jsonl").read_text() == metrics  # nothing else re-run
    assert "filled in sentiment" in (out / "log.txt").read_text()
    text = (out / "report.md").read_text()
    assert "Cross-role transfer" in text and "not an offline reference LM" not in text
    assert f"{run['iterations']} iterations × {run['batch_size']} episodes, lr {run['lr']:g}, " \
           f"{'LoRA' if run['lora'] else 'every weight'}" in text
    (model / "transfer-sentiment.json").unlink()  # a measurement, once in the folder, stays
    main(["--resume", "--out", str(out), "--no-progress"])
    assert json.loads((out / "mechanism.json").read_text())["sentiment"] == measured
    own = {**measured, "verdict": "present"}  # the study folder's own file comes first, and
    (out / "transfer-sentiment.json").write_text(json.dumps(own))  # a new one is followed
    (model / "transfer-sentiment.json").write_text(json.dumps(measured))
    main(["--resume", "--out", str(out), "--no-progress"])
    assert json.loads((out / "mechanism.json").read_text())["sentiment"] == own
    (out / "transfer-sentiment.json").write_text(json.dumps(elsewhere))  # another budget, and
    (model / "transfer-sentiment.json").unlink()  # none at the run's: a measurement stays
    main(["--resume", "--out", str(out), "--no-progress"])
    assert json.loads((out / "mechanism.json").read_text())["sentiment"] == own


def test_resume_compares_only_the_settings_typed(tmp_path, capsys):
    """`--resume --iterations 40` listed 13 settings as "given" that nobody typed."""
    cfg = resolve_config("offline", quick=True)
    StudyFolder(tmp_path).start(cfg)
    args = build_parser().parse_args(["--resume", "--out", str(tmp_path), "--iterations", "40"])
    with pytest.raises(ValueError) as err:
        config_from_args(args)
    text = str(err.value)
    assert "--iterations: saved 3, given 40" in text and "a finished run is not extended" in text
    assert text.count("saved") == 1  # only what was typed
    same = ["--resume", "--out", str(tmp_path), "--quick", "--iterations", "3"]
    assert config_from_args(build_parser().parse_args(same))[2]


@pytest.mark.parametrize("task, tokens", [("course", 2), ("textarena", 8), ("sentiment", 12),
                                          ("arithmetic", 12)])
def test_quick_keeps_a_tasks_shorter_answers_and_caps_longer_ones(task, tokens):
    from benchmarks.settings.config import RunSpec, train_config

    model = {"model": "gpt2"} if task in ("course", "textarena") else {}  # checked, not loaded
    cfg = resolve_config("offline", quick=True, tasks=[task], methods=["ppo"], **model)
    run = train_config(cfg, RunSpec(task, "ppo", 0))
    assert run.max_new_tokens == tokens
    run.validate()  # course's 10-token context took no 12-token answers
    given = resolve_config("offline", quick=True, tasks=["sentiment"], max_new_tokens=20)
    assert train_config(given, RunSpec("sentiment", "ppo", 0)).max_new_tokens == 20  # typed
