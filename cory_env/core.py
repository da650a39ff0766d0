"""The episodes shared by the AEC env and the batched env.

`Episodes` steps B CORY episodes in lockstep with numpy arrays: the pioneer's turn, then the
observer's turn (in a chain of K agents, positions 1..K-1 in order, each seeing the answers
before it), then the task reward. With `rounds=R` the chain repeats R times: turn j (0-based
over the episode) is position j mod K's, in round j // K, and its prompt is the task's
template for that turn (by default the query and the whole transcript so far). A round's
answers are scored when it ends; the task says whether every round pays (`round_rewards`
"each") or only the last ("final"), and may end an episode early (`game_over`: a game won).
A payment goes to each agent's latest turn in which it spoke. Both public envs are thin views
of it, which is why their semantics are the same by construction (and tested to be).

Token layout of every observation, per agent, fixed size L = context_len:

    columns [0, P)       the agent's prompt, right-aligned (left-padded), P = L - max_new_tokens
    columns [P, P + T)   the tokens the agent generated so far in its turn

so generated token t of every episode sits at column P + t, which is what batched KV-cache
decoding wants. Prompts longer than P are LEFT-truncated (their first tokens are dropped) and
the number of dropped tokens is reported in infos["truncated_prompt_tokens"].
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from .prompts import TemplateRenderer, chain_context
from .tasks.base import Query, Task

PIONEER, OBSERVER = 0, 1
ROLES = ("pioneer", "observer")


def role_names(n_agents: int) -> tuple[str, ...]:
    """The roles of a chain's positions: pioneer, observer (K = 2) or observer_1..K-1."""
    if n_agents <= 2:
        return ROLES[:n_agents]
    return ("pioneer", *(f"observer_{k}" for k in range(1, n_agents)))


class Episodes:
    """B chains of K turns (pioneer first), repeated for R rounds, stepped in lockstep (numpy,
    no loop over B per step).

    Arrays are indexed by turn (j = round * K + position), not by agent: the envs map agents
    to positions.
    """

    def __init__(self, task: Task, tokenizer, *, max_new_tokens: int, context_len: int,
                 knowledge_transfer: bool = True, reward_mode: str = "collective",
                 n_agents: int = 2, rounds: int = 1, max_cycles: int | None = None,
                 fit_context: bool = False, split: str = "train"):
        self.task, self.tokenizer = task, tokenizer
        self.reward_mode = reward_mode
        self.knowledge_transfer = knowledge_transfer
        self.vocab = len(tokenizer)
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.n_agents, self.rounds, self.max_cycles = n_agents, rounds, max_cycles
        self.n_turns = n_agents * rounds
        self.templates = (task.templates(knowledge_transfer, max(n_agents, 2)) if rounds == 1
                          else task.templates(knowledge_transfer, n_agents, rounds))
        self.renderers = tuple(TemplateRenderer(t, tokenizer, k)
                               for k, t in enumerate(self.templates))
        self.roles = role_names(self.n_agents)
        self.T, self.L = max_new_tokens, context_len
        # prompts that cannot fit the window are said at the start (K > 2 or R > 1: L fits them)
        longest = max(task.query_lengths(task.queries(split), tokenizer))
        need = chain_context(self.renderers[:self.n_turns], longest, max_new_tokens)
        if fit_context and (self.n_agents > 2 or rounds > 1):
            self.L = max(context_len, need)
        elif context_len < need:
            rounds_said = f" over {rounds} rounds" if rounds > 1 else ""
            warnings.warn(f"task {task.name!r}: context_len={context_len} is too short for its "
                          f"prompts with {self.n_agents} agent(s){rounds_said}: a prompt can "
                          f"reach {need - max_new_tokens} tokens and its start would be cut "
                          f"(counted per turn as prompt_tokens_cut); raise context_len to {need}",
                          stacklevel=3)
        if task.zero_sum and reward_mode == "collective" and n_agents > 1:
            warnings.warn(f"task {task.name!r} is zero-sum: under reward_mode='collective' "
                          f"every agent is paid 0; use reward_mode='individual'", stacklevel=3)
        self.P = self.L - max_new_tokens
        self.batch = 0

    # -- turns ------------------------------------------------------------------------------
    def position(self, turn: int) -> int:
        """The chain position (0: the pioneer) that plays a turn."""
        return turn % self.n_agents

    def turn_of(self, position: int) -> int:
        """The turn the agent at `position` sees now: its current or latest turn
        (its first, all padding, before it has begun)."""
        j = self.turn - (self.turn - position) % self.n_agents
        return j if j >= 0 else position

    def last_turn(self, position: int) -> int | None:
        """The agent's latest finished turn, or None when none has finished."""
        j = self.turn_of(position)
        if self.finished or j < self.turn:
            return j
        return j - self.n_agents if j >= self.n_agents else None

    def prompt_ids(self, turn: int, episode: int = 0) -> np.ndarray:
        """An episode's prompt token ids in a turn (its rendered template; empty before)."""
        keep = self.mask[turn, episode, :self.P].astype(bool)
        return self.ids[turn, episode, :self.P][keep].copy()

    def answer_ids(self, turn: int, episode: int = 0) -> np.ndarray:
        """An episode's answer token ids in a turn so far (EOS included when it ended it)."""
        return self.ids[turn, episode, self.P:self.P + int(self.resp_len[turn, episode])].copy()

    def finished_turns(self, position: int) -> list[int]:
        """The turns of the agent at `position` that are over: those it finished so far, and
        once the episodes are over, one in every round played (a turn the end came before
        holds its prompt and no answer)."""
        if self.finished:
            return list(range(position, self.turn // self.n_agents * self.n_agents + position + 1,
                              self.n_agents))
        last = self.last_turn(position)
        return [] if last is None else list(range(position, last + 1, self.n_agents))

    # -- episode start --------------------------------------------------------------------
    def start(self, queries: Sequence[Query], cap: int | None = None) -> None:
        """Begin len(queries) new episodes at the pioneer's first token; `cap` <= T ends every
        turn after that many tokens (a truncation, no EOS added)."""
        if cap is not None and not 1 <= cap <= self.T:
            raise ValueError(f"max_new_tokens={cap} for this reset must be in [1, {self.T}] "
                             f"(the env's max_new_tokens)")
        self.cap = self.T if cap is None else int(cap)
        b = self.batch = len(queries)
        self.queries = list(queries)
        encoded = [self.task.query_ids(q, self.tokenizer) for q in queries]
        self.q_len = np.array([len(x) for x in encoded], dtype=np.int64)
        self.q_ids = np.full((b, max(int(self.q_len.max()), 1)), self.pad, dtype=np.int64)
        for i, ids in enumerate(encoded):  # once per episode, not per step
            self.q_ids[i, : len(ids)] = ids
        k = max(self.n_turns, 2)  # a single agent keeps the observer's turn empty
        self.ids = np.full((k, b, self.L), self.pad, dtype=np.int64)
        self.mask = np.zeros((k, b, self.L), dtype=np.int8)
        self.resp_len = np.zeros((k, b), dtype=np.int64)
        self.hit_eos = np.zeros((k, b), dtype=bool)
        self.dropped = np.zeros((k, b), dtype=np.int64)
        self.turn_task = np.zeros((k, b))  # the task reward of each turn's answer, once scored
        self.turn_paid = np.zeros((k, b))  # what the env paid after each turn
        self.credit = np.tile(np.arange(self.n_agents)[:, None], (1, b))  # who gets a payment
        self.ended = np.zeros(b, dtype=bool)  # episodes over early (a game won)
        self.acted = np.zeros(self.n_agents, dtype=np.int64)  # steps taken, per position
        self.task_rewards: np.ndarray | None = None
        self.agent_rewards: np.ndarray | None = None
        self.truncated = False
        self.scored = 0  # turns whose round has been scored
        self.paid_now: np.ndarray | None = None  # (K, B) what the last step's round paid
        self.turn, self.t = PIONEER, 0
        self.turn_done = np.zeros(b, dtype=bool)
        self.texts: list[list[str] | None] = [None] * k
        self.finished = False
        self._begin_turn(PIONEER)

    def _begin_turn(self, turn: int) -> None:
        self._render(turn)
        self.turn, self.t = turn, 0
        self.turn_done[:] = self.ended  # an episode already over writes nothing
        cycles = self.max_cycles
        left = None if cycles is None else cycles - self.acted[self.position(turn)]
        self.turn_cap = self.cap if left is None else min(self.cap, int(left))

    def _render(self, turn: int) -> None:
        """Write a turn's prompts from the answers of the turns before it (EOS not copied)."""
        answers = [(self.ids[j, :, self.P:], self.resp_len[j] - self.hit_eos[j])
                   for j in range(turn)]
        renderer = self.renderers[turn]
        ids, mask, dropped = renderer.render(self.q_ids, self.q_len, answers, self.P, self.pad,
                                             self._state(turn) if renderer.has_state else None)
        self.ids[turn, :, : self.P], self.mask[turn, :, : self.P] = ids, mask
        self.dropped[turn] = dropped

    def _state(self, turn: int):
        """The task's `{state}` text of every episode for a turn, as (ids, lengths)."""
        texts = [self.task.state_text(q, [self.texts[j][i] for j in range(turn)], turn)
                 for i, q in enumerate(self.queries)]
        encoded = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        lens = np.array([len(e) for e in encoded], dtype=np.int64)
        ids = np.full((len(encoded), max(int(lens.max()), 1)), self.pad, dtype=np.int64)
        for i, e in enumerate(encoded):
            ids[i, :len(e)] = e
        return ids, lens

    # -- stepping ---------------------------------------------------------------------------
    def check_tokens(self, tokens: np.ndarray) -> None:
        """Raise ValueError naming the first out-of-range token among active episodes."""
        if self.batch == 1:  # the AEC env's hot path: Python scalars, no array ops
            tok = int(tokens[0])
            if not 0 <= tok < self.vocab and not self.turn_done[0]:
                raise ValueError(f"token {tok} is out of range for vocabulary size {self.vocab}")
            return
        bad = ((tokens < 0) | (tokens >= self.vocab)) & ~self.turn_done
        if bad.any():
            tok = int(tokens[np.argmax(bad)])
            raise ValueError(f"token {tok} is out of range for vocabulary size {self.vocab}")

    def step(self, tokens: np.ndarray) -> bool:
        """Append one token per active episode; return True when the current turn has ended."""
        if self.finished:
            raise RuntimeError("episodes are finished; call start() first")
        turn, col = self.turn, self.P + self.t
        self.paid_now = None
        if self.batch == 1:
            all_done = self._append_one(turn, col, int(tokens[0]))
        else:
            all_done = self._append(turn, col, tokens)
        self.t += 1
        self.acted[self.position(turn)] += 1
        if self.t < self.turn_cap and not all_done:
            return False
        self._end_turn(turn)
        return True

    def _end_turn(self, turn: int) -> None:
        """Record the answers, let the task end episodes, score a finished round, go on."""
        self.texts[turn] = self.responses(turn)
        position = self.position(turn)
        self.credit[position] = np.where(self.resp_len[turn] > 0, turn, self.credit[position])
        if self.n_turns > 1:
            over = self.task.game_over(self.queries, self.texts[:turn + 1])
            if over is not None:
                self.ended |= check_rows(self.task, "game_over", over, self.batch).astype(bool)
        nxt = turn + 1
        spent = self.max_cycles is not None and nxt < self.n_turns and \
            self.acted[self.position(nxt)] >= self.max_cycles
        done = nxt >= self.n_turns or bool(self.ended.all()) or spent
        self.truncated = spent
        if done:  # the rest of the round: its prompts, no answers
            for j in range(nxt, min(self.n_turns, (turn // self.n_agents + 1) * self.n_agents)):
                self.texts[j] = [""] * self.batch
                self._render(j)
        if done or position == self.n_agents - 1:
            self._score(turn // self.n_agents, turn + 1, last=done)
        if done:
            self.finished = True
        else:
            self._begin_turn(nxt)

    def _append(self, j: int, col: int, tokens: np.ndarray) -> bool:
        """Write column col of every active episode; return True when all turns are done."""
        active = ~self.turn_done
        self.ids[j, :, col] = np.where(active, tokens, self.pad)
        self.mask[j, :, col] = active
        self.resp_len[j] += active
        ended = active & (tokens == self.eos)
        self.hit_eos[j] |= ended
        self.turn_done |= ended
        return bool(self.turn_done.all())

    def _append_one(self, j: int, col: int, token: int) -> bool:
        """`_append` for a single episode with Python scalars (the AEC env's hot path)."""
        if self.turn_done[0]:  # its column stays padding, as in _append
            return True
        self.ids[j, 0, col] = token
        self.mask[j, 0, col] = 1
        self.resp_len[j, 0] += 1
        if token == self.eos:
            self.hit_eos[j, 0] = True
            self.turn_done[0] = True
            return True
        return False

    # -- rewards ----------------------------------------------------------------------------
    def responses(self, j: int) -> list[str]:
        """Decoded response texts of one turn (EOS stripped)."""
        lens = self.resp_len[j] - self.hit_eos[j]
        rows = self.ids[j, :, self.P:]
        return self.tokenizer.batch_decode([r[:n].tolist() for r, n in zip(rows, lens)],
                                           skip_special_tokens=False)

    def _score(self, rnd: int, played: int, last: bool) -> None:
        """Score round `rnd` (turns up to `played`), pay it if the task pays every round or it
        is the last, and at the last add up each agent's pay."""
        k, first = self.n_agents, rnd * self.n_agents
        scores = self.task.round_scores(self.queries, self.texts[:played], k, last)
        if scores is None:  # each of the round's answers scored by the task's reward
            texts = [t for j in range(first, played) for t in self.texts[j]]
            scores = np.zeros((k, self.batch))
            scores[:played - first] = safe_reward(self.task, self.queries * (played - first),
                                                  texts).reshape(played - first, self.batch)
        else:
            scores = check_rows(self.task, "round_scores", scores, self.batch, k)
        self.turn_task[first:first + k] = scores[:min(k, len(self.turn_task) - first)]
        self.task_rewards, self.scored = scores, played
        if last or self.task.round_rewards == "each":
            paid = (np.broadcast_to(scores.sum(0), scores.shape) if self.reward_mode ==
                    "collective" else scores)
            self.paid_now, cols = paid, np.arange(self.batch)
            for position in range(k):
                self.turn_paid[self.credit[position], cols] += paid[position]
        if last:
            self.agent_rewards = np.stack([self.turn_paid[p:self.n_turns:k].sum(0)
                                           for p in range(k)])


def check_rows(task: Task, what: str, value, batch: int, k: int | None = None) -> np.ndarray:
    """A task hook's (B,) or (K, B) answer as finite numbers, or a RuntimeError naming it."""
    out = np.asarray(value, dtype=np.float64)
    shape = (batch,) if k is None else (k, batch)
    if out.shape != shape or not np.isfinite(out).all():
        raise RuntimeError(f"{what} of task {task.name!r} returned {out.shape} values (finite "
                           f"numbers expected, shape {shape})")
    return out


def safe_reward(task: Task, queries: Sequence[Query], texts: Sequence[str]) -> np.ndarray:
    """Call task.reward and fail loudly, naming the task and sample, on errors, a return that
    is not one finite number per response, or non-finite values."""
    expected = (f"expected a sequence of {len(texts)} finite numbers (one per response), e.g. a "
                f"list of floats or a 1-D numpy array")
    try:
        raw = task.reward(queries, texts)
    except Exception as err:  # locate the failing sample before re-raising
        for i in range(len(texts)):
            try:
                task.reward(queries[i:i + 1], texts[i:i + 1])
            except Exception as one:
                raise RuntimeError(
                    f"reward of task {task.name!r} raised on sample {i} "
                    f"(response {texts[i]!r}): {one!r}") from one
        raise RuntimeError(f"reward of task {task.name!r} raised: {err!r}") from err
    got = f"{type(raw).__name__}" + (f" of length {len(raw)}" if hasattr(raw, "__len__") else "")
    if raw is None or isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
        raise RuntimeError(f"reward of task {task.name!r} returned {got} ({raw!r:.60}); {expected}")
    nones = [i for i, x in enumerate(raw) if x is None] if not isinstance(raw, np.ndarray) else []
    if nones:
        raise RuntimeError(f"reward of task {task.name!r} returned {got} with None at sample "
                           f"{nones[0]} (response {texts[nones[0]]!r}); {expected}")
    try:
        out = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise RuntimeError(f"reward of task {task.name!r} returned {got} that is not numbers "
                           f"({err}); {expected}") from None
    if out.ndim == 2 and out.shape[1] == 1:
        out = out[:, 0]
    if out.ndim != 1 or out.shape[0] != len(texts):
        raise RuntimeError(f"reward of task {task.name!r} returned {got} (shape "
                           f"{tuple(out.shape)}) for {len(texts)} responses; {expected}")
    out = out.reshape(-1)
    bad = ~np.isfinite(out)
    if bad.any():
        i = int(np.argmax(bad))
        raise RuntimeError(f"reward of task {task.name!r} returned {out[i]} for sample {i} "
                           f"(response {texts[i]!r}); {expected}")
    return out
