"""`make gpu-check`: the dry run works end to end on a CPU, and its FLOP count is the paper's."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "perf"))
import gpu_check  # noqa: E402  (tools/perf/gpu_check.py, a script, not a package)


def test_flop_count_of_gpt2_large_is_its_774m_parameters(tmp_path):
    gpt2 = next(s for s in gpu_check.shapes(dry=False) if s.name == "imdb")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", **gpt2.dims}))
    n, layers, width = gpu_check.flop_dims(tmp_path)
    assert (layers, width) == (36, 1280)
    assert n == pytest.approx(774e6, rel=0.01)  # matmuls + LM head; biases/norms/positions aside
    # forward: 2N per token plus 4*L*d*s for the attention scores and mixing
    assert gpu_check.forward_flops(10, 48, (n, layers, width)) == 10 * (2 * n + 4 * 36 * 1280 * 48)


def test_the_paper_shapes_keep_their_optimizer_batches():
    imdb, gsm8k = gpu_check.shapes(dry=False)
    assert imdb.batch_size == imdb.mini_batch_size * imdb.grad_accum_steps == 256
    assert (gsm8k.batch_size, gsm8k.mini_batch_size, gsm8k.grad_accum_steps) == (32, 2, 16)
    assert gsm8k.load_in_4bit and gsm8k.lora


@pytest.mark.slow
def test_dry_run_of_make_gpu_check_writes_the_table(tmp_path):
    out = tmp_path / "check"
    p = subprocess.run(["make", "-s", "gpu-check", f"GPU_PY={sys.executable}",
                        f"ARGS=--dry-run --iterations 2 --out {out}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    report = json.loads((out / "gpu_check.json").read_text())
    ran = [j for j in report["jobs"] if j.get("result")]
    assert {(j["shape"], j["method"]) for j in ran} == {
        ("imdb", "ppo"), ("imdb", "cory"), ("gsm8k", "ppo"), ("gsm8k", "cory")}
    assert all(j["skipped"] for j in report["jobs"] if j["compile"])  # compile: CUDA only
    for j in ran:
        r, shape = j["result"], report["shapes"][j["shape"]]
        agents = 2 if j["method"] == "cory" else 1
        assert 0 < r["generated_tokens"] <= agents * shape["batch_size"] * shape["max_new_tokens"]
        assert r["update_s"] > 0 and r["ref_s"] > 0 and r["update_tflops"] > 0
        assert r["mfu"] is None  # no bf16 peak on a CPU
        assert all(math.isfinite(x) for x in r["losses"]) and r["skipped_batches"] == [0, 0]
    assert report["fsdp_checkpoint"]["ok"] and report["fsdp_checkpoint"]["tensors"] > 0
    assert "skipped" in report["tests"]["summary"]  # the CUDA tests were selected and skipped
    table = (out / "gpu_check.md").read_text()
    assert table.count("\n| imdb |") == 4 and "MFU" in table


def test_building_a_model_leaves_the_cached_task_tokenizer_unpadded(tmp_path):
    from cory_env.data.tokenizer import task_tokenizer

    before = len(task_tokenizer("sentiment"))
    shape = gpu_check.Shape("imdb", "sentiment", "gpt2", dict(
        n_layer=1, n_embd=8, n_head=2, vocab_size=before + 5, n_positions=64), 2, 2, 1, 4)
    gpu_check.build_model(shape, tmp_path)
    assert len(task_tokenizer("sentiment")) == before  # the next model's build sees it unpadded
    small = gpu_check.Shape("tiny", "sentiment", "gpt2", dict(
        n_layer=1, n_embd=8, n_head=2, vocab_size=before, n_positions=64), 2, 2, 1, 4)
    assert (gpu_check.build_model(small, tmp_path) / "config.json").exists()
