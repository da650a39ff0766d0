"""`python -m benchmarks.leaderboard`: a plan's studies aggregated as the RL field does (IQM,
probability of improvement, performance profiles), rendered the same bytes every time, checked
byte for byte, run resumably at one pinned commit, bad input refused by name."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

import benchmarks.leaderboard as command
from benchmarks.evidence.aggregates import aggregate, iqm, probability_of_improvement
from benchmarks.evidence.leaderboard import Board, cpu_cost, entries, missing_runs, progress
from benchmarks.evidence.records import FORMAT, RunData
from benchmarks.report.leaderboard import README_END, README_START

# alone gain per seed: method -> task -> gains
GAINS = {"ppo": {"reviews": [0.7, 0.5, 0.9, 0.6], "reasoning": [0.3, 0.4, 0.25, 0.5]},
         "cory": {"reviews": [0.3, 0.2, 0.5, 0.1], "reasoning": [0.35, 0.45, 0.3, 0.5]},
         "grpo": {"reviews": [1.4, 1.0, 1.2, 1.6], "reasoning": [0.1, 0.0, 0.2, 0.1]},
         "cory-grpo": {"reviews": [1.5, 1.1, 1.3, 1.9], "reasoning": [0.2, 0.1, 0.1, 0.3]}}
SCALE = {"reviews": 0.7, "reasoning": 0.36}


def study(folder, task, gains=GAINS, train=None, imports=()):
    """A finished study folder whose methods' alone gains per seed are `gains` (base 0, two
    later points averaging the gain, ΣKL rising 0, 1, 2), with done/ markers."""
    evals, rows = [], []
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "done").mkdir(exist_ok=True)
    for method, per_task in gains.items():
        agents = ["llm_0"] if method in ("ppo", "grpo") else ["llm_0", "llm_1"]
        for seed, g in enumerate(per_task[task]):
            run = f"{task}-{method}-seed{seed}"
            (folder / "done" / run).write_text("")
            for it, r, kl in ((0, 0.0, 0.0), (3, g - 0.1, 1.0), (6, g + 0.1, 2.0)):
                for a in agents:
                    evals.append({"task": task, "method": method, "seed": seed, "run": run,
                                  "swept_kl_coef": None, "agent": a, "iteration": it,
                                  "task_reward": r, "kl": kl, "combined_reward": r})
            for it in range(6):
                for pos, a in enumerate(agents):
                    rows.append({"task": task, "method": method, "seed": seed, "run": run,
                                 "swept_kl_coef": None, "agent": a, "iteration": it,
                                 "role": ["pioneer", "observer"][pos], "position": pos,
                                 "response_length": 10, "optimizer_steps": 4,
                                 "time_cpu_s": 2.0})
    (folder / "alone.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "run_config.json").write_text(json.dumps({
        "format": FORMAT, "tasks": [task], "methods": list(gains),
        "seeds": list(range(len(next(iter(gains.values()))[task]))), "imports": list(imports),
        "train": train or {"batch_size": 4, "model": "smollm2-135m"}}))
    return folder


PLAN = '''written = "2026-12-06"
alpha = 0.05

[leaderboard]
model = "smollm2-135m"
reference = "ppo"
methods = ["ppo", "cory", "grpo", "cory-grpo"]
pairs = [["cory", "ppo"], ["cory-grpo", "grpo"]]
tuning = "none"

[leaderboard.scale]
reviews = 0.7
reasoning = 0.36

[[study]]
task = "reviews"
folder = "{root}/reviews"
preset = "leaderboard"
seeds = [0, 1, 2, 3]

[[study]]
task = "reasoning"
folder = "{root}/reasoning"
preset = "leaderboard-math"
seeds = [0, 1, 2, 3]

[[hypothesis]]
id = "C-ppo-rev"
claim = "cory learns alone differently from ppo"
a = {{ folder = "{root}/reviews", method = "cory" }}
b = {{ folder = "{root}/reviews", method = "ppo" }}
seeds = 4

[[hypothesis]]
id = "C-grpo-rev"
claim = "cory-grpo learns alone differently from grpo"
a = {{ folder = "{root}/reviews", method = "cory-grpo" }}
b = {{ folder = "{root}/reviews", method = "grpo" }}
seeds = 4
'''


@pytest.fixture
def board(tmp_path):
    """A finished two-task leaderboard of four methods, four seeds each."""
    study(tmp_path / "reviews", "reviews")
    study(tmp_path / "reasoning", "reasoning")
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(root=tmp_path))
    return path


def normalized(method):
    """task -> the method's normalized scores, by hand."""
    return {t: [g / SCALE[t] for g in GAINS[method][t]] for t in SCALE}


def test_each_methods_aggregates_are_the_field_statistics_of_its_normalized_gains(board):
    table = {e.method: e for e in entries(Board.load(board))}
    for method in GAINS:
        mine = normalized(method)
        pooled = np.concatenate([mine["reviews"], mine["reasoning"]])
        e = table[method]
        assert e.iqm[0] == pytest.approx(iqm(pooled)) and e.iqm == aggregate(mine)
        assert e.mean[0] == pytest.approx(pooled.mean())
        assert e.final_kl == pytest.approx(2.0)
        models = 1 if method in ("ppo", "grpo") else 2  # 6 iterations, 2.0 s a record
        assert e.cpu_s == pytest.approx(models * 6 * 2.0)
    assert table["ppo"].p_over_reference is None
    assert table["grpo"].p_over_reference == probability_of_improvement(normalized("grpo"),
                                                                        normalized("ppo"))
    # grpo beats every ppo run on reviews and loses every one on reasoning: P = (1 + 0) / 2
    assert table["grpo"].p_over_reference[0] == pytest.approx(0.5)
    ranked = [e.method for e in entries(Board.load(board))]
    assert ranked == sorted(GAINS, key=lambda m: -table[m].iqm[0])


def test_the_page_renders_the_same_bytes_and_check_holds_it_and_the_readme(board, tmp_path,
                                                                          capsys):
    page, readme = tmp_path / "leaderboard.md", tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_START}\nold\n{README_END}\n\nafter\n")
    command.main(["render", str(board), "--out", str(page), "--readme", str(readme)])
    first = page.read_bytes()
    assert (tmp_path / "profiles.png").stat().st_size > 1000
    command.main(["render", str(board), "--out", str(page), "--readme", str(readme)])
    assert page.read_bytes() == first
    text = page.read_text()
    assert "| 1 | `cory-grpo` |" in text and "C-grpo-rev" in text and "32 of 32 runs" in text
    assert "after" in readme.read_text() and "`cory-grpo`" in readme.read_text()
    command.main(["check", str(board), str(page), str(readme)])
    assert "match their rendering" in capsys.readouterr().out
    command.main(["render", str(board), "--out", str(page), "--readme", str(readme), "--check"])
    assert page.read_bytes() == first and "match their rendering" in capsys.readouterr().out
    page.write_text(text.replace("| 1 | `cory-grpo`", "| 1 | `ppo`"))
    with pytest.raises(SystemExit, match="differs from its rendering"):
        command.main(["check", str(board), str(page), str(readme)])
    with pytest.raises(SystemExit, match="differs from its rendering"):
        command.main(["render", str(board), "--out", str(page), "--check"])


def test_one_rendering_reads_each_study_folder_once(
        board, tmp_path, monkeypatch):
    loads = []
    real = RunData.load.__func__
    monkeypatch.setattr(RunData, "load", classmethod(
        lambda cls, folder: loads.append(str(folder)) or real(cls, folder)))
    command.main(["render", str(board), "--out", str(tmp_path / "leaderboard.md")])
    assert sorted(loads) == [str(tmp_path / "reasoning"), str(tmp_path / "reviews")]


def test_check_holds_the_profile_plot_to_the_records_numbers(board, tmp_path):
    page, plot = tmp_path / "leaderboard.md", tmp_path / "profiles.png"
    command.main(["render", str(board), "--out", str(page)])
    drawn = plot.read_bytes()
    plot.write_bytes(drawn.replace(b"cory leaderboard profiles ", b"cory leaderboard profileZ "))
    with pytest.raises(SystemExit, match="profiles.png is not the plot of these records"):
        command.main(["check", str(board), str(page)])
    plot.write_bytes(drawn)  # a record changes what the profiles are, not the page's rounding
    rows = (tmp_path / "reasoning" / "alone.jsonl").read_text().splitlines()
    bumped = [json.loads(r) for r in rows]
    for r in bumped:
        if r["method"] == "grpo" and r["seed"] == 0 and r["iteration"] == 6:
            r["task_reward"] += 0.02
    (tmp_path / "reasoning" / "alone.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                                for r in bumped))
    with pytest.raises(SystemExit, match="is not the plot of these records"):
        command.main(["check", str(board), str(page)])


def test_a_folder_missing_runs_is_refused_by_name_unless_partial(board, tmp_path):
    (tmp_path / "reviews" / "done" / "reviews-cory-seed2").unlink()  # still running
    b = Board.load(board)
    assert missing_runs(b) == ["reviews cory seed 2"]
    assert progress(b).line().startswith("31 of 32 runs finished")
    with pytest.raises(SystemExit, match="1 planned runs have not finished \\(reviews cory "
                       "seed 2\\)"):
        command.main(["render", str(board), "--out", str(tmp_path / "p.md")])
    command.main(["render", str(board), "--out", str(tmp_path / "p.md"), "--partial"])
    assert "**In progress:** 31 of 32 runs finished" in (tmp_path / "p.md").read_text()


def test_status_states_the_cpu_time_spent_and_left_from_the_records(board, tmp_path, capsys):
    reviews = tmp_path / "reviews"
    config = json.loads((reviews / "run_config.json").read_text())
    config["train"]["iterations"] = 10  # the records hold 6 of each run's 10 iterations
    (reviews / "run_config.json").write_text(json.dumps(config))
    (reviews / "done" / "reviews-cory-seed2").unlink()  # 4 iterations left at 2 x 2.0 s
    rows = [json.loads(x) for x in (reviews / "metrics.jsonl").read_text().splitlines()]
    (reviews / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows
                                                   if r["method"] != "grpo"))
    for seed in range(4):  # grpo not timed: 10 iterations x ppo's 2.0 s x (1 model / 1)
        (reviews / "done" / f"reviews-grpo-seed{seed}").unlink()
    (tmp_path / "reasoning" / "metrics.jsonl").unlink()  # nothing timed on reasoning
    (tmp_path / "reasoning" / "done" / "reasoning-ppo-seed0").unlink()
    cost = cpu_cost(Board.load(board))
    assert cost.spent_s == pytest.approx(4 * 6 * (2.0 + 4.0 + 4.0))  # ppo, cory, cory-grpo
    assert cost.left_s == pytest.approx(4 * 4.0 + 4 * 10 * 2.0)
    assert cost.scaled == ["reviews grpo"] and cost.untimed == ["reasoning"]
    command.main(["status", str(board), "--workers", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("26 of 32 runs finished")
    assert out[1].startswith("0.1 CPU-hours spent; at least 0.0 CPU-hours left (0.0 h at 2 "
                             "runs at once), not counting reasoning (not timed yet); 1 method not "
                             "timed yet, costed as another's scaled by models x episodes "
                             "(reviews grpo)")


def keep_gzipped(folder):
    """Replace a study folder's metrics.jsonl by its gzipped copy, as a published folder does."""
    metrics = folder / "metrics.jsonl"
    metrics.with_name("metrics.jsonl.gz").write_bytes(gzip.compress(metrics.read_bytes()))
    metrics.unlink()


def test_status_counts_the_cpu_time_of_a_folder_whose_records_are_kept_gzipped(board, tmp_path):
    before = cpu_cost(Board.load(board))
    keep_gzipped(tmp_path / "reviews")
    after = cpu_cost(Board.load(board))
    assert after.spent_s == pytest.approx(before.spent_s) and after.spent_s > 0


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('"grpo", "cory-grpo"]', '"grpo", "cory-grpoo"]', 1),
     "unknown method 'cory-grpoo'"),
    (lambda t: t.replace('task = "reasoning"', 'task = "reasonin"'), "unknown task 'reasonin'"),
    (lambda t: t.replace('preset = "leaderboard-math"', 'preset = "nope"'),
     "unknown preset 'nope'"),
    (lambda t: t.replace("reasoning = 0.36", "reasoning = 0"), "reasoning must be a number > 0"),
    (lambda t: t.replace('[["cory", "ppo"],', '[["cory", "rloo"],'), "must be two of its"),
])
def test_a_bad_plan_is_refused_naming_the_bad_value(board, edit, message, capsys):
    board.write_text(edit(board.read_text()))
    with pytest.raises(SystemExit, match=message):
        command.main(["status", str(board)])


def git(cwd, *args):
    """Run git in cwd."""
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def test_the_first_run_pins_the_commit_and_a_plan_edited_after_is_refused(board, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(command, "code_changes", lambda root=None: "")
    with pytest.raises(ValueError, match="is not committed"):
        command.pin(Board.load(board))
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "plan.toml")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "plan")
    saved = command.pin(Board.load(board))
    assert saved == json.loads((tmp_path / "pin.json").read_text())
    assert saved["commit"] == command._git("rev-parse", "HEAD")
    assert command.pin(Board.load(board)) == saved  # read back, not made again
    board.write_text(board.read_text().replace("tuning = \"none\"", "tuning = \"some\""))
    with pytest.raises(ValueError, match="was edited after its runs began"):
        command.pin(Board.load(board))


@pytest.fixture
def launched(tmp_path, monkeypatch):
    """The (args, cwd) of each `benchmarks.run` that `leaderboard run` starts, none of them run;
    the plan pinned to commit abc, whose code is at tmp_path."""
    calls = []
    monkeypatch.setattr(command, "pin", lambda b: {"commit": "abc"})
    monkeypatch.setattr(command, "code_root", lambda commit: tmp_path)
    monkeypatch.setattr(command.subprocess, "run",
                        lambda args, cwd: calls.append((args, cwd)) or
                        subprocess.CompletedProcess(args, 0))
    return calls


def test_run_continues_each_study_with_the_plans_options(board, tmp_path, launched, capsys):
    (tmp_path / "reasoning" / "run_config.json").unlink()
    for task in ("reviews", "reasoning"):  # one run left in each study
        (tmp_path / task / "done" / f"{task}-cory-seed3").unlink()
    command.main(["run", str(board), "--workers", "2", "--threads", "1"])
    (rev, cwd), (math_, _) = launched
    assert cwd == tmp_path and rev[:3] == [sys.executable, "-m", "benchmarks.run"]
    assert rev[rev.index("--methods") + 1] == "ppo,cory,grpo,cory-grpo"
    assert rev[rev.index("--seeds") + 1] == "0,1,2,3" and "--resume" in rev
    assert "--resume" not in math_ and math_[math_.index("--preset") + 1] == "leaderboard-math"
    assert rev[-5:] == ["--workers", "2", "--threads", "1", "--resume"]
    assert math_[-4:] == ["--workers", "2", "--threads", "1"]
    first = capsys.readouterr().out.splitlines()[0]  # where the plan stands, in runs and hours
    assert "30 of 32 runs finished" in first
    assert "0.2 CPU-hours spent; about 0.0 CPU-hours left (0.0 h at 2 runs at once)" in first


def test_run_leaves_a_finished_study_alone_even_with_its_records_gzipped(board, tmp_path,
                                                                         launched, capsys):
    keep_gzipped(tmp_path / "reviews")
    (tmp_path / "reasoning" / "done" / "reasoning-ppo-seed0").unlink()
    command.main(["run", str(board)])
    ((only, _),) = launched
    assert only[only.index("--tasks") + 1] == "reasoning"
    assert "leaderboard: reviews already finished" in capsys.readouterr().out


MINE = {"reinforce-ema": {"reviews": [1.0, 0.8, 1.2, 0.9, 1.1], "reasoning": []}}
PLUGIN = ["examples.exercises.ex2_learner"]  # registers the learner reinforce-ema


def test_place_ranks_your_folder_beside_the_plans_records_over_the_tasks_it_covers(board,
                                                                                     tmp_path):
    """A folder of a plug-in learner, run with the plan's setting on `reviews` only: the board is
    read over `reviews`, every method's aggregates are those of its reviews scores, and the
    placed method's row and P(mine > method) are the field statistics of its own."""
    from benchmarks.evidence.placement import place

    mine = study(tmp_path / "mine", "reviews", MINE, imports=PLUGIN)
    placing = place(Board.load(board), [mine])
    assert [s.task for s in placing.board.studies] == ["reviews"]
    assert placing.methods == ("reinforce-ema",)
    assert placing.commits == {"reinforce-ema": ["unrecorded"]}
    table = {e.method: e for e in entries(placing.board)}
    ours = {"reviews": [g / 0.7 for g in MINE["reinforce-ema"]["reviews"]]}
    ppo = {"reviews": normalized("ppo")["reviews"]}
    assert table["reinforce-ema"].iqm == aggregate(ours) and table["reinforce-ema"].seeds == 5
    assert table["ppo"].iqm == aggregate(ppo)  # the board's methods, over reviews alone
    assert table["reinforce-ema"].p_over_reference == probability_of_improvement(ours, ppo)
    out = tmp_path / "place.md"
    command.main(["place", str(board), str(mine), "--out", str(out)])
    text = out.read_text()
    assert "| `reinforce-ema` (placed) |" in text and "Read over `reviews` only" in text
    p = probability_of_improvement(ours, {"reviews": normalized("grpo")["reviews"]})
    assert f"| `grpo` | {p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}] |" in text
    assert "5 finished runs" in text and "no verdict" in text


@pytest.mark.parametrize("make, message", [
    (lambda root: study(root / "x", "reviews", MINE, imports=PLUGIN,
                        train={"batch_size": 8, "model": "smollm2-135m"}),
     "x was not run with the setting of the plan's reviews study .*: train.batch_size: the "
     "plan's 4, .*x's 8"),
    (lambda root: study(root / "x", "reviews", {"ppo": GAINS["ppo"]}),
     "'ppo' is on the board already"),
    (lambda root: study(root / "x", "sentiment", {"ppo": {"sentiment": [1.0, 2.0]}}),
     r"runs \['sentiment'\]; the plan has studies of \['reviews', 'reasoning'\] only"),
    (lambda root: (root / "x").mkdir(), "holds no study"),
    (lambda root: study(root / "x", "reviews", {"mystery": MINE["reinforce-ema"]}),
     "unknown method 'mystery'"),
])
def test_place_refuses_a_folder_it_cannot_place_naming_why(board, tmp_path, make, message):
    make(tmp_path)
    with pytest.raises(SystemExit, match=message):
        command.main(["place", str(board), str(tmp_path / "x")])
