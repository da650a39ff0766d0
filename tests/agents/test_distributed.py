"""Multi-process training (2 CPU ranks over gloo) and device placement.

Run as a script under torchrun, this file is also the worker of the 2-process test:
    torchrun --nproc_per_node 2 tests/test_distributed.py --model DIR --out DIR
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import WORDS, ToyTask

import cory_env
from cory_env import Query

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ShardToyTask(ToyTask):
    """The toy task with 32 distinct prompts, so two ranks' batches can be disjoint."""

    name = "shardtoy"
    PROMPTS = [f"{s} {v} {w}" for s in ("the movie", "the plot", "the acting", "it")
               for v in ("was", "is very") for w in ("good", "bad", "great", "awful")]


cory_env.register_task("toy", ToyTask)
cory_env.register_task("shardtoy", ShardToyTask)


def config(model, method="cory", **kw):
    from agents.learners.ppo_config import KLConfig, PPOConfig
    from agents.training.config import TrainConfig

    batch = kw.pop("batch_size", 8)
    ppo = PPOConfig(mini_batch_size=kw.pop("mini_batch_size", 4), ppo_epochs=2,
                    lr=3e-3, kl=KLConfig(coef=0.05, penalty="kl", scale_horizon=False))
    return TrainConfig(task=kw.pop("task", "shardtoy"), method=method, model=model,
                       batch_size=batch, ppo=ppo, iterations=kw.pop("iterations", 3), **kw)


def full_critic(trainer) -> torch.Tensor:
    """The critic's trainable parameters as one full (unsharded) vector."""
    from torch.distributed.tensor import DTensor

    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().flatten()
                      for p in trainer.learner.critic.trainable_parameters()])


def checksum(trainer) -> str:
    """sha256 over every agent's (and the critic's) trainable tensors, in a fixed order."""
    h = hashlib.sha256()
    policies = dict(trainer.learner.policies)
    if getattr(trainer.learner, "critic", None) is not None:
        policies["critic"] = trainer.learner.critic
    for name in sorted(policies):
        for p in policies[name].trainable_parameters():
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def numbers(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith("time_") and k != "world_size"}


# ----------------------------------------------------------------------------- the worker

def worker(argv) -> None:
    """One rank: 3 CORY iterations (roles exchanged at 1, NaN rewards on rank 1 at 2), then 2
    MAPPO iterations (its centralized critic is DDP-wrapped too). With --fsdp: the FSDP runs
    of `fsdp_rank` instead."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--checks", action="store_true")
    args = p.parse_args(argv)
    if args.fsdp:
        fsdp_rank(args.model, args.out)
    elif args.checks:
        checks_rank(args.model, args.out)
    else:
        run_rank(args.model, args.out, "cory", iterations=3, poison_iteration=2)
        run_rank(args.model, args.out, "cory-mappo", iterations=3, poison_iteration=1)
    import torch.distributed as dist

    if dist.is_initialized():  # leave together: a rank exiting mid-teardown aborts gloo
        dist.barrier()
        dist.destroy_process_group()


def run_rank(model, out, method, iterations, poison_iteration) -> None:
    from agents.distributed import DistributedTrainer, make_accelerator

    acc = make_accelerator(cpu=True)
    trainer = DistributedTrainer(config(model, method, t_rex=1, iterations=iterations), acc)
    rank = trainer.rank
    update = trainer.learner.update

    def poisoned_update(turns, iteration):  # rank 1 alone gets NaN rewards
        if rank == 1 and iteration == poison_iteration:
            for turn in turns.values():
                turn.reward = torch.full_like(turn.reward, float("nan"))
        return update(turns, iteration)

    trainer.learner.update = poisoned_update
    record = {"rank": rank, "world_size": trainer.world_size, "init": checksum(trainer),
              "checksums": [], "queries": [], "local": [], "reduced": []}
    for metrics in trainer.run():
        record["checksums"].append(checksum(trainer))
        record["queries"].append([q.text for q in trainer.env.turn_batch("llm_0")["queries"]])
        keep = ("role", "task_reward", "skipped_batches", "optimizer_steps", "kl_coef")
        for src, dst in ((trainer.local_metrics, "local"), (metrics, "reduced")):
            record[dst].append({a: {k: src[a][k] for k in keep} for a in ("llm_0", "llm_1")})
    trainer.save(os.path.join(out, f"{method}.pt"))
    with open(os.path.join(out, f"{method}{rank}.json"), "w") as f:
        json.dump(record, f)


def pass_loss(policy, b):
    """One pass's PPO loss (clipped policy loss + value loss) on batch b."""
    from agents.learners.ppo import policy_loss, value_loss

    T = b.response_mask.shape[1]
    ev = policy.evaluate(b.input_ids, b.attention_mask, T)
    pg, _ = policy_loss(ev.logprobs, b.old_logprobs, b.advantages, b.response_mask, 0.2)
    vf, _ = value_loss(ev.values, b.old_values, b.returns, b.response_mask, 0.2)
    return pg + 0.1 * vf


def checks_rank(model, out) -> None:
    """The multi-rank checks of test_multi_rank_statistics_gradients_and_resume."""
    from agents.distributed import DistributedTrainer, make_accelerator
    from agents.learners.ppo import prepare_advantages

    acc = make_accelerator(cpu=True)
    record = {}
    # 1. gradients: DDP's equal the single-process gradient of the global batch (the ranks'
    # rows as two accumulated passes), also when accelerate is set to divide by its own
    # gradient_accumulation_steps
    trainer = DistributedTrainer(config(model, "cory", iterations=1), acc)
    learner, comm = trainer.learner, trainer.comm
    update = learner.update

    def grad_check(turns, iteration):
        agent = learner.agents["llm_0"]
        batch = prepare_advantages(agent.batch(turns["llm_0"]), agent.cfg)
        batch = batch.index(torch.arange(len(batch)))  # rows out of the rollout's inference mode
        every = comm.gather_object(batch.to("cpu"))
        params = agent.policy.trainable_parameters()
        for steps in (1, 3):
            acc.gradient_accumulation_steps = steps
            agent.optimizer.zero_grad(set_to_none=True)
            comm.backward(pass_loss(agent.policy, batch))
            ddp = [p.grad.clone() for p in params]
            agent.optimizer.zero_grad(set_to_none=True)
            (sum(pass_loss(learner.policies["llm_0"], b) for b in every) / len(every)).backward()
            plain = [p.grad.clone() for p in params]
            agent.optimizer.zero_grad(set_to_none=True)
            record[f"grad_diff_{steps}"] = max(float((a - b).abs().max())
                                               for a, b in zip(ddp, plain))
            record[f"grad_scale_{steps}"] = max(float(b.abs().max()) for b in plain)
        acc.gradient_accumulation_steps = 1
        return update(turns, iteration)

    learner.update = grad_check
    trainer.step()
    # 2. the adaptive KL controller sees the global KL: rank 0's KL is below the target,
    # rank 1's above, so unsynchronised controllers would move in opposite directions
    cfg = config(model, "cory", iterations=1)
    cfg.ppo.kl.penalty, cfg.ppo.kl.horizon = "full", 100.0
    trainer = DistributedTrainer(cfg, acc)
    update = trainer.learner.update

    def set_kl(turns, iteration):
        for t in turns.values():
            t.full_kl = torch.zeros_like(t.full_kl)
            t.full_kl[:, 0] = 1.0 if trainer.rank == 0 else 20.0  # summed KL per answer
        return update(turns, iteration)

    trainer.learner.update = set_kl
    trainer.step()
    record["kl_coef"] = {a: s.kl_coef for a, s in trainer.learner.agents.items()}
    # 3. score statistics over the global batch, with normalisation on
    cfg = config(model, "cory", iterations=1)
    cfg.ppo.use_score_norm = True
    trainer = DistributedTrainer(cfg, acc)
    rewards = {}
    update = trainer.learner.update

    def keep_rewards(turns, iteration):
        rewards.update({a: t.reward.tolist() for a, t in turns.items()})
        return update(turns, iteration)

    trainer.learner.update = keep_rewards
    trainer.step()
    record["score_stats"] = {a: s.score_stats.state_dict()
                             for a, s in trainer.learner.agents.items()}
    record["rewards"] = rewards
    # 4. REINFORCE with one row per rank: the baseline's std is over the global batch
    one = DistributedTrainer(config(model, "cory-reinforce", iterations=2, batch_size=1,
                                    mini_batch_size=1), acc)
    update, advantages = one.learner.update, []

    def rank_rewards(turns, iteration):  # 1 on rank 0, 3 on rank 1: global mean 2, std 1.41
        for t in turns.values():
            t.reward = torch.full_like(t.reward, 1.0 + 2.0 * one.rank)
        return update(turns, iteration)

    for agent in one.learner.agents.values():
        learn = agent.learn
        agent.learn = lambda batch, *a, learn=learn: (
            advantages.append(float(batch.advantages[0, 0])), learn(batch, *a))[1]
    one.learner.update = rank_rewards
    record["reinforce"] = [{a: m[a]["optimizer_steps"] for a in ("llm_0", "llm_1")}
                           for m in one.run()]
    record["reinforce_advantages"] = advantages
    # 5. a 2-rank DDP run killed after 2 iterations and resumed equals the uninterrupted run
    full = [numbers(m) for m in DistributedTrainer(config(model, "cory", t_rex=1), acc).run()]
    head_trainer = DistributedTrainer(config(model, "cory", t_rex=1), acc)
    head = [numbers(head_trainer.step()) for _ in range(2)]
    path = os.path.join(out, "resume.pt")
    head_trainer.save(path)
    tail_trainer = DistributedTrainer(config(model, "cory", t_rex=1), acc)
    assert tail_trainer.resume(path)
    record["resumed_equal"] = head + [numbers(m) for m in tail_trainer.run()] == full
    # 6. a checkpoint that only some ranks can see is refused on every rank
    local = path if trainer.rank == 0 else os.path.join(out, "not-on-this-node.pt")
    try:
        DistributedTrainer(config(model, "cory"), acc).resume(local)
        record["one_sided"] = "resumed"
    except FileNotFoundError as err:
        record["one_sided"] = str(err)
    record["fresh"] = DistributedTrainer(config(model, "cory"), acc).resume(
        os.path.join(out, "nowhere.pt"))
    with open(os.path.join(out, f"checks{trainer.rank}.json"), "w") as f:
        json.dump(record, f)


def fsdp_rank(model, out) -> None:
    """CORY under DDP, then under FSDP (uninterrupted, and saved + resumed), then MAPPO, then
    CORY under bf16 autocast with DDP and with FSDP."""
    from torch.distributed.tensor import DTensor

    from agents.distributed import DistributedTrainer, make_accelerator
    from agents.llm import speed

    acc = make_accelerator(cpu=True)

    def trainer(sharding, method="cory", iterations=3):
        cfg = config(model, method, t_rex=1, iterations=iterations)
        return DistributedTrainer(cfg, acc, sharding=sharding)

    record = {"metrics": {}}
    for name, sharding in (("ddp", "ddp"), ("fsdp", "fsdp")):
        t = trainer(sharding)
        record["metrics"][name] = [numbers(m) for m in t.run()]
        t.save(os.path.join(out, f"{name}.pt"))
    weight = trainer("fsdp").learner.policies["llm_0"].hf_model.transformer.h[0].mlp.c_fc.weight
    record["shard_rows"] = [weight.to_local().shape[0], weight.shape[0]] \
        if isinstance(weight, DTensor) else None
    head = trainer("fsdp")
    head.step()
    record["queries"] = [q.text for q in head.env.turn_batch("llm_0")["queries"]]
    head.step()
    head.save(os.path.join(out, "fsdp-head.pt"))
    tail = trainer("fsdp")
    tail.load(os.path.join(out, "fsdp-head.pt"))
    record["metrics"]["fsdp_resumed"] = [numbers(m) for m in tail.run()]
    tail.save(os.path.join(out, "fsdp-resumed.pt"))
    critic = trainer("fsdp", "cory-mappo", iterations=2)
    before = full_critic(critic)
    record["metrics"]["cory-mappo"] = [numbers(m) for m in critic.run()]
    record["critic_moved"] = float((full_critic(critic) - before).abs().max())
    for sharding in ("ddp", "fsdp"):  # bf16 autocast: the reference copy is stored in bf16
        cfg = config(model, "cory", t_rex=1, iterations=2, mixed_precision="bf16")
        t = DistributedTrainer(cfg, acc, sharding=sharding)
        record["metrics"][f"{sharding}_bf16"] = [numbers(m) for m in t.run()]
        frozen = speed.frozen_matmuls(t.learner.policies["llm_0"])
        record[f"{sharding}_bf16_frozen"] = sorted({str(m.weight.dtype) for m in frozen})
    with open(os.path.join(out, f"fsdp{critic.rank}.json"), "w") as f:
        json.dump(record, f)


# ----------------------------------------------------------------------------- tests

def launch(model, out, *flags, timeout: int = 240) -> None:
    """Run this file as the worker on 2 CPU ranks under torchrun; fail with their errors."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", os.path.abspath(__file__), "--model", model, "--out", str(out), *flags]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + "\n".join(
        line for line in proc.stderr.splitlines() if "Error" in line or "error" in line)[-6000:]


def test_two_cpu_ranks_share_weights_and_split_the_data(toy_lm, tmp_path):
    launch(toy_lm, tmp_path, timeout=180)
    r0, r1 = (json.load(open(tmp_path / f"cory{r}.json")) for r in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2
    # identical weights on both ranks after every iteration, and the updates did move them
    assert r0["init"] == r1["init"]
    assert r0["checksums"] == r1["checksums"]
    assert r0["checksums"][0] != r0["init"] and r0["checksums"][1] != r0["checksums"][0]
    # each rank saw its own prompts: disjoint within every iteration
    for q0, q1 in zip(r0["queries"], r1["queries"]):
        assert len(q0) == len(q1) == 8 and not set(q0) & set(q1)
    # role exchange happened on both ranks at iteration 1 (t_rex=1)
    for r in (r0, r1):
        assert [m["llm_1"]["role"] for m in r["local"]] == ["observer", "pioneer", "observer"]
    # iteration 2: rank 1's rewards are NaN, so BOTH ranks skipped every minibatch (no hang)
    for r in (r0, r1):
        for it in (0, 1):
            assert all(r["local"][it][a]["skipped_batches"] == 0 for a in ("llm_0", "llm_1"))
        for a in ("llm_0", "llm_1"):
            assert r["local"][2][a]["optimizer_steps"] == 0
            assert r["local"][2][a]["skipped_batches"] == 4  # 2 epochs x 2 minibatches
    assert r0["checksums"][2] == r0["checksums"][1]
    # metrics are averaged over ranks; the KL coefficient (global KL) agrees across ranks
    for it in range(3):
        for a in ("llm_0", "llm_1"):
            mean = (r0["local"][it][a]["task_reward"] + r1["local"][it][a]["task_reward"]) / 2
            assert r0["reduced"][it][a]["task_reward"] == pytest.approx(mean)
            assert r0["local"][it][a]["kl_coef"] == r1["local"][it][a]["kl_coef"]
    # one checkpoint, written by rank 0, with both ranks' RNG states
    state = torch.load(tmp_path / "cory.pt", weights_only=False)
    assert state["world_size"] == 2 and len(state["ranks"]) == 2 and state["iteration"] == 3
    # MAPPO: actors and the centralized critic stay identical, on disjoint data; at iteration 1
    # rank 1's NaN returns make both ranks skip every actor AND critic minibatch (no hang)
    m0, m1 = (json.load(open(tmp_path / f"cory-mappo{r}.json")) for r in (0, 1))
    assert m0["init"] == m1["init"] and m0["checksums"] == m1["checksums"]
    assert m0["checksums"][0] != m0["init"] and m0["checksums"][2] != m0["checksums"][1]
    assert m0["checksums"][1] == m0["checksums"][0]
    assert all(not set(q0) & set(q1) for q0, q1 in zip(m0["queries"], m1["queries"]))


def test_multi_rank_statistics_gradients_and_resume(toy_lm, tmp_path):
    """Two ranks: gradients, KL control, score statistics, REINFORCE's baseline, resume."""
    launch(toy_lm, tmp_path, "--checks", timeout=240)
    r0, r1 = (json.load(open(tmp_path / f"checks{r}.json")) for r in (0, 1))
    # DDP's gradient is the global batch's (a missing all-reduce, a double average or
    # accelerate's extra division by its accumulation steps would each change it)
    for r in (r0, r1):
        for steps in (1, 3):
            assert r[f"grad_scale_{steps}"] > 1e-4
            assert r[f"grad_diff_{steps}"] <= 1e-6 + 1e-4 * r[f"grad_scale_{steps}"], r
    # beta moved by the mean KL (1 and 20 -> 10.5 > target 6: the error clips at +0.2) on both
    # ranks; per-rank controllers would have moved down on rank 0 and up on rank 1
    n = 8 * 2  # the global batch
    for a in ("llm_0", "llm_1"):
        assert r0["kl_coef"][a] == r1["kl_coef"][a] == pytest.approx(0.05 * (1 + 0.2 * n / 100))
    # score statistics folded the global batch in, identically on both ranks
    for a in ("llm_0", "llm_1"):
        every = torch.tensor(r0["rewards"][a] + r1["rewards"][a], dtype=torch.float64)
        assert r0["score_stats"][a] == r1["score_stats"][a]
        assert r0["score_stats"][a]["count"] == 16
        assert r0["score_stats"][a]["mean"] == pytest.approx(float(every.mean()))
        assert r0["score_stats"][a]["var"] == pytest.approx(float(every.var(unbiased=False)))
    # one row per rank: REINFORCE's std comes from both rows, so nothing is skipped
    # (a per-rank baseline would give 0, or NaN and skipped steps)
    assert all(m[a] > 0 for r in (r0, r1) for m in r["reinforce"] for a in m)
    for r, sign in ((r0, -1), (r1, 1)):  # (r - 2) / 1.41, up to the small KL penalty
        assert all(a * sign == pytest.approx(0.7071, abs=0.05) for a in r["reinforce_advantages"])
    # resumed on two ranks: the same run; a checkpoint missing on a rank is refused by both
    assert r0["resumed_equal"] and r1["resumed_equal"]
    for r in (r0, r1):
        assert "exists on rank(s) [0] but not on rank(s) [1]" in r["one_sided"]
        assert r["fresh"] is False


def test_accelerate_gradient_accumulation_does_not_rescale_the_updates(toy_lm):
    """accelerator.backward divides by its gradient_accumulation_steps; the comm undoes it."""
    from agents.distributed import DDPComm, make_accelerator

    acc = make_accelerator(cpu=True)
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    grads = []
    for steps in (1, 4):
        acc.gradient_accumulation_steps = steps
        w.grad = None
        DDPComm(acc).backward((w * torch.tensor([3.0, 5.0])).sum())
        grads.append(w.grad.clone())
    acc.gradient_accumulation_steps = 1
    assert grads[0].tolist() == grads[1].tolist() == [3.0, 5.0]


def _tensors(obj, prefix=""):
    """Every tensor inside a (nested) checkpoint, by path."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {}
    out = {}
    for k, v in items:
        out.update(_tensors(v, f"{prefix}/{k}"))
    return out


def test_fsdp_matches_ddp_shards_the_weights_and_resumes_exactly(toy_lm, tmp_path):
    launch(toy_lm, tmp_path, "--fsdp", timeout=240)
    r0, r1 = (json.load(open(tmp_path / f"fsdp{r}.json")) for r in (0, 1))
    # each rank holds half of every sharded weight (dim 0 split over 2 ranks)
    assert r0["shard_rows"] == r1["shard_rows"] and r0["shard_rows"][0] * 2 == \
        r0["shard_rows"][1]
    assert not set(r0["queries"]) & set(r1["queries"])  # ranks saw different prompts
    ddp, fsdp = r0["metrics"]["ddp"], r0["metrics"]["fsdp"]
    for a, b in zip(ddp, fsdp):  # same episodes, same learning up to summation order
        for agent in ("llm_0", "llm_1"):
            assert a[agent]["role"] == b[agent]["role"]
            assert b[agent]["task_reward"] == pytest.approx(a[agent]["task_reward"], abs=1e-6)
            assert b[agent]["kl"] == pytest.approx(a[agent]["kl"], rel=1e-4, abs=1e-6)
    # checkpoints hold full tensors in the unsharded layout: FSDP's equal DDP's to rounding
    d = _tensors(torch.load(tmp_path / "ddp.pt", weights_only=False))
    f = _tensors(torch.load(tmp_path / "fsdp.pt", weights_only=False))
    weights = [k for k in d if k.startswith("/policies/") or "/optimizer/state/" in k]
    assert weights and set(weights) <= set(f)
    for k in weights:  # atol: the attention key bias has a zero gradient up to rounding, and
        assert f[k].shape == d[k].shape, k  # Adam turns that rounding noise into ~lr/100 steps
        assert torch.allclose(f[k].float(), d[k].float(), atol=5e-5, rtol=1e-4), k
    # killed after 2 iterations and resumed: the same run, bit for bit
    assert r0["metrics"]["fsdp"][:2] + r0["metrics"]["fsdp_resumed"] == r0["metrics"]["fsdp"]
    resumed = _tensors(torch.load(tmp_path / "fsdp-resumed.pt", weights_only=False))
    for k in weights:
        assert torch.equal(resumed[k], f[k]), k
    # MAPPO's sharded critic trains: its weights move and its loss changes between iterations
    assert r0["critic_moved"] > 1e-4 and r1["critic_moved"] == r0["critic_moved"]
    losses = [m["llm_0"]["critic_value_loss"] for m in r0["metrics"]["cory-mappo"]]
    assert all(math.isfinite(x) for x in losses) and losses[0] != losses[1]
    assert all(m["llm_0"]["critic_skipped_batches"] == 0 for m in r0["metrics"]["cory-mappo"])
    # under bf16 autocast the (sharded) reference copy is stored in bf16, and FSDP still
    # learns what DDP does
    assert r0["ddp_bf16_frozen"] == r0["fsdp_bf16_frozen"] == ["torch.bfloat16"]
    for a, b in zip(r0["metrics"]["ddp_bf16"], r0["metrics"]["fsdp_bf16"]):
        for agent in ("llm_0", "llm_1"):
            assert b[agent]["task_reward"] == pytest.approx(a[agent]["task_reward"], abs=1e-6)
            assert b[agent]["kl"] == pytest.approx(a[agent]["kl"], rel=1e-2, abs=1e-4)
            assert b[agent]["optimizer_steps"] > 0


def test_fsdp_checkpoint_loads_into_a_plain_trainer(toy_lm, tmp_path):
    """A full-tensor checkpoint (the FSDP layout) restores a single-process Trainer."""
    from agents.training.train import Trainer

    first = Trainer(config(toy_lm, "cory", task="toy"))
    first.step()
    first.save(str(tmp_path / "c.pt"))
    other = Trainer(config(toy_lm, "cory", task="toy"))
    other.load(str(tmp_path / "c.pt"))
    for a in ("llm_0", "llm_1"):
        for p, q in zip(first.learner.policies[a].trainable_parameters(),
                        other.learner.policies[a].trainable_parameters()):
            assert torch.equal(p, q)


def test_fsdp_without_a_launcher_says_how_to_start(toy_lm):
    from agents.distributed import DistributedTrainer, make_accelerator

    with pytest.raises(ValueError, match="needs a process group: start the script with torchrun"):
        DistributedTrainer(config(toy_lm, "cory", task="toy"), make_accelerator(cpu=True),
                           sharding="fsdp")
    with pytest.raises(ValueError, match="sharding must be 'ddp' or 'fsdp', got 'zero3'"):
        DistributedTrainer(config(toy_lm, "cory", task="toy"), make_accelerator(cpu=True),
                           sharding="zero3")


def test_fsdp_refuses_what_it_cannot_shard():
    from types import SimpleNamespace

    from agents.distributed.fsdp import check_shardable

    base = object()
    with pytest.raises(ValueError, match="llm_0 and llm_1 share one base model"):
        check_shardable({"llm_0": SimpleNamespace(model=base, is_quantized=False),
                         "llm_1": SimpleNamespace(model=base, is_quantized=False)})
    with pytest.raises(ValueError, match=r"4-bit weights \(llm_1\)"):
        check_shardable({"llm_0": SimpleNamespace(model=object(), is_quantized=False),
                         "llm_1": SimpleNamespace(model=object(), is_quantized=True)})


def test_a_token_cap_or_compiled_passes_are_refused_across_processes():
    from agents.distributed.trainer import check_single_process_options
    from agents.learners.ppo_config import PPOConfig
    from agents.training.config import TrainConfig

    capped = TrainConfig(batch_size=8, ppo=PPOConfig(mini_batch_size=8,
                                                     max_tokens_per_pass=256))
    with pytest.raises(ValueError, match="ppo.max_tokens_per_pass=256 is single-proc"):
        check_single_process_options(capped)
    with pytest.raises(ValueError, match="torch_compile=True is single-process only"):
        check_single_process_options(TrainConfig(torch_compile=True))
    check_single_process_options(TrainConfig())  # the default is fine


def test_one_process_equals_the_plain_trainer(toy_lm):
    from agents.distributed import DistributedTrainer, SyncedPolicy, make_accelerator
    from agents.training.train import Trainer

    plain = [numbers(m) for m in Trainer(config(toy_lm, "cory", task="toy")).run()]
    dist = DistributedTrainer(config(toy_lm, "cory", task="toy"), make_accelerator(cpu=True))
    assert all(isinstance(a.policy, SyncedPolicy) for a in dist.learner.agents.values())
    assert [numbers(m) for m in dist.run()] == plain


@pytest.mark.parametrize("method", ["cory", "cory-mappo"])
def test_distributed_checkpoint_resumes_exactly(toy_lm, tmp_path, method):
    from agents.distributed import DistributedTrainer, make_accelerator

    acc = make_accelerator(cpu=True)
    full = [numbers(m) for m in DistributedTrainer(config(toy_lm, method, t_rex=1), acc).run()]
    first = DistributedTrainer(config(toy_lm, method, t_rex=1), acc)
    head = [numbers(first.step()) for _ in range(2)]
    first.save(str(tmp_path / "ckpt.pt"))
    resumed = DistributedTrainer(config(toy_lm, method, t_rex=1), acc)
    resumed.load(str(tmp_path / "ckpt.pt"))
    assert head + [numbers(m) for m in resumed.run()] == full


def test_sharded_queries_split_each_global_batch():
    from agents.distributed import ShardedQueries

    shards = [ShardedQueries(10, 3, r, 3, seed=1) for r in range(3)]
    for it in range(4):
        got = [s(it) for s in shards]
        flat = [i for g in got for i in g]
        assert all(len(g) == 3 for g in got)
        if it == 0:  # the first 9 positions of one permutation: all distinct
            assert len(set(flat)) == 9
    # a pure function of the iteration: resumable without state
    assert shards[1](3) == ShardedQueries(10, 3, 1, 3, seed=1)(3)
    # one process, batch 1: nine iterations visit each of nine queries once
    assert sorted(ShardedQueries(9, 1, 0, 1)(it)[0] for it in range(9)) == list(range(9))


def test_metric_reduction():
    from agents.distributed import reduce_metrics

    a = {"llm_0": {"task_reward": 1.0, "role": "pioneer", "samples": ["x"]}, "iteration": 3,
         "time_update_s": 1.0}
    b = {"llm_0": {"task_reward": 3.0, "role": "pioneer", "samples": ["y"]}, "iteration": 3,
         "time_update_s": 2.0}
    out = reduce_metrics([a, b])
    assert out == {"llm_0": {"task_reward": 2.0, "role": "pioneer", "samples": ["x"]},
                   "iteration": 3, "time_update_s": 2.0}


def test_entry_point_rejects_a_bad_config_before_loading(monkeypatch, capsys):
    from agents.distributed import __main__ as distributed

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(distributed, "DistributedTrainer", boom)
    for argv, message in ((["--task", "nope", "--cpu"], "unknown task 'nope'"),
                          (["--task", "toy", "--batch-size", "12", "--mini-batch-size", "8"],
                           "batch_size=12 must be divisible"),
                          (["--iteration", "2"], "unrecognized arguments: --iteration")):
        with pytest.raises(SystemExit):
            distributed.main(argv)
        assert message in capsys.readouterr().err


def test_entry_point_logs_every_iteration_and_resumes(toy_lm, tmp_path):
    from agents.distributed import __main__ as distributed

    args = ["--task", "toy", "--model", toy_lm, "--batch-size", "8", "--mini-batch-size", "4",
            "--ppo-epochs", "1", "--cpu", "--out", str(tmp_path), "--save-every", "1"]
    assert distributed.main([*args, "--iterations", "2"]) == 0
    with open(tmp_path / "metrics.jsonl", "a") as f:  # a crash mid-write leaves a cut line
        f.write('{"iteration": 2, "llm_0": {"task_re')
    assert distributed.main([*args, "--iterations", "3", "--resume"]) == 0
    lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert [m["iteration"] for m in lines] == [0, 1, 2]
    assert all(m["world_size"] == 1 for m in lines)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["iteration"] == 3


def test_placement_puts_each_module_where_asked(toy_lm):
    from agents.training.train import Trainer

    where = {"llm_0": "cpu", "llm_1": "cpu", "critic": "cpu"}
    trainer = Trainer(config(toy_lm, "cory-mappo", task="toy", iterations=1, placement=where))
    learner = trainer.learner
    for agent in ("llm_0", "llm_1"):
        policy = learner.policies[agent]
        assert policy.device == torch.device(where[agent])
        assert {p.device for p in policy.parameters()} == {torch.device(where[agent])}
        assert next(policy.ref_model.parameters()).device == torch.device(where[agent])
    assert learner.critic.device == torch.device(where["critic"])
    assert trainer.step()["llm_0"]["optimizer_steps"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
def test_placement_on_cuda(toy_lm):
    from agents.training.train import Trainer

    where = {"llm_0": "cuda:0", "llm_1": "cpu"}
    trainer = Trainer(config(toy_lm, "cory", task="toy", iterations=1, placement=where))
    for agent, dev in where.items():
        assert trainer.learner.policies[agent].device == torch.device(dev)
        assert next(trainer.learner.policies[agent].ref_model.parameters()).device == \
            torch.device(dev)
    assert trainer.step()["llm_0"]["optimizer_steps"] > 0


def test_query_list_holds_words_of_the_toy_vocabulary():
    vocab = set(WORDS)
    for q in ShardToyTask().load_queries("train"):
        assert isinstance(q, Query) and set(q.text.split()) <= vocab


if __name__ == "__main__":
    worker(sys.argv[1:])
