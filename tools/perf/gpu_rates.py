"""CUDA figures of the reference workload: decode vs evaluate agreement, policy and trainer
tokens/s at several batch sizes (`perf.py --gpu-only` runs them; nothing here on a CPU).

    python tools/perf/gpu_rates.py --model runs/perf-ref-model --iters 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from workload import ROOT, context_len, solo_env, train_config


def random_prompts(batch: int, width: int, vocab: int, device):
    """Left-padded random prompts of 2..width tokens."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch, width), generator=g)
    lens = torch.randint(2, width + 1, (batch,), generator=g)
    mask = (torch.arange(width)[None, :] >= width - lens[:, None]).long()
    return ids.to(device), mask.to(device)


def cuda_time(fn) -> float:
    """Seconds fn() takes on the GPU (synchronised)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def decode(policy, env, sampling) -> list:
    """One turn of every episode of `env` with `policy` (the library's decode loop)."""
    import torch

    from agents.llm.rollout import play_turn

    env.reset()
    return play_turn(env, policy, sampling, torch.Generator(policy.device).manual_seed(0))


def with_response(ids, mask, tokens):
    """Prompt plus response columns (all real) as (ids, mask)."""
    import torch

    full = torch.cat([ids, tokens], 1)
    return full, torch.cat([mask, torch.ones_like(tokens)], 1)


def decode_agreement(model: str, resp: int = 16) -> dict:
    """Max |decode-time log-prob - evaluate log-prob| on CUDA, under bf16 autocast and fp32."""
    import torch

    from agents.llm.policy import LLMPolicy
    from agents.llm.sampling import SamplingConfig

    out, sampling = {}, SamplingConfig(repetition_penalty=1.1)
    for mode in ("auto", None):
        policy = LLMPolicy.from_pretrained(model, reference=None, device="cuda",
                                           mixed_precision=mode)
        env = solo_env(model, 16, resp, "cuda")
        steps = decode(policy, env, sampling)
        seq = env.turn_batch(env.agents[0])
        with torch.no_grad():
            ev = policy.evaluate(seq["input_ids"], seq["attention_mask"], resp, sampling)
        n, real = len(steps), seq["response_mask"][:, :len(steps)].bool()
        got = torch.stack([s.logprob for s in steps], 1)
        out["bf16" if mode else "fp32"] = float((got - ev.logprobs[:, :n])[real].abs().max())
    return out


def policy_rates(policy, model: str, batch: int, resp: int, sampling) -> dict:
    """Decode and train (evaluate + backward) tokens/s of one policy at one batch size."""
    import torch

    env = solo_env(model, batch, resp, "cuda")
    ids, mask = random_prompts(batch, 8, policy.vocab_size, "cuda")
    response = torch.randint(1, policy.vocab_size, (batch, resp), device="cuda")
    full, full_mask = with_response(ids, mask, response)
    generated = []

    def run_decode():
        generated.append(len(decode(policy, env, sampling)))

    def run_train():
        ev = policy.evaluate(full, full_mask, resp, sampling)
        (ev.logprobs.sum() + ev.values.sum()).backward()

    run_decode(), run_train()  # warm-up
    dec = min(cuda_time(run_decode) for _ in range(3))
    train = min(cuda_time(run_train) for _ in range(3))
    return {"batch": batch, "decode_tokens_per_s": round(batch * max(generated) / dec),
            "train_tokens_per_s": round(batch * resp / train)}


def policy_tokens_per_s(model: str, resp: int = 16) -> list[dict]:
    """Policy-level decode and train tokens/s on CUDA (bf16 autocast) for a few batch sizes."""
    from agents.llm.policy import LLMPolicy
    from agents.llm.sampling import SamplingConfig

    policy = LLMPolicy.from_pretrained(model, reference=None, device="cuda")
    rows = []
    for batch in (64, 512, 4096):
        rows.append(policy_rates(policy, model, batch, resp,
                                 SamplingConfig(repetition_penalty=1.1)))
        print(f"  GPU policy: {rows[-1]}", flush=True)
    return rows


def trainer_tokens_per_s(model: str, iters: int, batches=(64, 512)) -> list[dict]:
    """CORY iterations on CUDA (bf16 autocast): response tokens per second, rollout and total."""
    from agents.training.train import Trainer

    rows = []
    for batch in batches:  # 4 mini-batches per epoch, as in the reference workload
        cfg = train_config(model, "cory", batch_size=batch, mini_batch_size=batch // 4,
                           settings={"device": "cuda"})
        trainer = Trainer(cfg, env_options={"context_len": context_len(16)})
        trainer.step()
        steps = [trainer.step() for _ in range(iters)]
        total = statistics.median(m["time_rollout_s"] + m["time_update_s"] for m in steps)
        rollout = statistics.median(m["time_rollout_s"] for m in steps)
        tokens = 2 * batch * 16  # pioneer + observer responses
        rows.append({"batch": batch, "mini_batch": batch // 4, "s_per_iter": round(total, 3),
                     "rollout_tokens_per_s": round(tokens / rollout),
                     "iteration_tokens_per_s": round(tokens / total)})
        print(f"  GPU cory B={batch}: {rows[-1]}", flush=True)
    return rows


def gpu_report(model: str, iters: int) -> dict:
    """Every CUDA measurement; a failing one is reported and does not stop the others."""
    import traceback

    import torch

    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(f"GPU: {out['device']}", flush=True)
    for name, fn in (("decode_vs_evaluate_max_abs", lambda: decode_agreement(model)),
                     ("policy", lambda: policy_tokens_per_s(model)),
                     ("cory", lambda: trainer_tokens_per_s(model, iters))):
        try:
            out[name] = fn()
            if name.startswith("decode"):
                print(f"  GPU decode vs evaluate, max |dlogp|: {out[name]}", flush=True)
        except Exception as err:  # report and go on: the device time is scarce
            traceback.print_exc()
            out[name] = f"failed: {err!r}"
    return out


def main(argv=None) -> None:
    """Every CUDA measurement as one JSON line (null without CUDA)."""
    import torch

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "runs" / "perf-ref-model"))
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args(argv)
    print(json.dumps({"gpu": gpu_report(args.model, args.iters)
                      if torch.cuda.is_available() else None}))


if __name__ == "__main__":
    main()
