"""Roll LLM policies through the batched CORY env and record each agent's turn as tensors.

One rollout = B episodes: the pioneer's turn (KV-cached decoding, one forward per token), then
the observer's turn on the prompts the env built from the pioneer's tokens (with rounds, the
chain again, R times; an agent's R turns are stacked as R blocks of B rows). The log-prob, value
and raw log-softmax of every token come from the same forward pass that sampled it; the
reference model runs once per turn as one batched pass, giving the exact per-token KL. Where
decoding's numerics differ from a full pass (a 4-bit base, mixed precision), the policy's
numbers come from a no-grad full pass shaped like the reference's instead, so the KL of an
unchanged policy is exactly 0 in every precision. A policy that decodes on the fast path
(`agents.llm.engine`) also records the sampler's log-prob of each token and the exact KL
from the sampler's distribution to the trainer's (`sampler_logprobs`, `sampler_kl`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np
import torch

from cory_env import BatchedCoryEnv

from .engine import decodes_fast
from .logits import kl_to_reference
from .sampling import Step

CHUNK = 32  # rows of one reference (and, where needed, full) pass


@dataclass
class Turn:
    """One agent's finished turns of one rollout: its turn in each of the B episodes, per-token
    tensors (B, T); with R rounds, its turns of every round stacked, (R * B, T), round-major."""

    agent: str
    role: str
    input_ids: torch.Tensor  # (B, P + T): prompt right-aligned, then the response
    attention_mask: torch.Tensor  # (B, P + T)
    response_mask: torch.Tensor  # (B, T) float
    logprobs: torch.Tensor  # under the distribution sampled from
    raw_logprobs: torch.Tensor  # under the untransformed policy
    values: torch.Tensor
    ref_logprobs: torch.Tensor
    full_kl: torch.Tensor  # exact KL(pi || pi_ref) at each response position
    task_reward: torch.Tensor  # (B,) this agent's own task reward
    reward: torch.Tensor  # (B,) what the env paid it: collective or individual
    texts: list[str]
    query_index: torch.Tensor | None = None  # (B,) each episode's query in the pool (-1: none)
    group_size: int = 1  # G: rows [kG, (k+1)G) answer the same query
    pool_size: int = 0  # how many queries the split holds
    position: int = 0  # the agent's place in the chain this rollout (0: the pioneer)
    prompt_cut: torch.Tensor | None = None  # (B,) prompt tokens cut on the left to fit
    rounds: int = 1  # how many of the agent's turns are stacked (row blocks of B)
    sampler_logprobs: torch.Tensor | None = None  # the fast path's log-probs (None: exact path)
    sampler_kl: torch.Tensor | None = None  # KL(sampler || trainer) per token (fast path)

    @property
    def groups(self) -> int:
        """How many groups (distinct queries) the batch holds."""
        return self.response_mask.shape[0] // self.group_size

    @property
    def lengths(self) -> torch.Tensor:
        """Response lengths in tokens (EOS included)."""
        return self.response_mask.sum(1)

    def to(self, device) -> Turn:
        """A copy with every tensor on device."""
        return Turn(**{f.name: (v.to(device) if torch.is_tensor(v) else v)
                       for f in fields(self) for v in [getattr(self, f.name)]})


def shared_prompts(ids: torch.Tensor, mask: torch.Tensor, group: int) -> int:
    """`group` if every group of that many consecutive rows holds one prompt, else 1."""
    if group <= 1 or ids.shape[0] % group:
        return 1
    same = all(torch.equal(x.view(-1, group, x.shape[1]),
                           x[::group, None].expand(-1, group, -1)) for x in (ids, mask))
    return group if same else 1


@torch.inference_mode()
def play_turn(env: BatchedCoryEnv, policy, sampling=None,
              generator: torch.Generator | None = None,
              forced: torch.Tensor | None = None, share: bool = True) -> list[Step]:
    """Play the env's current turn for every episode with `policy`; return its sampled steps.

    Decodes with `decode` until the turn ends. In a group rollout whose prompts repeat
    (the pioneer's turn), each distinct prompt is passed once and its cache shared by the G
    answers (`share=False`: one pass per row). `forced` (B, T) token ids are played instead,
    with no model pass (and no steps returned).
    """
    turn = env.turn_index
    if forced is not None:
        t = 0
        while not env.finished and env.turn_index == turn:
            env.step(forced[:, t])
            t += 1
        return []
    obs, device = env.observe(), policy.device
    P, T = env.prompt_len, env.max_new_tokens
    ids, mask = obs["input_ids"].to(device), obs["attention_mask"].to(device)
    G = shared_prompts(ids[:, :P], mask[:, :P], getattr(env, "group_size", 1)) if share else 1

    def play(token):  # step the env; the rows that wrote this token, or None when it is over
        nonlocal obs
        active = obs["active"].to(device)
        obs, *_ = env.step(token)
        return None if env.finished or env.turn_index != turn else active

    return decode(policy, ids[::G, :P], mask[::G, :P], T, play, sampling, generator, repeat=G)


@torch.inference_mode()
def decode(policy, ids, mask, max_new_tokens: int, play, sampling=None,
           generator: torch.Generator | None = None, repeat: int = 1) -> list[Step]:
    """The one decode loop of the project: the (B, P) prompt pass once (KV cache), then per
    token one sample and, unless `play(token)` says the turn is over (None), one cached step
    for the rows it returns as active."""
    state = policy.begin(ids, mask, sampling, max_new_tokens=max_new_tokens, repeat=repeat)
    steps = []
    while True:
        step = policy.sample(state, generator)
        steps.append(step)
        active = play(step.token)
        if active is None:
            return steps
        policy.feed(state, step.token, active)


@torch.inference_mode()
def rollout(env: BatchedCoryEnv, policies: Mapping[str, object], sampling=None,
            generator: torch.Generator | None = None, reset_options: dict | None = None,
            seed: int | None = None) -> dict[str, Turn]:
    """Play one batch of episodes; return each agent's Turn (keys: env.agents)."""
    env.reset(seed=seed, options=reset_options)
    T = env.max_new_tokens
    partial: dict[str, list[dict]] = {}
    while not env.finished:
        agent, role = env.agent_selection, env.role
        policy = policies[agent]
        steps = play_turn(env, policy, sampling, generator)
        # Finish the turn's tensors now, so its (B, V) log-softmaxes are freed before the next turn.
        partial.setdefault(agent, []).append(
            _turn_tensors(env, agent, role, steps, policy, T, sampling))
        del steps
    ep, out = env.episodes, {}
    for position, agent in enumerate(env.agents):
        parts, turns = partial.setdefault(agent, []), ep.finished_turns(position)
        for j in turns[len(parts):]:  # turns no episode reached: nothing said
            parts.append(_silent_turn(env, agent, j, policies[agent]))
        paid, task = env.turn_rewards(agent)
        device = parts[0]["values"].device
        texts = [t for j in turns for t in ep.texts[j] or [""] * ep.batch]
        out[agent] = Turn(**stack_rows(parts), task_reward=task.flatten().to(device),
                          reward=paid.flatten().to(device), texts=texts, rounds=len(parts))
    return out


def stack_rows(parts: list) -> dict:
    """Several records (dicts or dataclasses) of one batch's fields as one: tensors
    concatenated along the rows, in order, the rest from the first."""
    parts = [p if isinstance(p, dict) else {f.name: getattr(p, f.name) for f in fields(p)}
             for p in parts]
    return {k: torch.cat([p[k] for p in parts]) if torch.is_tensor(v) else v
            for k, v in parts[0].items()}


@torch.inference_mode()
def answer_alone(env: BatchedCoryEnv, policy, sampling, generator: torch.Generator,
                 queries: list[int], kl: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Task rewards and summed full KLs (None when not `kl`) of one answer per query index
    (single-agent env), `env.batch_size` episodes at a time (the last batch padded with its last
    query, which is neither scored nor returned)."""
    rewards, kls, answers = [], [], []
    agent = env.possible_agents[0]
    # full passes score the KL where the decode's numbers are not the trainer's (the fast
    # path's folded weights, 4-bit, mixed precision): the same KL as on the exact path
    recompute = getattr(policy, "needs_recompute", False) or decodes_fast(policy)
    for i in range(0, len(queries), env.batch_size):
        chunk = queries[i:i + env.batch_size]
        env.reset(options={"queries": chunk + [chunk[-1]] * (env.batch_size - len(chunk))})
        role = env.role
        steps = play_turn(env, policy, sampling, generator)
        rewards.append(env.infos()[agent]["task_reward"].numpy()[:len(chunk)])
        if kl and recompute:  # scored below, all answers together
            answers.append({k: v[:len(chunk)] for k, v in env.turn_batch(agent).items()
                            if k in ("input_ids", "attention_mask", "response_mask")})
        elif kl:
            turn = _turn_tensors(env, agent, role, steps, policy, env.max_new_tokens, sampling)
            kls.append(turn["full_kl"].sum(1).cpu().numpy()[:len(chunk)])
    if answers:
        kls = [summed_kl(policy, *(torch.cat([a[k] for a in answers]) for k in
                                   ("input_ids", "attention_mask", "response_mask")),
                         env.max_new_tokens, sampling).numpy()]
    return np.concatenate(rewards), np.concatenate(kls) if kl else None


def drawn_logsoftmax(steps: list[Step]) -> torch.Tensor:
    """The raw log-softmax each token was drawn from, (B, n, V)."""
    return torch.stack([step.logsoftmax for step in steps], dim=1)


def summed_kl(policy, ids, mask, response_mask, T: int, sampling) -> torch.Tensor:
    """Each answer's summed exact KL to the reference from no-grad full passes, the rows taken
    in order of prompt length so that each CHUNK-row pass carries little left padding."""
    device = policy.device
    ids, mask, response_mask = ids.to(device), mask.to(device), response_mask.to(device)
    order = torch.argsort(mask[:, :-T].sum(1), stable=True)
    out = torch.zeros(len(order), device=device)
    for i in range(0, len(order), CHUNK):
        rows = order[i:i + CHUNK]
        r_ids, r_mask = ids[rows], mask[rows]
        ref = policy.reference_logits(r_ids, r_mask, T, chunk_size=CHUNK)
        own = full_pass(policy, r_ids, r_mask, T, sampling)["logits"]
        kl, _ = kl_to_reference(own, ref, r_ids[:, -T:])
        out[rows] = (kl * response_mask[rows]).sum(1)
    return out.cpu()


def _rows(env, agent: str, seq: dict, device) -> dict:
    """What a turn's record holds of the env's rows (`env.turn`'s dict): ids, masks, queries."""
    return dict(agent=agent, input_ids=seq["input_ids"].to(device),
                attention_mask=seq["attention_mask"].to(device),
                response_mask=seq["response_mask"].to(device),
                query_index=seq["query_index"].to(device), group_size=seq["group_size"],
                pool_size=seq["pool_size"], position=env.agents.index(agent),
                prompt_cut=seq.get("prompt_cut"))


def _silent_turn(env, agent: str, number: int, policy) -> dict:
    """The tensors of a turn in which no episode said anything (all were over before it): its
    rows as the env kept them, every per-token tensor 0."""
    rows = _rows(env, agent, env.turn_batch(agent, number), policy.device)
    zeros = torch.zeros_like(rows["response_mask"])
    fast = zeros if decodes_fast(policy) else None
    return dict(rows, role=env.episodes.roles[env.episodes.position(number)], logprobs=zeros,
                raw_logprobs=zeros, values=zeros, ref_logprobs=zeros, full_kl=zeros,
                sampler_logprobs=fast, sampler_kl=fast)


def _turn_tensors(env, agent, role, steps, policy, T, sampling=None) -> dict:
    """A finished turn's per-token tensors: sampled log-probs, values, reference and exact KL."""
    device = policy.device
    rows = _rows(env, agent, env.turn_batch(agent), device)
    ids, mask, response_mask = rows["input_ids"], rows["attention_mask"], rows["response_mask"]
    pad = T - len(steps)

    def stack(name):
        x = torch.stack([getattr(s, name) for s in steps], dim=1).float()
        return torch.nn.functional.pad(x, (0, pad))

    ref = policy.reference_logits(ids, mask, T, chunk_size=CHUNK)
    n = len(steps)
    sampler = {"sampler_logprobs": None, "sampler_kl": None}
    if getattr(policy, "needs_recompute", False):  # decoding differs from a full pass
        own = full_pass(policy, ids, mask, T, sampling)
        mine = own["logits"][:, :n]
        if decodes_fast(policy):  # the fast path sampled
            drawn = drawn_logsoftmax(steps)
            gap = torch.zeros_like(response_mask)
            gap[:, :n] = kl_to_reference(drawn, mine, ids[:, -T:][:, :n])[0]
            sampler = {"sampler_logprobs": stack("logprob") * response_mask,
                       "sampler_kl": gap * response_mask}
    else:
        own = {name: stack(key) for name, key in (("logprobs", "logprob"), ("values", "value"),
                                                  ("raw_logprobs", "raw_logprob"))}
        mine = drawn_logsoftmax(steps)
    # blockwise over positions: (rows, V) float32 temporaries, never a (B, T, V) one
    kl, ref_logprobs = (torch.zeros_like(response_mask) for _ in range(2))
    kl[:, :n], ref_logprobs[:, :n] = kl_to_reference(mine, ref[:, :n], ids[:, -T:][:, :n])
    ref_logprobs = ref_logprobs * response_mask
    return dict(rows, role=role, logprobs=own["logprobs"].float() * response_mask,
                raw_logprobs=own["raw_logprobs"].float() * response_mask,
                values=own["values"].float() * response_mask, ref_logprobs=ref_logprobs,
                full_kl=kl * response_mask, **sampler)


def full_pass(policy, ids, mask, T: int, sampling) -> dict:
    """The response's log-probs, raw log-probs, values and logits from no-grad full passes in
    the reference pass's chunks, so an unchanged policy's KL to its reference is exactly 0."""
    parts = []
    with torch.inference_mode(False), torch.no_grad():
        for i in range(0, ids.shape[0], CHUNK):
            parts.append(policy.evaluate(ids[i:i + CHUNK].clone(), mask[i:i + CHUNK].clone(), T,
                                         sampling, return_logits=True))
    return {k: torch.cat([getattr(p, k) for p in parts])
            for k in ("logprobs", "raw_logprobs", "values", "logits")}
