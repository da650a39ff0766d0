"""Train on the CORY env with Tianshou 2.0.1's own collectors and PPO, on the TEAM reward.

Why an adapter (thu-ml/tianshou#399): `tianshou.env.PettingZooEnv.step` returns a per-agent
reward vector, and Tianshou's multi-agent algorithms give each agent only its own column on its
own transitions. In CORY the collective reward arrives once, on the observer's last token, so
the pioneer's transitions all carry 0 and the pioneer never learns.

The fix used here:

* `TeamRewardPettingZooEnv` is a `PettingZooEnv` whose `step` returns ONE scalar, the team
  reward (by default the mean of the agents' instantaneous rewards, which under CORY's
  `reward_mode="collective"` is exactly r_pio + r_obs);
* ONE on-policy algorithm (Tianshou's `PPO`) trains both agents. Its actor and its critic
  (`TokenActor`, `TokenCritic`) are each an embedding + MLP trunk shared by the agents with one
  head per agent, and route every row to the head of the agent named in `obs.agent_id`. The
  buffer holds the episode as it happened (pioneer tokens, then observer tokens), so GAE runs
  over the whole interleaved episode and the team reward flows back to the pioneer's tokens.

    result = train_course(seed=0, epochs=4)   # {"random": ..., "trained": ..., ...}
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from tianshou.algorithm import PPO
from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv, PettingZooEnv
from tianshou.trainer import OnPolicyTrainerParams
from torch import nn

import cory_env
from cory_env.core import role_names

REDUCTIONS = ("mean", "sum")


class TeamRewardPettingZooEnv(PettingZooEnv):
    """A Tianshou `PettingZooEnv` whose `step` returns the scalar team reward.

    Observations keep Tianshou's layout, `{"agent_id", "obs", "mask"}`, with `obs` the inner
    `{"input_ids", "attention_mask"}` dict of the CORY env (the `"observation"` entry).
    `reduction="mean"` suits envs that already pay every agent the team reward (CORY's
    collective mode); `"sum"` suits envs that pay individual rewards.

    Infos: Tianshou's trainer rejects a buffer holding None (pandas `isnull`), and CORY's infos
    hold None until a turn is scored, so None values are replaced: `task_reward` -> 0.0,
    `response` -> "", any other key -> `null_defaults.get(key, "")`.
    """

    def __init__(self, env, reduction: str = "mean", null_defaults: dict | None = None):
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        self.null_defaults = {"task_reward": 0.0, "response": "", **(null_defaults or {})}
        super().__init__(env)
        self._all_legal = np.ones(self.action_space.n, dtype=bool)

    def _tianshou_obs(self, observation) -> dict:
        """Tianshou's `{"agent_id", "obs", "mask"}` view of a PettingZoo observation."""
        inner = observation
        if isinstance(observation, dict) and "observation" in observation:
            inner = observation["observation"]
        mask = getattr(self, "_all_legal", None)
        if isinstance(observation, dict) and "action_mask" in observation:
            mask = np.asarray(observation["action_mask"]) == 1
        elif mask is None:  # during PettingZooEnv.__init__'s reset
            mask = np.ones(self.action_space.n, dtype=bool)
        return {"agent_id": self.env.agent_selection, "obs": inner, "mask": mask}

    def _tianshou_info(self, info: dict) -> dict:
        """A copy of an info dict without None values (see the class docstring)."""
        return {k: self.null_defaults.get(k, "") if v is None else v for k, v in info.items()}

    def reset(self, *args: Any, **kwargs: Any) -> tuple[dict, dict]:
        """Reset the wrapped env; return the first agent's observation and info."""
        self.env.reset(*args, **kwargs)
        observation, _, _, _, info = self.env.last()
        return self._tianshou_obs(observation), self._tianshou_info(info)

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Step the selected agent; return (next obs, team reward, term, trunc, info)."""
        self.env.step(action)
        observation, _, term, trunc, info = self.env.last()
        team = self.team_reward()
        return self._tianshou_obs(observation), team, term, trunc, self._tianshou_info(info)

    def team_reward(self) -> float:
        """The reduction of every agent's instantaneous reward at the last step."""
        values = [float(r) for r in self.env.rewards.values()]
        if not values:
            return 0.0
        return float(np.sum(values) if self.reduction == "sum" else np.mean(values))


# -- networks ---------------------------------------------------------------------------------
class TokenNet(nn.Module):
    """Embedding + MLP over fixed-size token ids (masked), with one output head per agent."""

    def __init__(self, vocab: int, length: int, out_dim: int, agents: list[str],
                 embed_dim: int = 16, hidden: int = 64):
        super().__init__()
        self.agents = list(agents)
        self.embed = nn.Embedding(vocab, embed_dim)
        self.trunk = nn.Sequential(nn.Linear(length * embed_dim, hidden), nn.ReLU(),
                                   nn.Linear(hidden, hidden), nn.ReLU())
        self.heads = nn.ModuleList(nn.Linear(hidden, out_dim) for _ in self.agents)

    def agent_index(self, agent_id) -> torch.Tensor:
        """Map a batch of agent names to head indices (unknown names raise ValueError)."""
        names = np.asarray(agent_id).reshape(-1)
        index = np.full(len(names), -1, dtype=np.int64)
        for i, agent in enumerate(self.agents):
            index[names == agent] = i
        if (index < 0).any():
            raise ValueError(f"unknown agent_id {names[index < 0][0]!r}; known: {self.agents}")
        return torch.from_numpy(index)

    def forward(self, obs) -> torch.Tensor:
        """(B, out_dim): each row through the head of the agent in `obs.agent_id`."""
        device = self.embed.weight.device
        ids = torch.as_tensor(obs.obs.input_ids, dtype=torch.long, device=device)
        mask = torch.as_tensor(obs.obs.attention_mask, dtype=torch.float32, device=device)
        feats = self.trunk((self.embed(ids) * mask.unsqueeze(-1)).flatten(1))
        every_head = torch.stack([head(feats) for head in self.heads])  # (n_agents, B, out)
        rows = torch.arange(feats.shape[0], device=device)
        return every_head[self.agent_index(obs.agent_id).to(device), rows]


class TokenActor(nn.Module):
    """Tianshou actor: obs -> (masked logits over the vocabulary, state)."""

    def __init__(self, net: TokenNet):
        super().__init__()
        self.net = net

    def forward(self, obs, state=None, info=None):
        """Logits of the acting agent's head; illegal actions (obs.mask False) get -inf."""
        logits = self.net(obs)
        mask = obs.get("mask", None) if isinstance(obs, Batch) else None
        if mask is not None:
            legal = torch.as_tensor(np.asarray(mask, dtype=bool), device=logits.device)
            logits = logits.masked_fill(~legal, float("-inf"))
        return logits, state


class TokenCritic(nn.Module):
    """Tianshou critic: obs -> (B, 1) value of the acting agent's head."""

    def __init__(self, net: TokenNet):
        super().__init__()
        self.net = net

    def forward(self, obs, **kwargs) -> torch.Tensor:
        """The value estimate (of the team return) for each row."""
        return self.net(obs)


# -- the course recipe ------------------------------------------------------------------------
@dataclass
class CourseTrainConfig:
    """Settings of `train_course`: env, network, PPO and evaluation."""

    seed: int = 0
    epochs: int = 4
    epoch_num_steps: int = 2048  # env steps (tokens of both agents) per epoch
    collection_step_num_env_steps: int = 512
    num_envs: int = 8
    batch_size: int = 64
    update_repeats: int = 8
    lr: float = 3e-3
    embed_dim: int = 16
    hidden: int = 64
    gamma: float = 1.0
    gae_lambda: float = 1.0  # episodes are 2-4 tokens: Monte-Carlo advantages
    eps_clip: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    knowledge_transfer: bool = True
    rotation: int = 0  # the agent order: llm_r plays the pioneer
    n_agents: int = 2  # a chain of K course agents
    eval_episodes: int = 128
    eval_seed: int = 10_000


def make_course_env(cfg: CourseTrainConfig, seed: int | None = None) -> TeamRewardPettingZooEnv:
    """The course AEC env (collective reward) wrapped for Tianshou."""
    return TeamRewardPettingZooEnv(cory_env.env(
        task="course", knowledge_transfer=cfg.knowledge_transfer, rotation=cfg.rotation,
        reward_mode="collective", seed=seed, n_agents=cfg.n_agents))


def build_ppo(env: TeamRewardPettingZooEnv, cfg: CourseTrainConfig) -> PPO:
    """Tianshou PPO with a routed `TokenActor` / `TokenCritic` pair for the env's agents."""
    vocab = int(env.action_space.n)
    length = int(env.observation_space["observation"]["input_ids"].shape[0])
    agents = list(env.agents)
    actor = TokenActor(TokenNet(vocab, length, vocab, agents, cfg.embed_dim, cfg.hidden))
    critic = TokenCritic(TokenNet(vocab, length, 1, agents, cfg.embed_dim, cfg.hidden))
    policy = DiscreteActorPolicy(actor=actor, action_space=env.action_space,
                                 deterministic_eval=True)
    return PPO(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=cfg.lr),
               eps_clip=cfg.eps_clip, vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
               gae_lambda=cfg.gae_lambda, gamma=cfg.gamma, max_grad_norm=0.5)


def evaluate(policy, cfg: CourseTrainConfig, episodes: int | None = None,
             seed: int | None = None) -> dict[str, float]:
    """Mean team reward and each role's over fixed episodes; `policy=None` is random.

    Episode i asks query i mod (number of queries), so two calls with the same settings see
    the same queries; the random policy draws its tokens from a generator seeded with `seed`.
    """
    episodes = cfg.eval_episodes if episodes is None else episodes
    seed = cfg.eval_seed if seed is None else seed
    env = make_course_env(cfg, seed=seed)
    raw = env.env.unwrapped
    n_queries = len(raw.task.queries("train"))
    rng = np.random.default_rng(seed)
    team, roles = [], {role: [] for role in role_names(cfg.n_agents)}
    if policy is not None:
        was_training = policy.training
        policy.eval()
    with torch.no_grad():
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i, options={"queries": [i % n_queries]})
            done, reward = False, 0.0
            while not done:
                if policy is None:
                    act = int(rng.integers(env.action_space.n))
                else:
                    act = int(policy(Batch(obs=[obs], info=[{}])).act[0])
                obs, reward, term, trunc, _ = env.step(act)
                done = term or trunc
            team.append(reward)
            for info in raw.infos.values():
                roles[info["role"]].append(info["task_reward"])
    if policy is not None and was_training:
        policy.train()
    return {"team": float(np.mean(team)), **{k: float(np.mean(v)) for k, v in roles.items()}}


def train_course(seed: int = 0, epochs: int = 4, **overrides) -> dict:
    """Train Tianshou PPO on the course task; return random vs trained team reward and stats.

    `overrides` are `CourseTrainConfig` fields. The result holds `random` and `trained` (mean
    team reward over the same evaluation episodes), per-role task rewards, `seconds` (training
    wall time), `env_steps`, the config and the trained Tianshou `algorithm`.
    """
    cfg = CourseTrainConfig(seed=seed, epochs=epochs, **overrides)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    envs = DummyVectorEnv([
        (lambda i=i: make_course_env(cfg, seed=cfg.seed * 1000 + i)) for i in range(cfg.num_envs)
    ])
    algorithm = build_ppo(make_course_env(cfg), cfg)
    random_eval = evaluate(None, cfg)
    buffer = VectorReplayBuffer(cfg.collection_step_num_env_steps + 16 * cfg.num_envs,
                                cfg.num_envs)
    collector = Collector(algorithm, envs, buffer)
    collector.reset()
    start = time.perf_counter()
    stats = algorithm.run_training(OnPolicyTrainerParams(
        training_collector=collector,
        max_epochs=cfg.epochs,
        epoch_num_steps=cfg.epoch_num_steps,
        collection_step_num_env_steps=cfg.collection_step_num_env_steps,
        batch_size=cfg.batch_size,
        update_step_num_repetitions=cfg.update_repeats,
        test_collector=None,
        verbose=False,
        show_progress=False,
    ))
    seconds = time.perf_counter() - start
    trained_eval = evaluate(algorithm.policy, cfg)
    envs.close()
    return {
        "random": random_eval["team"],
        "trained": trained_eval["team"],
        "random_roles": {k: v for k, v in random_eval.items() if k != "team"},
        "trained_roles": {k: v for k, v in trained_eval.items() if k != "team"},
        "seconds": seconds,
        "env_steps": int(stats.train_step),
        "config": asdict(cfg),
        "algorithm": algorithm,
    }
