"""What a new user hits first: plug-ins, checkpoints of another run, and bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ToyTask, save_toy_lm
from transformers import GPT2Config, GPT2LMHeadModel

import cory_env
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.learners.ppo_learner import PPO
from agents.learners.registry import register_learner, registered_methods
from agents.training.config import TrainConfig
from agents.training.train import Trainer
from cory_common import plugins
from cory_env import Query

cory_env.register_task("toy", ToyTask)
ROOT = Path(__file__).resolve().parents[2]


def config(model, method="cory", **kw):
    ppo = PPOConfig(mini_batch_size=4, ppo_epochs=2, lr=3e-3, kl=KLConfig(coef=0.05),
                    **kw.pop("ppo", {}))
    return TrainConfig(task="toy", method=method, model=model, batch_size=8, ppo=ppo,
                       iterations=kw.pop("iterations", 4), **kw)


def numbers(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith("time_")}


# ----------------------------------------------------------------------------- plug-ins
PLUGIN = textwrap.dedent('''
    from agents.learners.registry import register_learner
    from agents.learners.ppo_learner import PPO
    from cory_env import register_task
    from cory_env.tasks.offline import SentimentTask

    @register_learner("plugin-ippo")
    class PluginPPO(PPO):
        """A user's learner."""

    @register_task("plugin-sentiment")
    class PluginSentiment(SentimentTask):
        """A user's task (no name of its own: register_task gives it one)."""
''')


def test_import_by_file_or_module_registers_learners_and_tasks(tmp_path, monkeypatch):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    plugins.load_plugin(str(tmp_path / "my_plugin.py"))
    assert "plugin-ippo" in registered_methods()
    assert "plugin-sentiment" in cory_env.registered_tasks()
    assert cory_env.make_task("plugin-sentiment").name == "plugin-sentiment"
    with pytest.raises(ValueError, match="--import 'no_such_module_x': No module named"):
        plugins.load_plugin("no_such_module_x")
    with pytest.raises(ValueError, match="no such file"):
        plugins.load_plugin(str(tmp_path / "missing.py"))


def test_the_benchmark_imports_a_learner_and_resume_imports_it_again(tmp_path):
    """Two processes: the run, then a --resume that names nothing but the folder."""
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    lm = save_toy_lm(tmp_path / "lm")
    tiny = ["--iterations", "2", "--batch-size", "4", "--ppo-epochs", "1", "--max-new-tokens",
            "2", "--eval-problems", "0", "--seeds", "0", "--final-window", "1", "--no-progress"]
    out = tmp_path / "run"
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"}
    first = [sys.executable, "-c", "import sys; from benchmarks.run import main; "
             "import cory_env, helpers; cory_env.register_task('toy', helpers.ToyTask); "
             "main(sys.argv[1:])", "--import", str(tmp_path / "my_plugin.py"), "--methods",
             "plugin-ippo", "--tasks", "toy", "--model", lm, "--out", str(out), *tiny]
    p = subprocess.run(first + ["--iterations", "1"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["imports"] == [str(tmp_path / "my_plugin.py")]
    resume = first[:3] + ["--resume", "--out", str(out), "--no-progress"]
    p = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


def test_entry_points_register_without_an_import(tmp_path, monkeypatch):
    pkg = tmp_path / "ep_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(PLUGIN.replace("plugin-ippo", "ep-ippo")
                                     .replace("plugin-sentiment", "ep-sentiment"))
    dist = tmp_path / "ep_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cory.learners]\nmine = ep_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "mine" in plugins.load_entry_points.__wrapped__("cory.learners")
    assert "ep-ippo" in registered_methods() and "ep-sentiment" in cory_env.registered_tasks()


def test_built_in_names_cannot_be_replaced():
    with pytest.raises(ValueError, match="learner name 'ppo' is built in"):
        @register_learner("ppo")
        class MyPPO(PPO):
            pass
    with pytest.raises(ValueError, match="task name 'sentiment' is built in"):
        cory_env.register_task("sentiment", ToyTask)
    assert cory_env.make_task("sentiment").name == "sentiment"


# ----------------------------------------------------------------------------- checkpoints
def _exercise_learners():
    from examples.exercises import ex2_learner, ex3_rewards  # noqa: F401  (they register)

    return registered_methods()


@pytest.mark.parametrize("method", _exercise_learners())
def test_every_registered_learner_resumes_bit_for_bit(toy_lm, tmp_path, method):
    if method.startswith(("plugin-", "ep-")):
        pytest.skip("registered by another test")
    full = [numbers(m) for m in Trainer(config(toy_lm, method, t_rex=1)).run()]
    first = Trainer(config(toy_lm, method, t_rex=1))
    head = [numbers(first.step()) for _ in range(2)]
    first.save(str(tmp_path / "c.pt"))
    resumed = Trainer(config(toy_lm, method, t_rex=1))
    resumed.load(str(tmp_path / "c.pt"))
    assert head + [numbers(m) for m in resumed.run()] == full


def test_a_learners_own_state_is_saved(toy_lm, tmp_path):
    from examples.exercises.ex2_learner import ReinforceEMA  # noqa: F401

    trainer = Trainer(config(toy_lm, "reinforce-ema"))
    trainer.step()
    trainer.save(str(tmp_path / "c.pt"))
    other = Trainer(config(toy_lm, "reinforce-ema"))
    assert all(v is None for v in other.learner.baseline.values())
    other.load(str(tmp_path / "c.pt"))
    assert other.learner.baseline == trainer.learner.baseline
    assert all(v is not None for v in other.learner.baseline.values())


def test_a_checkpoint_refuses_a_run_with_other_settings(toy_lm, tmp_path):
    trainer = Trainer(config(toy_lm))
    trainer.step()
    path = str(tmp_path / "c.pt")
    trainer.save(path)
    bad = config(toy_lm)
    bad.ppo.lr = 1e-2
    with pytest.raises(ValueError, match=r"ppo\.lr: saved 0\.003, now 0\.01") as err:
        Trainer(bad).load(path)
    assert "only iterations, device, placement may change" in str(err.value)
    bad = config(toy_lm, t_rex=3)
    with pytest.raises(ValueError, match=r"t_rex: saved 5, now 3"):
        Trainer(bad).load(path)
    longer = Trainer(config(toy_lm, iterations=9))  # more iterations: the same run, longer
    with pytest.warns(RuntimeWarning, match="iterations: saved 4, now 9"):
        longer.load(path)
    assert longer.iteration == 1


def test_checkpoint_load_errors_name_the_file(toy_lm, tmp_path):
    trainer = Trainer(config(toy_lm))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match=f"checkpoint {corrupt} cannot be read"):
        trainer.load(str(corrupt))
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match=f"checkpoint {other} is not a cory Trainer checkpoint"):
        trainer.load(str(other))
    with pytest.raises(FileNotFoundError, match="missing.pt: no such file"):
        trainer.load(str(tmp_path / "missing.pt"))
    # another architecture: the parameter and the file are named
    wide = tmp_path / "wide"
    tok = ToyTask().tokenizer
    tok.save_pretrained(wide)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=48, n_head=2, vocab_size=len(tok),
                               n_positions=64)).save_pretrained(wide)
    big = Trainer(config(str(wide)))
    big.save(str(tmp_path / "wide.pt"))
    with pytest.raises(ValueError, match=r"model: saved '.*wide', now"):
        trainer.load(str(tmp_path / "wide.pt"))
    state = torch.load(tmp_path / "wide.pt", weights_only=False)
    del state["config"]  # an old checkpoint without its configuration
    torch.save(state, tmp_path / "wide-old.pt")
    with pytest.raises(ValueError, match=r"wide-old.pt \(llm_0\): .* has shape"):
        trainer.load(str(tmp_path / "wide-old.pt"))


# ----------------------------------------------------------------------------- bad inputs
def test_numpy_scalars_count_as_python_ones(toy_lm):
    cfg = config(toy_lm, seed=np.int64(3), iterations=np.int64(2), load_in_4bit=np.bool_(False))
    cfg.ppo.lr, cfg.ppo.ppo_epochs = np.float32(3e-3), np.int64(1)
    cfg.validate()
    assert type(cfg.seed) is int and type(cfg.ppo.ppo_epochs) is int
    assert type(cfg.load_in_4bit) is bool
    env = cory_env.BatchedCoryEnv(batch_size=np.int64(2), task="toy")
    env.reset(options={"rotation": np.int64(1), "queries": [np.int64(0), np.int64(1)]})
    assert env.batch_size == 2


@pytest.mark.parametrize("field,value,message", [
    ("iterations", "3", "TrainConfig.iterations must be an int, got '3'"),
    ("seed", 1.5, "TrainConfig.seed must be an int, got 1.5"),
    ("batch_size", -8, "batch_size must be a positive integer, got -8"),
    ("task_options", "reward_model=x", "TrainConfig.task_options must be a dict"),
    ("placement", ["cpu"], "TrainConfig.placement must be a dict"),
    ("model", "/no/such/model", "model='/no/such/model': no such file or folder"),
    ("report_kl_coef", -1.0, "report_kl_coef must be None or a finite number >= 0"),
])
def test_bad_train_settings_are_named_before_anything_loads(field, value, message):
    cfg = TrainConfig(task="toy")
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        cfg.validate()


@pytest.mark.parametrize("field,value,message", [
    ("lr", "fast", "PPOConfig.lr must be a float, got 'fast'"),
    ("lr", -1.0, "lr must be > 0"),
    ("ppo_epochs", 0, "ppo_epochs"),
    ("gamma", float("nan"), "PPOConfig.gamma must be a float, got nan"),
    ("kl.penalty", "kl2", "KLConfig.penalty must be one of"),
    ("kl.coef", -1.0, "KLConfig.coef must be a finite number >= 0, got -1.0"),
    ("kl.where", "both", "KLConfig.where must be one of"),
])
def test_bad_ppo_settings_are_named(field, value, message):
    cfg = PPOConfig()
    *parents, name = field.split(".")
    setattr(cfg.kl if parents else cfg, name, value)
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_a_missing_local_reward_model_is_found_before_training():
    cfg = TrainConfig(task="imdb", model=None, task_options={"reward_model": "/no/rm"})
    with pytest.raises(ValueError, match="task option reward_model='/no/rm': no such file"):
        cfg.validate()


def test_bad_env_inputs_get_clear_errors(toy_task):
    env = cory_env.BatchedCoryEnv(batch_size=4, task="toy")
    with pytest.raises(TypeError, match="reset options must be a dict or None, got 'swap'"):
        env.reset(options="swap")
    with pytest.raises(ValueError, match="queries is empty"):
        env.reset(options={"queries": []})
    with pytest.raises(ValueError, match="2 queries x group_size 1 = 2 episodes, but batch_size "
                                         "is 4"):
        env.reset(options={"queries": [0, 1]})
    with pytest.raises(ValueError, match="query True is not a Query or an index"):
        env.reset(options={"queries": [True, 0, 1, 2]})
    fresh = cory_env.BatchedCoryEnv(batch_size=2, task="toy")
    with pytest.raises(RuntimeError, match=r"reset\(\) needs to be called before step"):
        fresh.step(torch.tensor([1, 2]))
    env.reset()
    with pytest.raises(ValueError, match="unknown agent 'llm_9'; agents:"):
        env.turn_batch("llm_9")
    raw = cory_env.raw_env(task="toy")
    with pytest.raises(AssertionError, match=r"reset\(\) needs to be called before step"):
        raw.step(1)
    with pytest.raises(AssertionError, match=r"reset\(\) needs to be called before observe"):
        raw.observe("llm_0")


def test_a_model_smaller_than_the_tokenizer_is_refused_before_training(tmp_path):
    small = tmp_path / "small"
    tok = ToyTask().tokenizer
    tok.save_pretrained(small)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tok) - 5,
                               n_positions=64)).save_pretrained(small)
    with pytest.raises(ValueError, match=f"{len(tok) - 5} token embeddings but the task's "
                                         f"tokenizer has {len(tok)} tokens"):
        Trainer(config(str(small)))


def test_an_unreachable_hub_name_fails_fast():
    import time

    from agents.llm.policy import LLMPolicy

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="'no-such-org/no-such-model' is not a local folder"):
        LLMPolicy.from_pretrained("no-such-org/no-such-model")
    assert time.perf_counter() - t0 < 15


def test_a_task_that_takes_the_run_tokenizer_gets_the_models(tmp_path):
    """A task declares `takes_run_tokenizer`; the name of its keywords plays no part."""
    class TokTask(ToyTask):
        takes_run_tokenizer = True

        def __init__(self, vocabulary_from: str = "the-hub's"):
            super().__init__()

        def load_queries(self, split):
            ids = self.tokenizer("the movie was", add_special_tokens=False)["input_ids"]
            return [Query("the movie was", ids=tuple(ids))]

    cory_env.register_task("tok-toy", TokTask)
    lm = save_toy_lm(tmp_path / "lm")
    trainer = Trainer(TrainConfig(task="tok-toy", method="ppo", model=lm, batch_size=8,
                                  ppo=PPOConfig(mini_batch_size=8)))
    env = trainer.env
    assert env.task.tokenizer is env.tokenizer  # queries are cut with the model's tokenizer
    assert env.task.queries()[0].ids == tuple(env.tokenizer.encode("the movie was"))
    own = cory_env.make_task("toy")
    trainer = Trainer(TrainConfig(task=own, method="ppo", model=lm, batch_size=8,
                                  ppo=PPOConfig(mini_batch_size=8)))
    assert trainer.env.task.tokenizer is not trainer.env.tokenizer  # not declared: its own


# ----------------------------------------------------------------------------- conventions
def test_max_cycles_caps_each_agents_turn_as_pettingzoo_does():
    env = cory_env.env(task="sentiment", max_cycles=4)
    env.reset(seed=0)
    counts = dict.fromkeys(env.possible_agents, 0)
    rng = np.random.default_rng(0)
    for agent in env.agent_iter():
        counts[agent] += 1
        done = env.terminations[agent] or env.truncations[agent]
        env.step(None if done else int(rng.integers(5, 500)))  # no EOS: the cap ends turns
    assert counts == {"llm_0": 5, "llm_1": 5}  # 4 actions each, then the closing None step
    with pytest.raises(ValueError, match="max_cycles"):
        cory_env.env(task="sentiment", max_cycles=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pettingzoo.test import api_test

        api_test(cory_env.env(task="toy", max_cycles=2), num_cycles=20)


def test_help_lists_methods_tasks_and_task_options():
    from benchmarks.run import build_parser

    text = build_parser().format_help()
    for word in ("cory-grpo", "cory-mappo", "imdb: dataset='imdb'", "tokenizer='gpt2'",
                 "sentiment: n_queries=4096", "--import", "--wandb"):
        assert word in text, word
    from agents.distributed.__main__ import build_parser as dist_parser

    assert "reward_model=" in dist_parser()[0].format_help()


def test_mini_batch_follows_batch_size_on_every_cli():
    from agents.distributed.__main__ import parse_args
    from benchmarks.run import build_parser, config_from_args

    cfg, _, _ = config_from_args(build_parser().parse_args(["--batch-size", "8"]))
    assert (cfg.train.batch_size, cfg.train.ppo.mini_batch_size) == (8, 8)
    _, tcfg = parse_args(["--batch-size", "8", "--task", "toy"])
    assert tcfg.ppo.mini_batch_size == 8
    with pytest.raises(SystemExit):  # an explicit mismatch is still an error
        build_parser().parse_args(["--iteration", "2"])


def test_wandb_offline_logs_without_a_network(tmp_path, toy_lm):
    pytest.importorskip("wandb")
    from benchmarks.run import main

    out = tmp_path / "run"
    main(["--wandb", "offline", "--tasks", "toy", "--methods", "ppo", "--model", toy_lm,
          "--iterations", "2", "--batch-size", "4", "--ppo-epochs", "1", "--max-new-tokens", "2",
          "--eval-problems", "0", "--seeds", "0", "--final-window", "1", "--no-progress",
          "--out", str(out)])
    runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0


def test_an_unknown_task_option_is_named_with_the_accepted_ones():
    with pytest.raises(ValueError, match=r"task 'imdb' has no option\(s\) \['bogus'\]; it takes"):
        cory_env.make_task("imdb", bogus=1)


def test_validate_returns_the_run_config_and_leaves_the_given_one_as_it_was(toy_lm):
    """Validation derives on a copy: a list of models is keyed by agent, and the config handed
    in is unchanged (validating twice: the same run)."""
    import copy

    cfg = config(toy_lm, method="cory")
    cfg.batch_size, cfg.models = 4, [toy_lm, toy_lm]
    before = copy.deepcopy(cfg)
    run = cfg.validate()
    assert cfg == before and cfg.models == [toy_lm, toy_lm]
    assert run is not cfg and run.models == {"llm_0": toy_lm, "llm_1": toy_lm}
    assert run.batch_size == 4 and run.validate() == run


def test_the_trainer_runs_the_validated_config_with_the_batch_stored_once(toy_lm):
    """The learner gets the derived config: with no PPO setting given, the mini-batch fits the
    run's batch, and the adaptive KL horizon scales with that one batch size."""
    trainer = Trainer(TrainConfig(task="toy", method="cory", model=toy_lm, batch_size=8,
                                  iterations=1))
    assert trainer.cfg.ppo.mini_batch_size == 8 and trainer.learner.cfg.batch_size == 8
    assert trainer.learner.cfg.ppo.mini_batch_size == 8
    horizon = TrainConfig().ppo.kl.horizon * 8 / 256
    assert all(a.kl_controller.horizon == horizon for a in trainer.learner.agents.values())
