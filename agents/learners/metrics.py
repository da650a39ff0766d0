"""Per-iteration metrics: task reward, KL, the paper's combined reward, collapse detectors."""

from __future__ import annotations

from collections.abc import Sequence


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """All n-grams of a word list."""
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct n-grams over all n-grams across texts (Li et al. 2016); 0 when there are none."""
    grams = [g for t in texts for g in ngrams(t.split(), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(texts: Sequence[str]) -> float:
    """Share of words that repeat an earlier word of the same text (collapse detector)."""
    repeated = total = 0
    for text in texts:
        words = text.split()
        repeated += len(words) - len(set(words))
        total += len(words)
    return repeated / total if total else 0.0


def last_round(x, turn):
    """The rows of a per-episode tensor of `turn` that belong to the agent's last round."""
    return x.view(getattr(turn, "rounds", 1), -1)[-1]


def report_kl_coef_of(cfg) -> float:
    """The coefficient c of the reported combined reward r − c·ΣKL, one value for a whole run so
    that its curves and methods compare: `report_kl_coef`, else the initial `kl_coef`."""
    return float(cfg.report_kl_coef if cfg.report_kl_coef is not None else cfg.ppo.kl.coef)


def turn_metrics(turn, report_kl_coef: float, n_samples: int = 3) -> dict:
    """Metrics of one agent's turn; `combined_reward` = task reward - report_kl_coef * sum KL. With
    rounds: the last round's task reward, the KL summed over the agent's turns of an episode,
    and each round's as `round_<r>_task_reward` / `round_<r>_kl`."""
    mask, rounds = turn.response_mask, getattr(turn, "rounds", 1)
    kl_turns = turn.full_kl.sum(1).view(rounds, -1)
    kl, tasks = kl_turns.sum(0), turn.task_reward.float().view(rounds, -1)
    task = tasks[-1]  # the last round's
    entropy = -(turn.raw_logprobs * mask).sum() / mask.sum().clamp_min(1)
    per_round = {} if rounds == 1 else {
        f"round_{r + 1}_{name}": float(x[r].mean()) for r in range(rounds)
        for name, x in (("task_reward", tasks), ("kl", kl_turns))}
    return {**per_round,
        "role": turn.role,
        "position": turn.position,
        "task_reward": float(task.mean()),
        "task_reward_std": float(task.std()) if len(task) > 1 else 0.0,
        "kl": float(kl.mean()),
        "combined_reward": float((task - report_kl_coef * kl).mean()),
        "report_kl_coef": float(report_kl_coef),
        "response_length": float(turn.lengths.float().mean()),
        "sampled_neg_logprob": float(entropy),
        "distinct_1": distinct_n(turn.texts, 1),
        "distinct_2": distinct_n(turn.texts, 2),
        "repetition_rate": repetition_rate(turn.texts),
        "samples": list(turn.texts[:n_samples]),
        **prompt_cut_metrics(turn),
        **sampler_metrics(turn),
    }


def sampler_metrics(turn) -> dict:
    """`sampler_kl`: the mean per-token KL from the fast decode path's distribution to the
    trainer's; `sampler_ratio_max`: the largest pi_trainer / pi_sampler of a drawn token (the
    truncated importance weight caps it); nothing for a turn the trainer's own passes sampled."""
    gap = getattr(turn, "sampler_kl", None)
    if gap is None:
        return {}
    mask = turn.response_mask > 0
    log_ratio = (turn.logprobs - turn.sampler_logprobs)[mask]
    return {"sampler_kl": float(gap.sum() / turn.response_mask.sum().clamp_min(1)),
            "sampler_ratio_max": float(log_ratio.max().exp()) if mask.any() else 1.0}


def prompt_cut_metrics(turn) -> dict:
    """How much of the turn's prompts the window cut: the mean tokens cut and the share of
    episodes cut (both 0 when nothing was)."""
    cut = getattr(turn, "prompt_cut", None)
    if cut is None:
        return {}
    cut = cut.float()
    return {"prompt_tokens_cut": float(cut.mean()), "prompt_cut_rate": float((cut > 0).float()
                                                                            .mean())}

