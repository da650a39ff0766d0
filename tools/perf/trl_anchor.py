"""The TRL 0.11 anchor: TRL's PPOTrainer, and the official CORY recipe on it.

    .venv-trl/bin/python tools/perf/trl_anchor.py MODEL_FOLDER --mode ppo|cory [--iters 3]
    .venv-trl/bin/python tools/perf/trl_anchor.py REF_FOLDER --workload reference --mode cory

Runs in the TRL venv (`make perf-trl-venv`: TRL 0.11.4 needs transformers 4.x), so it imports
nothing from the project but the review openings (a plain-Python file). Two workloads, both
full float32 fine-tuning with 4 PPO epochs, top_k 0 / top_p 1 and the paper's observer prompt:
`reviews` (a real model: 2-8-token openings, 3 x VADER of query + response, batch 16, 12 new
tokens, lr 5e-4) and `reference` (`perf.py`'s: the model of `reference_model.py`, 2-8-token
prefixes of 8-word windows of CPython's pydoc topics, the vowel ratio of query + response as a
negligible-cost reward, batch 64, mini-batch 16, 16 new tokens, repetition penalty 1.1,
lr 1.41e-5). Options override a workload's sizes. `cory` follows the official
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


WORKLOADS = {"reviews": dict(batch=16, mini=16, resp=12, lr=5e-4, penalty=1.0),
             "reference": dict(batch=64, mini=16, resp=16, lr=1.41e-5, penalty=1.1)}


def reviews(tok):
    """The reviews workload's (queries(n), reward(texts))."""
    texts, vader = openings(), SentimentIntensityAnalyzer()

    def queries(n):
        picked = random.sample(texts, n)
        return [torch.tensor(tok.encode(t)[: random.randint(2, 8)]) for t in picked]

    def reward(texts):
        return [torch.tensor(3.0 * vader.polarity_scores(t)["compound"]) for t in texts]

    return queries, reward


def reference(tok):
    """The reference workload's (queries(n), reward(texts)): pydoc prefixes, vowel ratio."""
    import pydoc_data.topics as topics

    words = " ".join(topics.topics.values()).split()

    def queries(n):
        out = []
        for _ in range(n):
            i = random.randrange(len(words) - 10)
            ids = tok.encode(" ".join(words[i:i + 8]))[: random.randint(2, 8)]
            out.append(torch.tensor(ids or [0]))
        return out

    def reward(texts):
        return [torch.tensor(sum(c in "aeiou" for c in t) / (1 + len(t))) for t in texts]

    return queries, reward


def main() -> None:
    """Time the chosen mode; print one JSON line."""
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--mode", default="ppo", choices=["ppo", "cory"])
    p.add_argument("--workload", default="reviews", choices=sorted(WORKLOADS))
    p.add_argument("--iters", type=int, default=3, help="timed iterations (after one)")
    for name in ("batch", "mini", "resp"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    w = {**WORKLOADS[a.workload], **{k: v for k, v in vars(a).items()
                                       if k in ("batch", "mini", "resp", "lr") and v is not None}}
    a.batch, a.resp = w["batch"], w["resp"]
    torch.manual_seed(0)
    random.seed(0)
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    tok.pad_token = tok.eos_token
    queries, reward = (reviews(tok) if a.workload == "reviews" else reference(tok))
    cfg = dict(learning_rate=w["lr"], batch_size=a.batch, mini_batch_size=w["mini"],
               ppo_epochs=4, init_kl_coef=0.3, kl_penalty="full", seed=0)
    gen = dict(min_length=-1, top_k=0.0, top_p=1.0, do_sample=True,
               pad_token_id=tok.eos_token_id, max_new_tokens=a.resp,
               **({"repetition_penalty": w["penalty"]} if w["penalty"] != 1.0 else {}))

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
    print(json.dumps({"impl": "trl-0.11.4", "workload": a.workload, "mode": a.mode,
                      "batch": a.batch, "resp": a.resp,
                      "s_per_iter": round(statistics.median(times), 3),
                      "all": [round(x, 2) for x in times],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
