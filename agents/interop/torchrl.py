"""The CORY env under TorchRL (0.14): its own `PettingZooWrapper`, and IPPO built from TorchRL's
parts (`ProbabilisticActor`, `ValueOperator`, `ClipPPOLoss`, GAE) that learns the course task.

    env = torchrl_env(task="course")                   # AEC; parallel=True, n_agents=3, rounds=2
    td = env.rollout(8)                                # TorchRL's rollout, one group per agent
    result = train_course_torchrl(seed=0)              # {"random": ..., "trained": ..., ...}

What the wrapper needs (`NumericInfos`): TorchRL turns every info into a tensor, and the env's
infos hold text (`role`, `response`) and None (`task_reward` before the reward). Here they are
numbers: `position` (0: the pioneer), `acting` (1 while the agent's action is the one applied),
`task_reward` (NaN until known) and `truncated_prompt_tokens`.

Which actions count. In AEC mode TorchRL's per-group `mask` is True for the acting agent only,
as PettingZoo's turn order says. In parallel mode (`parallel=True`) every agent of the episode
is alive, so TorchRL's `mask` stays True for all, but the env applies only the acting agent's
action (PettingZoo's turn-based conversion): the info `acting` says whose it was, and a learner
must weigh its loss by it. Each agent is its own group in both modes (`group_map`), so a
group's tensors are one agent's.

The learner (`train_course_torchrl`): each agent's own acting steps, in order, are its
trajectory; a reward paid while the agent waits (CORY's collective reward arrives on the
observer's last token) is credited to its latest action, so the pioneer learns from the team's
reward. GAE (γ = 1, λ = 0.95) over those steps, then TorchRL's clipped PPO loss, per agent.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from pettingzoo.utils.wrappers import BaseParallelWrapper, BaseWrapper
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import Categorical
from torchrl.envs import MarlGroupMapType, PettingZooWrapper
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value.functional import generalized_advantage_estimate

import cory_env


def numeric_info(info: dict, acting: bool) -> dict:
    """An env info as numbers TorchRL can stack (see the module docstring)."""
    role = info.get("role") or "pioneer"
    position = 0 if role == "pioneer" else 1 if role == "observer" else int(role.split("_")[1])
    reward = info.get("task_reward")
    return {"position": np.int64(position), "acting": np.int64(acting),
            "task_reward": np.float32(math.nan if reward is None else reward),
            "truncated_prompt_tokens": np.int64(info.get("truncated_prompt_tokens") or 0)}


class NumericInfos(BaseWrapper):
    """The AEC env with numeric infos (`numeric_info`)."""

    @property
    def infos(self) -> dict:
        """Every agent's info, as numbers."""
        acting = self.env.agent_selection if self.env.agents else None
        return {a: numeric_info(i, a == acting) for a, i in self.env.infos.items()}

    def last(self, observe: bool = True):
        """PettingZoo's `last`, its info as numbers."""
        obs, reward, term, trunc, info = super().last(observe)
        return obs, reward, term, trunc, numeric_info(info, True)


class NumericParallelInfos(BaseParallelWrapper):
    """The parallel env with numeric infos; `acting` marks whose action the next step applies."""

    def _numeric(self, infos: dict) -> dict:
        aec = self.env.aec_env
        acting = aec.agent_selection if aec.agents else None
        return {a: numeric_info(i, a == acting) for a, i in infos.items()}

    def reset(self, seed=None, options=None):
        """Reset, infos as numbers."""
        obs, infos = self.env.reset(seed=seed, options=options)
        return obs, self._numeric(infos)

    def step(self, actions):
        """Step, infos as numbers."""
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        return obs, rewards, terms, truncs, self._numeric(infos)


def torchrl_env(parallel: bool = False, seed: int | None = None, **config) -> PettingZooWrapper:
    """The CORY env (`cory_env.env(**config)`, or the parallel env) under TorchRL's own
    `PettingZooWrapper`: one group per agent, token actions as categorical indices."""
    if parallel:
        env = NumericParallelInfos(cory_env.parallel_env(**config))
    else:
        env = NumericInfos(cory_env.env(**config))
    return PettingZooWrapper(env=env, use_mask=True, categorical_actions=True, seed=seed,
                             group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT)


class TokenNet(nn.Module):
    """Embeddings of the observed token ids, averaged over the attended ones, then an MLP."""

    def __init__(self, vocab: int, out: int, width: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, out))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(..., L) ids and mask -> (..., out)."""
        m = mask.float().unsqueeze(-1)
        pooled = (self.embed(ids.long()) * m).sum(-2) / m.sum(-2).clamp_min(1.0)
        return self.mlp(pooled)


OBS = ("observation", "observation")


def agent_modules(group: str, vocab: int) -> tuple[ProbabilisticActor, ValueOperator]:
    """One agent's actor and critic over its group's keys (TorchRL's modules)."""
    keys = [(group, *OBS, "input_ids"), (group, *OBS, "attention_mask")]
    actor = ProbabilisticActor(
        TensorDictModule(TokenNet(vocab, vocab), in_keys=keys, out_keys=[(group, "logits")]),
        in_keys={"logits": (group, "logits")}, out_keys=[(group, "action")],
        distribution_class=Categorical, return_log_prob=True,
        log_prob_key=(group, "action_log_prob"))
    critic = ValueOperator(TokenNet(vocab, 1), in_keys=keys, out_keys=[(group, "state_value")])
    return actor, critic


def agent_steps(td: TensorDict, group: str) -> TensorDict:
    """One agent's own acting steps of a rollout (the mask, or the `acting` info), each with
    the rewards paid to it until its next action; `done` on its episode's last one."""
    acting = td[group, "info", "acting"].reshape(-1).bool() if (group, "info", "acting") in \
        td.keys(True) else td[group, "mask"].reshape(-1)
    rewards = td["next", group, "reward"].reshape(-1)
    ends = td["next", "done"].reshape(-1)
    idx = acting.nonzero().squeeze(-1)
    paid = torch.zeros(len(idx))
    done = torch.zeros(len(idx), dtype=torch.bool)
    for j, start in enumerate(idx.tolist()):
        stop = idx[j + 1].item() if j + 1 < len(idx) else len(rewards)
        cut = ends[start:stop].nonzero()  # the episode ends before the agent acts again
        stop = start + int(cut[0]) + 1 if len(cut) else stop
        paid[j] = rewards[start:stop].sum()
        done[j] = bool(len(cut)) or j + 1 == len(idx)
    steps = td[idx][group][:, 0].select(*[k[1:] for k in agent_keys(group)], "action",
                                        "action_log_prob", strict=False)  # its one agent
    return TensorDict({group: steps, "reward": paid.unsqueeze(-1),
                       "done": done.unsqueeze(-1)}, batch_size=[len(idx)])


def agent_keys(group: str) -> list[tuple]:
    """The observation keys of a group."""
    return [(group, *OBS, "input_ids"), (group, *OBS, "attention_mask")]


@dataclass
class TorchRLConfig:
    """IPPO on the course task from TorchRL's parts."""

    iterations: int = 30
    episodes: int = 32  # per iteration
    epochs: int = 4
    lr: float = 3e-3
    clip: float = 0.2
    entropy: float = 0.01
    lam: float = 0.95


def train_course_torchrl(seed: int = 0, cfg: TorchRLConfig | None = None) -> dict:
    """Train both agents of the course task with TorchRL-built IPPO on the team reward
    (r_pio + r_obs, paid to both); returns the mean team reward of each iteration's sampled
    episodes, the first ("random") and the mean of the last three ("trained")."""
    cfg = cfg or TorchRLConfig()
    torch.manual_seed(seed)
    env = torchrl_env(task="course", seed=seed)
    vocab = env.action_spec[env.group_map[next(iter(env.group_map))][0], "action"].space.n
    groups = list(env.group_map)
    modules = {g: agent_modules(g, vocab) for g in groups}
    losses = {g: ClipPPOLoss(a, c, clip_epsilon=cfg.clip, entropy_coeff=cfg.entropy,
                             normalize_advantage=True) for g, (a, c) in modules.items()}
    for g, loss in losses.items():
        loss.set_keys(action=(g, "action"), sample_log_prob=(g, "action_log_prob"),
                      value=(g, "state_value"), advantage="advantage",
                      value_target="value_target")
    optim = {g: torch.optim.Adam(losses[g].parameters(), lr=cfg.lr) for g in groups}
    policy = _joint_policy(modules)
    curve = []
    for _ in range(cfg.iterations):
        data = [env.rollout(64, policy, break_when_any_done=True) for _ in range(cfg.episodes)]
        curve.append(float(np.mean([np.mean([float(td["next", g, "reward"].sum())
                                             for g in groups]) for td in data])))
        for g in groups:
            batch = torch.cat([agent_steps(td, g) for td in data])
            _ppo(batch, g, modules[g][1], losses[g], optim[g], cfg)
    return {"config": asdict(cfg), "random": curve[0], "trained": float(np.mean(curve[-3:])),
            "curve": curve}


def _joint_policy(modules: dict):
    """A policy acting for every group at once (each group's mask says who acts)."""
    def act(td: TensorDict) -> TensorDict:
        with torch.no_grad():
            for actor, _ in modules.values():
                actor(td)
        return td
    return act


def _ppo(batch: TensorDict, group: str, critic, loss: ClipPPOLoss, optim, cfg) -> None:
    """GAE over the agent's own steps, then `epochs` of the clipped loss on the whole batch."""
    with torch.no_grad():
        value = critic(batch.clone())[group, "state_value"]
        nxt = torch.cat([value[1:], torch.zeros_like(value[:1])])
        done = batch["done"]
        adv, target = generalized_advantage_estimate(1.0, cfg.lam, value, nxt, batch["reward"],
                                                     done, done, time_dim=0)
    batch["advantage"], batch["value_target"] = adv, target
    for _ in range(cfg.epochs):
        out = loss(batch)
        total = out["loss_objective"] + out["loss_critic"] + out.get("loss_entropy", 0.0)
        optim.zero_grad()
        total.backward()
        optim.step()
