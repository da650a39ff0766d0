"""Speed and memory of cory on the shared reference workload, next to the TRL anchors.

    python tools/perf/perf.py --model /tmp/ref                # builds /tmp/ref if missing
    python tools/perf/perf.py --model /tmp/ref --trl-python .venv-trl/bin/python
    python tools/perf/perf.py --quick                         # a smoke run

Reference workload: the GPT-2-shaped model written by `reference_model.py` (4 layers, n_embd
256, vocab 2048, random init), 64 prompts of 2-8 tokens
taken from CPython's pydoc topics, 16 new tokens, 4 PPO epochs of mini-batch 16, full KL,
top_k 0 / top_p 1, repetition penalty 1.1, a cheap deterministic reward (vowel ratio).

Every method runs in its own child process (`--child METHOD`), so the peak RSS (ru_maxrss) of
one method is not inflated by another, as in the TRL anchor. The TRL anchor runs in the same
invocation when a TRL 0.11.4 python is given (`make perf-trl-venv` builds .venv-trl).
The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # `python tools/perf/perf.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from cory_env import Query, Task, register_task

ROOT = Path(__file__).resolve().parents[2]
IMDB_OBSERVER = 'I can make this sentence "{query}{response}" more positive: {query}'
VOWELS = frozenset("aeiou")
FAST = "fast (LoRA + bf16, sampler log-probs)"
COMPILED = "fast + torch.compile"
LEAN_TOKENS = 512  # --lean: PPOConfig.max_tokens_per_pass (the observer's 16 x 59 pass in two)
LEAN = f"lean (LoRA, <= {LEAN_TOKENS} tokens a pass)"


# ----------------------------------------------------------------------------- the workload

def vowel_ratio(texts: Sequence[str]) -> np.ndarray:
    """The anchor's reward: vowels / (1 + characters) of each text."""
    return np.array([sum(c in VOWELS for c in t) / (1 + len(t)) for t in texts], np.float64)


@register_task("perf-ref")
class ReferenceWorkload(Task):
    """2-8-token prefixes of pydoc-topic text; reward = vowel ratio of query + response."""

    name = "perf-ref"
    observer_template = IMDB_OBSERVER
    default_max_new_tokens = 16
    default_context_len = 64

    def __init__(self, model: str, n_queries: int = 2048, seed: int = 0):
        super().__init__()
        self.model, self.n_queries, self.seed = model, n_queries, seed

    def build_tokenizer(self):
        """The reference model's tokenizer."""
        from cory_env.config import load_tokenizer

        return load_tokenizer(self.model)

    def load_queries(self, split: str) -> list[Query]:
        """n_queries windows of 8 words cut to 2-8 tokens, as trl_anchor.py draws them."""
        import pydoc_data.topics as topics

        words = " ".join(topics.topics.values()).split()
        rng = random.Random(self.seed + (split != "train"))
        out = []
        for _ in range(self.n_queries):
            i = rng.randrange(len(words) - 10)
            ids = self.tokenizer.encode(" ".join(words[i:i + 8]), add_special_tokens=False)
            ids = ids[: rng.randint(2, 8)] or [0]
            out.append(Query(text=self.tokenizer.decode(ids), ids=tuple(ids)))
        return out

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """Vowel ratio of query + response (negligible cost, like the anchor's)."""
        return vowel_ratio([q.text + r for q, r in zip(queries, responses)])


def zero_reward(task: Task) -> Task:
    """The task with its reward replaced by zeros, to time the env without reward computation."""
    task.reward = lambda queries, responses: np.zeros(len(responses))
    return task


def train_config(model: str, method: str, resp: int, device: str = "cpu", lora: bool = False,
                 precision: str | None = "auto", max_tokens_per_pass: int | None = None,
                 old_logprobs: str = "auto", torch_compile: bool = False):
    """The reference workload as a TrainConfig (4 epochs, mini-batch 16, full KL, rep. 1.1)."""
    from agents.learners.ppo import PPOConfig
    from agents.llm.loading import LoraSettings
    from agents.llm.sampling import SamplingConfig
    from agents.training.train import TrainConfig

    ppo = PPOConfig(batch_size=64, mini_batch_size=16, ppo_epochs=4, kl_penalty="full",
                    init_kl_coef=0.3, max_tokens_per_pass=max_tokens_per_pass,
                    old_logprobs=old_logprobs)
    return TrainConfig(task="perf-ref", task_options={"model": model}, method=method,
                       model=model, batch_size=64, max_new_tokens=resp, device=device,
                       iterations=10**6, ppo=ppo, lora=LoraSettings() if lora else None,
                       mixed_precision=precision, torch_compile=torch_compile,
                       sampling=SamplingConfig(repetition_penalty=1.1))


def context_len(resp: int) -> int:
    """Observation width that fits the observer's merge prompt (template + 2 queries + answer)."""
    return 2 * resp + 32


# ----------------------------------------------------------------------------- our iterations

def time_iterations(cfg, iters: int, warmup: int) -> dict:
    """Median seconds of Trainer.step() over `iters` after `warmup` iterations."""
    from agents.training.train import Trainer

    trainer = Trainer(cfg, env_options={"context_len": context_len(cfg.max_new_tokens)})
    times, rollout, update, warm = [], [], [], []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        m = trainer.step()
        if i < warmup:
            warm.append(time.perf_counter() - t0)
        else:
            times.append(time.perf_counter() - t0)
            rollout.append(m["time_rollout_s"])
            update.append(m["time_update_s"])
    dropped = int(trainer.env.episodes.dropped.max())
    return {"s_per_iter": round(statistics.median(times), 3), "all": [round(t, 2) for t in times],
            "rollout_s": round(statistics.median(rollout), 3),
            "update_s": round(statistics.median(update), 3), "truncated_prompt_tokens": dropped,
            "warmup_s": round(sum(warm), 1)}  # with torch.compile: the compiling included


def peak_rss_mb() -> int:
    """This process' peak resident memory in MB.

    VmHWM, not ru_maxrss: a spawned child's ru_maxrss starts at its parent's peak RSS (Linux
    carries it over at exec), which hid every child peak below the parent's (about 590 MB here).
    """
    peak = proc_status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def proc_status_mb(key: str) -> int | None:
    """A memory figure of /proc/self/status ("VmHWM", "VmRSS") in MB; None where unreadable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def child_main(args) -> None:
    """Time one method in this process and print one JSON line (with this process' peak RSS)."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = train_config(args.model, args.child, args.resp, args.device, args.lora, args.precision,
                       args.max_tokens_per_pass, args.old_logprobs, args.torch_compile)
    out = time_iterations(cfg, args.iters, args.warmup)
    out.update(method=args.child, resp=args.resp, lora=args.lora, threads=args.threads,
               precision=args.precision,
               peak_rss_mb=peak_rss_mb())
    if args.device.startswith("cuda"):
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() // 2**20
    print(json.dumps(out), flush=True)


def lora_team_main(args) -> None:
    """Build K LoRA policies on one base in this process; print its memory as one JSON line."""
    from agents.llm.loading import LoraSettings
    from agents.llm.policy import LLMPolicy
    from cory_env import agent_names

    before = proc_status_mb("VmRSS")
    team = LLMPolicy.shared_lora(args.model, LoraSettings(), names=agent_names(args.lora_team))
    params = {id(p): p for pol in team for p in pol.parameters()}
    lora = [p for n, p in team[0].model.named_parameters() if "lora_" in n]
    mb = lambda ps: round(sum(p.numel() * p.element_size() for p in ps) / 2**20, 2)  # noqa: E731
    print(json.dumps({"n_agents": args.lora_team, "rss_growth_mb": proc_status_mb("VmRSS") - before,
                      "param_mb": mb(params.values()), "adapters_mb": mb(lora),
                      "value_heads_mb": mb([p for pol in team for p in
                                            pol.value_head.parameters()])}), flush=True)


def chain_costs(args) -> None:
    """--chain: env cost per decode step and LoRA-team memory for each K; one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    env = {k: batched_env_overhead(args.model, args.env_rounds, n_agents=k)
           for k in args.chain_agents}
    memory = {k: run_json([sys.executable, str(Path(__file__).resolve()), "--lora-team", str(k),
                           "--model", args.model], f"LoRA team K={k}", args.timeout)
              for k in args.chain_agents}
    print(json.dumps({"batched_env_overhead": env, "lora_team_memory": memory}))


def last_json(text: str) -> dict | None:
    """The last line of text that parses as a JSON object."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def run_json(cmd: list[str], what: str, timeout: float) -> dict | None:
    """Run a command, return its last JSON line; print its error tail and return None on failure."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"  {what}: timed out after {timeout:.0f} s", flush=True)
        return None
    result = last_json(proc.stdout)
    if proc.returncode or result is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        print(f"  {what}: failed (exit {proc.returncode}):\n    " + "\n    ".join(tail))
        return None
    return result


def run_ours(args, method: str, resp: int = 16, iters: int | None = None,
             lora: bool = False, precision: str | None = None,
             max_tokens_per_pass: int | None = None, old_logprobs: str = "auto",
             torch_compile: bool = False) -> dict | None:
    """Time one of our methods in a child process (precision None: the --precision option)."""
    precision = precision or args.precision
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", method, "--model",
           args.model, "--resp", str(resp), "--iters", str(iters or args.iters), "--warmup",
           str(args.warmup), "--threads", str(args.threads), "--device", args.device,
           "--precision", precision]
    if max_tokens_per_pass:
        cmd += ["--max-tokens-per-pass", str(max_tokens_per_pass)]
    cmd += ["--old-logprobs", old_logprobs] + (["--torch-compile"] if torch_compile else [])
    result = run_json(cmd + (["--lora"] if lora else []), f"ours {method} T={resp}",
                      args.timeout)
    if result:
        setting = [name for name, on in (("LoRA", lora), (precision, precision != "auto"),
                                         (f"<= {max_tokens_per_pass} tokens a pass",
                                          max_tokens_per_pass),
                                         (f"{old_logprobs} log-probs", old_logprobs != "auto"),
                                         ("torch.compile", torch_compile))
                   if on]
        label = f" ({', '.join(setting)})" if setting else ""
        print(f"  ours {method}{label} T={resp}: {result['s_per_iter']} "
              f"s/iter (rollout {result['rollout_s']}, update {result['update_s']}), "
              f"peak RSS {result['peak_rss_mb']} MB, warm-up {result['warmup_s']} s", flush=True)
    return result


# ----------------------------------------------------------------------------- TRL anchor

def trl_model_dir(model: str) -> str:
    """The model folder, or a copy whose tokenizer_config names a class transformers 4 knows."""
    cfg_path = Path(model) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("tokenizer_class") in (None, "PreTrainedTokenizerFast", "GPT2TokenizerFast"):
        return model
    copy = Path(model).with_name(Path(model).name + "-tf4")
    if not copy.exists():
        import shutil

        shutil.copytree(model, copy)
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # same tokenizer.json, same ids
        (copy / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return str(copy)


def run_trl(args, mode: str) -> dict | None:
    """Run trl_anchor.py's reference workload with the TRL venv's python, at our threads."""
    cmd = [args.trl_python, str(Path(__file__).with_name("trl_anchor.py")),
           trl_model_dir(args.model), "--workload", "reference", "--mode", mode,
           "--iters", str(args.iters), "--threads", str(args.threads)]
    result = run_json(cmd, f"TRL {mode}", args.timeout)
    if result:
        print(f"  TRL 0.11.4 {mode}: {result['s_per_iter']} s/iter, peak RSS "
              f"{result['peak_rss_mb']} MB", flush=True)
    return result


# ----------------------------------------------------------------------------- env speed

def aec_steps_per_s(task_name: str, n_steps: int, seed: int = 0) -> float:
    """AEC env steps per second with random tokens, reward computation excluded."""
    import cory_env

    task = zero_reward(cory_env.make_task(task_name))
    env = cory_env.env(task=task)
    actions = np.random.default_rng(seed).integers(env.action_space("llm_0").n, size=4096)

    def play(n: int) -> float:
        steps = 0
        env.reset(seed=seed)
        t0 = time.perf_counter()
        while steps < n:
            for _agent in env.agent_iter():
                _, _, term, trunc, _ = env.last()
                env.step(None if term or trunc else int(actions[steps % 4096]))
                steps += 1
            env.reset()
        return steps / (time.perf_counter() - t0)

    play(min(2000, n_steps))
    return statistics.median(play(n_steps) for _ in range(3))


class _Timed:
    """A proxy that adds the seconds spent in some of an object's methods to `self.seconds`."""

    def __init__(self, obj, methods: tuple[str, ...]):
        self.obj, self.methods = obj, methods
        self.seconds = dict.fromkeys(methods, 0.0)
        self.calls = dict.fromkeys(methods, 0)

    def __getattr__(self, name):
        value = getattr(self.obj, name)
        if name not in self.methods:
            return value

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = value(*args, **kwargs)
            self.seconds[name] += time.perf_counter() - t0
            self.calls[name] += 1
            return out
        return timed


def batched_env_overhead(model: str, rounds: int, batch: int = 64, resp: int = 16,
                         n_agents: int = 2) -> dict:
    """Time env.step vs. the policy's decode step (sample + cached forward) inside rollouts
    of a chain of `n_agents` (the context fitted to the chain's longest prompt beyond K = 2)."""
    import torch

    from agents.llm.policy import LLMPolicy
    from agents.llm.rollout import play_turn
    from agents.llm.sampling import SamplingConfig
    from cory_env import BatchedCoryEnv

    policy = LLMPolicy.from_pretrained(model, reference=None)
    env = BatchedCoryEnv(batch_size=batch, task=zero_reward(ReferenceWorkload(model)),
                         tokenizer=model, max_new_tokens=resp, n_agents=n_agents, seed=0,
                         context_len=context_len(resp) if n_agents == 2 else None)
    sampling, gen = SamplingConfig(repetition_penalty=1.1), torch.Generator().manual_seed(0)
    for round_ in range(rounds + 1):
        if round_ == 1:  # round 0 was a warm-up
            timed_env, timed_policy = _Timed(env, ("step",)), _Timed(policy, ("sample", "feed"))
        env.reset()
        while not env.finished:
            play_turn(timed_env if round_ else env, timed_policy if round_ else policy,
                      sampling, gen)
    env_step = timed_env.seconds["step"] / timed_env.calls["step"]
    forward = timed_policy.seconds["feed"] / timed_policy.calls["feed"]
    decode_step = forward + timed_policy.seconds["sample"] / timed_env.calls["step"]
    return {"env_step_ms": round(1e3 * env_step, 3), "forward_ms": round(1e3 * forward, 3),
            "decode_step_ms": round(1e3 * decode_step, 3),
            "frac_of_step": round(env_step / decode_step, 4),
            "frac_of_forward": round(env_step / forward, 4), "n_agents": n_agents,
            "context_len": env.episodes.L}


# ----------------------------------------------------------------------------- GPU

def cuda_time(fn) -> float:
    """Seconds fn() takes on the GPU (synchronised)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def random_prompts(batch: int, width: int, vocab: int, device):
    """Left-padded random prompts of 2..width tokens."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch, width), generator=g)
    lens = torch.randint(2, width + 1, (batch,), generator=g)
    mask = (torch.arange(width)[None, :] >= width - lens[:, None]).long()
    return ids.to(device), mask.to(device)


def solo_env(model: str, batch: int, resp: int, device: str):
    """A single-agent env of the reference workload (no reward), on `device`."""
    from cory_env import BatchedCoryEnv

    return BatchedCoryEnv(batch_size=batch, task=zero_reward(ReferenceWorkload(model)),
                          tokenizer=model, max_new_tokens=resp, context_len=context_len(resp),
                          single_agent=True, seed=0, device=device)


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
        seq = env.turn(env.agents[0])
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
    import dataclasses

    from agents.training.train import Trainer

    rows = []
    for batch in batches:
        cfg = train_config(model, "cory", 16, device="cuda")
        cfg.batch_size = batch  # keep 4 mini-batches per epoch, as in the reference workload
        cfg.ppo = dataclasses.replace(cfg.ppo, batch_size=batch, mini_batch_size=batch // 4)
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


# ----------------------------------------------------------------------------- main

def resolve_threads(value: str) -> int:
    """'auto' -> all cores on an idle machine, fewer when the 1-minute load says they are busy."""
    cores = os.cpu_count() or 1
    if value != "auto":
        return max(1, int(value))
    return max(1, min(cores, cores - round(os.getloadavg()[0])))


def ensure_model(path: str, trl_python: str | None) -> None:
    """Write the reference model with reference_model.py unless `path` already holds it."""
    if (Path(path) / "config.json").exists():
        return
    python = trl_python or sys.executable  # transformers 4 writes a tokenizer both can read
    subprocess.run([python, str(Path(__file__).with_name("reference_model.py")), path],
                   check=True, capture_output=True)


FAST_KW = {"lora": True, "precision": "bf16", "old_logprobs": "sampler"}
# The configurations timed: (run key, label, the option that adds it (None: always), method,
# run_ours keywords). The summary's keys, the printed table and the rounds all come from it.
CONFIGS = (
    ("ppo", "full fine-tuning, fp32", None, "ppo", {}),
    ("cory", "full fine-tuning, fp32", None, "cory", {}),
    ("cory_lora", "LoRA on one base", "lora", "cory", {"lora": True}),
    ("ppo_fast", FAST, "fast", "ppo", FAST_KW),
    ("cory_fast", FAST, "fast", "cory", FAST_KW),
    ("ppo_compiled", COMPILED, "compiled", "ppo", {**FAST_KW, "torch_compile": True}),
    ("cory_compiled", COMPILED, "compiled", "cory", {**FAST_KW, "torch_compile": True}),
    ("cory_lean", LEAN, "lean", "cory", {"lora": True, "max_tokens_per_pass": LEAN_TOKENS}),
)


def chosen(args) -> list[tuple]:
    """The CONFIGS rows that these options turn on."""
    return [c for c in CONFIGS if c[2] is None or getattr(args, c[2])]


def one_round(args) -> dict[str, dict | None]:
    """Every child once: our PPO then TRL's, our CORY then the recipe, then our other rows."""
    trl = (lambda mode: run_trl(args, mode)) if args.trl_python else (lambda mode: None)
    runs = {}
    for key, _, _, method, kw in chosen(args):
        runs[key] = run_ours(args, method, **kw)
        if key in ("ppo", "cory"):
            runs[f"trl_{key}"] = trl(key)
    return runs


def combine(results: list[dict | None]) -> dict | None:
    """One child's figures over the rounds: the medians, and the largest peak RSS."""
    done = [r for r in results if r]
    if not done:
        return None
    out = dict(done[-1])
    for key in ("s_per_iter", "rollout_s", "update_s", "warmup_s"):  # TRL's have the first only
        if all(key in r for r in done):
            out[key] = round(statistics.median(r[key] for r in done), 3)
    if all("peak_rss_mb" in r for r in done):
        out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in done)
    return out


def within_rounds(rounds: list[dict], a: str, b: str, key: str = "s_per_iter") -> list:
    """Child a's figure / child b's in each round (None where either child failed)."""
    return [ratio(figure(r[a], key), figure(r[b], key)) for r in rounds]


def round_ratio(rounds: list[dict], a: str, b: str, key: str = "s_per_iter"):
    """Median over rounds of child a's figure / child b's, each ratio taken within one round."""
    values = [v for v in within_rounds(rounds, a, b, key) if v]
    return round(statistics.median(values), 3) if values else None


def ratio(a, b):
    """a / b rounded, or None when either is missing."""
    return round(a / b, 3) if a is not None and b else None


def figure(result: dict | None, key: str = "s_per_iter"):
    """A field of a child's result, or None."""
    return None if result is None else result.get(key)


def print_table(rows: list[tuple[str, object, object]]) -> None:
    """A small markdown table: what, ours, anchor."""
    print("\n| figure | ours | TRL 0.11.4 (same run) |\n|---|---|---|")
    for name, ours, anchor in rows:
        print(f"| {name} | {ours} | {anchor} |")


def main(argv=None) -> None:
    """Run every measurement and print the summary JSON line last."""
    args = parse_args(argv)
    args.threads = resolve_threads(args.threads)
    if args.child:
        return child_main(args)
    if args.lora_team:
        return lora_team_main(args)
    if args.gpu_only:
        import torch

        report = gpu_report(args.model, args.iters) if torch.cuda.is_available() else None
        print(json.dumps({"gpu": report}))
        return None
    if args.trl_python and not Path(args.trl_python).exists():
        print(f"no TRL python at {args.trl_python}: TRL rows are null (make perf-trl-venv)")
        args.trl_python = None
    ensure_model(args.model, args.trl_python)
    if args.chain:
        return chain_costs(args)
    print(f"model {args.model}, threads {args.threads} (load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores), {args.iters} timed iterations after {args.warmup}",
          flush=True)

    print("iterations (each in its own process; ours next to TRL's, so both see the same load):",
          flush=True)
    rounds = []
    for i in range(args.rounds):
        if args.rounds > 1:
            print(f"round {i + 1} of {args.rounds}:", flush=True)
        rounds.append(one_round(args))
    runs = {name: combine([r[name] for r in rounds]) for name in rounds[0]}
    by_round = functools.partial(round_ratio, rounds)

    t64 = None if args.skip_length else run_ours(args, "cory", 64, args.length_iters)

    # In this process, after the children: what it loads would otherwise add to their RSS.
    print("AEC env, random tokens, reward excluded:", flush=True)
    aec = {t: round(aec_steps_per_s(t, args.env_steps)) for t in ("sentiment", "arithmetic")}
    print(f"  steps/s {aec}", flush=True)
    import torch

    torch.set_num_threads(args.threads)
    overhead = batched_env_overhead(args.model, args.env_rounds)
    print(f"  batched env B=64: {overhead}", flush=True)
    gpu = gpu_report(args.model, args.iters) if torch.cuda.is_available() else None

    cory = runs["cory"]
    summary = {"trl_ppo_s_per_iter": figure(runs["trl_ppo"]),
               "trl_cory_s_per_iter": figure(runs["trl_cory"]),
               "trl_ppo_peak_rss_mb": figure(runs["trl_ppo"], "peak_rss_mb"),
               "trl_cory_peak_rss_mb": figure(runs["trl_cory"], "peak_rss_mb"),
               "env_overhead_frac": overhead["frac_of_step"],
               "env_overhead_frac_of_forward": overhead["frac_of_forward"],
               "t64_over_t16": ratio(figure(t64), figure(cory)), "aec_steps_per_s": aec,
               "threads": args.threads, "gpu": gpu, "rounds": args.rounds}
    rows = [("PPO s/iter", figure(runs["ppo"]), figure(runs["trl_ppo"])),
            ("CORY s/iter", figure(cory), figure(runs["trl_cory"])),
            ("CORY peak RSS MB", figure(cory, "peak_rss_mb"),
             figure(runs["trl_cory"], "peak_rss_mb"))]
    goals = {"ppo": "goal <= 0.4", "cory": "goal <= 0.25"}
    for key, label, _, method, _ in chosen(args):
        anchor = f"trl_{method}"
        summary.update({f"{key}_s_per_iter": figure(runs[key]),
                        f"{key}_peak_rss_mb": figure(runs[key], "peak_rss_mb"),
                        f"{key}_warmup_s": figure(runs[key], "warmup_s"),
                        f"{key}_over_{anchor}": by_round(key, anchor),
                        f"{key}_rss_over_{anchor}": by_round(key, anchor, "peak_rss_mb")})
        name = f"{label}: {'PPO / TRL PPO' if method == 'ppo' else 'CORY / recipe'}"
        rows.append((f"{name} ({goals[method]})", summary[f"{key}_over_{anchor}"], ""))
        if method == "cory":
            rows.append((f"{label}: CORY RSS / recipe RSS (goal <= 0.5)",
                         summary[f"{key}_rss_over_{anchor}"], ""))
    summary["cory_over_trl_cory_by_round"] = {
        key: within_rounds(rounds, key, "trl_cory") for key, *_, method, _ in chosen(args)
        if method == "cory" and runs[key]}
    rows += [("env step / decode step (goal <= 0.05)", overhead["frac_of_step"], ""),
             ("CORY time T=64 / T=16 (goal <= 4.5)", summary["t64_over_t16"], "")]
    print_table(rows)
    print(json.dumps(summary))


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "runs" / "perf-ref-model"),
                   help="reference model folder (written by make_ref_model.py if missing)")
    p.add_argument("--iters", type=int, default=6, help="timed iterations (median reported)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every child (ours and TRL's) this many times, interleaved; ratios "
                        "are medians of the ratios within a round (this machine drifts)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--length-iters", type=int, default=3, help="timed iterations at T=64")
    p.add_argument("--skip-length", action="store_true", help="skip the T=64 run")
    p.add_argument("--threads", default="auto",
                   help="torch threads for us AND TRL; auto = cores minus the 1-min load")
    default_trl = ROOT / ".venv-trl" / "bin" / "python"
    p.add_argument("--trl-python", default=str(default_trl) if default_trl.exists() else None,
                   help="python of a TRL 0.11.4 venv (make perf-trl-venv); default .venv-trl")
    p.add_argument("--no-trl", dest="trl_python", action="store_const", const=None)
    p.add_argument("--lora", action="store_true",
                   help="also time CORY with LoRA adapters on one shared base")
    p.add_argument("--fast", action="store_true",
                   help="also time PPO and CORY with LoRA on one shared base + bf16 autocast, "
                        "old log-probs from the sampler (no recomputing pass)")
    p.add_argument("--compiled", action="store_true",
                   help="also time PPO and CORY in the --fast configuration with torch.compile'd "
                        "training passes (TrainConfig.torch_compile; compiled in the warm-up)")
    p.add_argument("--lean", action="store_true",
                   help=f"also time CORY with LoRA and at most {LEAN_TOKENS} tokens a training "
                        "pass (PPOConfig.max_tokens_per_pass)")
    p.add_argument("--env-steps", type=int, default=20000, help="AEC steps per timing")
    p.add_argument("--env-rounds", type=int, default=4, help="batched-env rollouts timed")
    p.add_argument("--chain", action="store_true",
                   help="only a K-agent chain's costs, for each --chain-agents: the batched "
                        "env step per decode step, and the memory of K LoRA adapters on one base")
    p.add_argument("--chain-agents", type=lambda s: [int(k) for k in s.split(",")],
                   default=[2, 4], help="chain lengths K of --chain (comma list)")
    p.add_argument("--lora-team", type=int, default=None,
                   help=argparse.SUPPRESS)  # a child: build K LoRA adapters on one base
    p.add_argument("--device", default="cpu", help="device of our iterations")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16"],
                   help="auto: bf16 autocast on CUDA only; bf16: also on CPU (opt-in)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 iterations, fewer steps")
    p.add_argument("--gpu-only", action="store_true", help="only the CUDA measurements")
    p.add_argument("--max-tokens-per-pass", type=int, default=None,
                   help=argparse.SUPPRESS)  # a child's PPOConfig.max_tokens_per_pass
    p.add_argument("--old-logprobs", default="auto",
                   help=argparse.SUPPRESS)  # a child's PPOConfig.old_logprobs
    p.add_argument("--torch-compile", action="store_true",
                   help=argparse.SUPPRESS)  # a child's TrainConfig.torch_compile
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--resp", type=int, default=16, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be a positive integer, got {args.rounds}")
    if args.quick:
        args.iters, args.length_iters, args.env_steps, args.env_rounds = 2, 1, 5000, 1
    return args


if __name__ == "__main__":
    main()
