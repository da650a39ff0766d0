"""The TRL 0.11 anchor on a real model: TRL's PPOTrainer, and the official CORY recipe on it.

    .venv-trl/bin/python tools/perf/trl_anchor.py MODEL_FOLDER --mode ppo|cory [--iters 3]

Runs in the TRL venv (`make perf-trl-venv`: TRL 0.11.4 needs transformers 4.x), so it imports
nothing from the project but the review openings (a plain-Python file). The workload is the
`reviews` task's: 2-8-token openings, 3 x VADER of query + response, the paper's observer
prompt; full float32 fine-tuning, 4 PPO epochs, top_k 0 / top_p 1. `cory` follows the official
code: two PPOTrainers, the observer prompt built from the pioneer's decoded text, reference
responses generated for its logs, and the roles exchanged every 5 iterations by saving both
models and loading them crossed. Prints one JSON line: seconds per iteration (median of the
timed ones) and peak RSS.
"""

import argparse
import importlib.util
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer  # noqa: E402
from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer  # noqa: E402

OBSERVER = 'I can make this sentence "{}" more positive: {}'
OPENINGS = os.path.join(os.path.dirname(__file__), "..", "..", "cory_env", "data", "openings.py")


def openings() -> list[str]:
    """The reviews task's openings, read from the project's plain-Python module."""
    spec = importlib.util.spec_from_file_location("openings", OPENINGS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.review_openings()


def main() -> None:
    """Time the chosen mode; print one JSON line."""
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--mode", default="ppo", choices=["ppo", "cory"])
    p.add_argument("--iters", type=int, default=3, help="timed iterations (after one)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--resp", type=int, default=12)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    tok.pad_token = tok.eos_token
    texts, vader = openings(), SentimentIntensityAnalyzer()

    def queries(n):
        picked = random.sample(texts, n)
        return [torch.tensor(tok.encode(t)[: random.randint(2, 8)]) for t in picked]

    def reward(texts):
        return [torch.tensor(3.0 * vader.polarity_scores(t)["compound"]) for t in texts]

    cfg = dict(learning_rate=a.lr, batch_size=a.batch, mini_batch_size=a.batch, ppo_epochs=4,
               init_kl_coef=0.3, kl_penalty="full", seed=0)
    gen = dict(min_length=-1, top_k=0.0, top_p=1.0, do_sample=True,
               pad_token_id=tok.eos_token_id, max_new_tokens=a.resp)

    def trainer(path):
        model = AutoModelForCausalLMWithValueHead.from_pretrained(path)
        ref = AutoModelForCausalLMWithValueHead.from_pretrained(a.model)
        return model, PPOTrainer(PPOConfig(**cfg), model, ref, tok)

    m1, t1 = trainer(a.model)
    if a.mode == "cory":
        m2, t2 = trainer(a.model)
    tmp, times = tempfile.mkdtemp(), []
    for it in range(a.iters + 1):
        t0 = time.perf_counter()
        q = queries(a.batch)
        out = t1.generate(q, return_prompt=False, generate_ref_response=a.mode == "cory", **gen)
        r1 = out[0] if a.mode == "cory" else out
        qt, s1 = [tok.decode(x) for x in q], [tok.decode(x) for x in r1]
        if a.mode == "cory":
            merged = [torch.tensor(tok.encode(OBSERVER.format(x + y, x))) for x, y in zip(qt, s1)]
            r2 = t2.generate(merged, return_prompt=False, **gen)
            s2 = [tok.decode(x) for x in r2]
            both = [x + y for x, y in zip(reward([x + y for x, y in zip(qt, s1)]),
                                          reward([x + y for x, y in zip(qt, s2)]))]
            t1.step(q, list(r1), both)
            t2.step(merged, list(r2), both)
            if (it + 1) % 5 == 0:  # the official role exchange: save both, load them crossed
                m1.save_pretrained(tmp + "/1")
                m2.save_pretrained(tmp + "/2")
                (m1, t1), (m2, t2) = trainer(tmp + "/2"), trainer(tmp + "/1")
        else:
            t1.step(q, list(r1), reward([x + y for x, y in zip(qt, s1)]))
        if it > 0:
            times.append(time.perf_counter() - t0)
    shutil.rmtree(tmp)
    print(json.dumps({"impl": "trl-0.11.4", "mode": a.mode, "batch": a.batch, "resp": a.resp,
                      "s_per_iter": round(statistics.median(times), 3),
                      "all": [round(x, 2) for x in times],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
