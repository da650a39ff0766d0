"""`python -m benchmarks.why`: a pre-stated plan's table from records, with hand-checkable
estimates, TOST, Holm over the whole family, budget flags, and the same bytes every time."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks.evidence.budgets import arm_budget
from benchmarks.evidence.plan import Plan, evaluate, seeds_needed
from benchmarks.evidence.records import FORMAT, RunData
from benchmarks.why import check_summary, main, render

GAINS = {"ppo": [0.8, 0.5, 0.9, 0.6], "cory": [0.3, 0.2, 0.5, 0.1],
         "cory-no-re": [0.32, 0.18, 0.52, 0.12]}


def folder(tmp_path, steps=None):
    """A study folder whose methods' alone gains per seed are GAINS (base 0, two later points
    averaging the gain), with training records of 3 iterations at batch 4."""
    steps = steps or {}
    evals, rows = [], []
    for method, gains in GAINS.items():
        agents = ["llm_0"] if method == "ppo" else ["llm_0", "llm_1"]
        for seed, g in enumerate(gains):
            for it, r in ((0, 0.0), (3, g - 0.1), (6, g + 0.1)):
                for a in agents:
                    evals.append({"task": "reviews", "method": method, "seed": seed,
                                  "swept_kl_coef": None, "run": f"reviews-{method}-seed{seed}",
                                  "agent": a, "iteration": it,
                                  "task_reward": r, "kl": 0.0, "combined_reward": r})
            for it in range(3):
                for pos, a in enumerate(agents):
                    rows.append({"task": "reviews", "method": method, "seed": seed,
                                 "swept_kl_coef": None, "agent": a, "iteration": it,
                                 "role": ["pioneer", "observer"][pos], "position": pos,
                                 "response_length": 10, "optimizer_steps": steps.get(method, 4)})
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "alone.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run_config.json").write_text(json.dumps({"format": FORMAT,
                                                          "train": {"batch_size": 4}}))
    return tmp_path


def plan_file(tmp_path, run, extra=""):
    """A plan of three hypotheses on `run` (and one whose folder does not exist)."""
    text = f'''written = "2026-12-04"
[[hypothesis]]
id = "D"
claim = "cory differs from ppo"
a = {{ folder = "{run}", method = "cory" }}
b = {{ folder = "{run}", method = "ppo" }}
seeds = 4
[[hypothesis]]
id = "E"
claim = "role exchange changes nothing"
a = {{ folder = "{run}", method = "cory" }}
b = {{ folder = "{run}", method = "cory-no-re" }}
test = "equivalence"
margin = 0.1
seeds = 4
[[hypothesis]]
id = "L"
claim = "later"
a = {{ folder = "{tmp_path}/none", method = "cory" }}
b = {{ folder = "{run}", method = "ppo" }}
{extra}'''
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


def test_the_table_is_the_hand_computed_tests_holm_adjusted_over_the_family(tmp_path):
    run = folder(tmp_path / "run")
    plan = Plan.load(plan_file(tmp_path, run))
    d_row, e_row, later = evaluate(plan)
    d = np.array(GAINS["cory"]) - np.array(GAINS["ppo"])
    t = stats.ttest_rel(GAINS["cory"], GAINS["ppo"])
    assert d_row.estimate == pytest.approx(d.mean()) and d_row.p == pytest.approx(t.pvalue)
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert (d_row.low, d_row.high) == pytest.approx((d.mean() - half, d.mean() + half))
    e = np.array(GAINS["cory"]) - np.array(GAINS["cory-no-re"])  # within ±0.1: equivalent
    se = e.std(ddof=1) / 2
    tost = max(1 - stats.t.cdf((e.mean() + 0.1) / se, 3), stats.t.cdf((e.mean() - 0.1) / se, 3))
    assert e_row.p == pytest.approx(tost)
    assert later.n == 0 and later.p == 1.0  # not run: counted in the family as p = 1
    ps = sorted([d_row.p, e_row.p])  # Holm over 3: the smallest times 3, the next times 2
    assert min(d_row.p_holm, e_row.p_holm) == pytest.approx(3 * ps[0])
    assert max(d_row.p_holm, e_row.p_holm) == pytest.approx(max(3 * ps[0], 2 * ps[1]))
    assert d_row.verdict(0.05) == "a < b"
    assert e_row.verdict(0.05) == "equivalent within ±0.1"
    assert later.verdict(0.05) == "not run (0 of 10 seeds)"
    assert replace(later, n=1).verdict(0.05) == "incomplete (1 of 10 seeds): not tested"


def test_a_contrast_whose_budgets_differ_is_flagged_unless_they_are_its_factor(tmp_path):
    run = folder(tmp_path / "run", steps={"cory": 8})
    data = RunData.load(run)
    assert arm_budget(data, "reviews", "cory")["optimizer steps"] == 24  # 3 its x 8 per model
    assert arm_budget(data, "reviews", "ppo")["alone-role turns"] == 3
    assert arm_budget(data, "reviews", "cory")["alone-role turns"] == 1.5  # half of them
    plan = Plan.load(plan_file(tmp_path, run))
    text = render(plan, evaluate(plan), "plan.toml")
    assert ("**budgets differ: optimizer steps 24 vs 12, rows per optimizer step 0.5 vs 1, "
            "alone-role turns 1.5 vs 3**") in text
    path = plan_file(tmp_path, run).read_text().replace(
        'id = "D"', 'id = "D"\nfactor_budgets = ["optimizer steps", "rows per optimizer step", '
                    '"alone-role turns"]')
    (tmp_path / "plan2.toml").write_text(path)
    plan2 = Plan.load(tmp_path / "plan2.toml")
    assert evaluate(plan2)[0].flags == []


def test_the_rendered_table_is_the_same_bytes_every_time(tmp_path, capsys):
    run = folder(tmp_path / "run")
    path = plan_file(tmp_path, run)
    main([str(path), "--out", str(tmp_path / "a.md")])
    main([str(path), "--out", str(tmp_path / "b.md")])
    assert (tmp_path / "a.md").read_bytes() == (tmp_path / "b.md").read_bytes()
    main([str(path)])
    assert capsys.readouterr().out == (tmp_path / "a.md").read_text()


def test_a_bad_plan_is_refused_naming_the_entry(tmp_path):
    path = plan_file(tmp_path, tmp_path, extra='test = "bigger"')
    with pytest.raises(SystemExit):
        main([str(path)])
    with pytest.raises(ValueError, match="hypothesis L: test must be one of"):
        Plan.load(path)


@pytest.mark.parametrize("extra, message", [
    ('method = "x"', "hypothesis L: .*'method'"),
    ("seeds = 1", "hypothesis L: seeds must be a whole number >= 2 .*got 1"),
    ("margin = -0.1", "hypothesis L: margin must be > 0, got -0.1"),
    ("wrong = 1", "hypothesis L: .*'wrong'"),
])
def test_every_bad_entry_is_named_with_the_plan_file(tmp_path, extra, message):
    path = plan_file(tmp_path, tmp_path, extra=extra)
    with pytest.raises(ValueError, match=f"{path}: {message}"):
        Plan.load(path)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('method = "cory-no-re"', 'method = "cory-no-ree"'),
     "hypothesis E: unknown method 'cory-no-ree'; registered: .*'cory-no-re'"),
    (lambda t: t.replace('method = "ppo" }', 'method = "ppo", task = "review" }', 1),
     "hypothesis D: unknown task 'review'; registered: .*'reviews'"),
    (lambda t: t.replace('method = "ppo" }', 'method = "ppo", iterations = 0 }', 1),
     "hypothesis D: arm 'ppo': iterations must be a whole number > 0, got 0"),
    (lambda t: t.replace('id = "D"\n', ""), r"hypothesis \?: .*'id'"),
    (lambda t: t.replace("[[hypothesis]]", "[[hypothesis]", 1), "not TOML"),
    (lambda t: "alpha = 1.5\n" + t, "alpha must be a number between 0 and 1, got 1.5"),
])
def test_a_misspelt_arm_or_a_broken_file_is_refused_not_read_as_not_run(tmp_path, edit, message,
                                                                         capsys):
    run = folder(tmp_path / "run")
    path = plan_file(tmp_path, run)
    path.write_text(edit(path.read_text()))
    with pytest.raises(ValueError, match=message):
        Plan.load(path)
    with pytest.raises(SystemExit):
        main([str(path)])
    assert str(path) in capsys.readouterr().err


def test_a_plugin_method_or_task_its_folder_ran_is_accepted(tmp_path):
    run = folder(tmp_path / "run")
    config = json.loads((run / "run_config.json").read_text())
    (run / "run_config.json").write_text(json.dumps({**config, "methods": ["my-method"],
                                                     "tasks": ["my-task"]}))
    path = plan_file(tmp_path, run)
    path.write_text(path.read_text().replace('method = "cory-no-re" }',
                                             'method = "my-method", task = "my-task" }'))
    rows = evaluate(Plan.load(path))
    assert rows[1].n == 0 and rows[0].n == 4  # no records of it yet: read as not run


def test_seeds_needed_follow_the_t_formula():
    from benchmarks.evidence.plan import Arm, Hypothesis

    h = Hypothesis("x", "", Arm("f", "a"), Arm("f", "b"), margin=0.25)
    n = seeds_needed(0.25, h)
    q = lambda n, p: stats.t.ppf(p, n - 1)  # noqa: E731
    assert (q(n, 0.975) + q(n, 0.8)) * 0.25 / math.sqrt(n) <= 0.25
    assert (q(n - 1, 0.975) + q(n - 1, 0.8)) * 0.25 / math.sqrt(n - 1) > 0.25


def test_arms_made_by_other_code_or_draws_are_flagged(tmp_path):
    run = folder(tmp_path / "run")
    lines = (run / "alone.jsonl").read_text().splitlines()
    marked = [json.dumps({**json.loads(x), "commit": "a" * 40, "draws": "decode fast, torch 2"})
              if '"cory"' in x else x for x in lines]
    (run / "alone.jsonl").write_text("\n".join(marked) + "\n")
    rows = evaluate(Plan.load(plan_file(tmp_path, run)))
    flags = " ".join(rows[0].flags)
    assert "commit aaaaaaaaaaaa vs unrecorded" in flags
    assert "draws decode fast, torch 2 vs unrecorded" in flags
    assert "commit" in " ".join(rows[1].flags)  # cory against cory-no-re: the same mark


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def published():
    """The published plan and its rows, read from the repository's root (the plan's folders are
    relative to it); the working directory is restored before any test runs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        plan = Plan.load(ROOT / "docs/fidelity/plan.toml")
        return plan, evaluate(plan)


def test_the_published_plan_names_registered_methods_and_renders(published):
    from agents.learners.registry import resolve_method

    plan, rows = published
    assert len(plan.hypotheses) >= 10 and plan.written
    for h in plan.hypotheses:
        for arm in (h.a, h.b):
            resolve_method(arm.method)  # raises on an unknown method
            assert arm.folder.startswith("docs/fidelity/")
    assert render(plan, rows, "docs/fidelity/plan.toml") == \
        (ROOT / "docs/fidelity/why.md").read_text()


def test_the_published_summary_rests_on_complete_rows_and_says_their_verdicts(published):
    plan, rows = published
    text = (ROOT / "docs/fidelity.md").read_text()
    assert check_summary(text, rows, plan.alpha) == []


AGAINST = "undecided (the whole interval lies {} 0, against the hypothesis)"


@pytest.mark.parametrize("a, b, direction, verdict", [
    ("cory", "ppo", "greater", AGAINST.format("below")),
    ("ppo", "cory", "less", AGAINST.format("above")),
    ("cory-no-re", "cory", "greater", "undecided (could hide an effect of up to {high:.2f})"),
    ("cory", "cory-no-re", "less", "undecided (could hide an effect of up to {low:.2f})"),
    ("ppo", "cory", "greater", "supported"),
])
def test_a_one_sided_row_reads_only_its_directions_side_of_the_interval(
        tmp_path, a, b, direction, verdict):
    run = folder(tmp_path / "run")
    path = plan_file(tmp_path, run, extra=f'''[[hypothesis]]
id = "S"
claim = "one-sided"
a = {{ folder = "{run}", method = "{a}" }}
b = {{ folder = "{run}", method = "{b}" }}
test = "superiority"
direction = "{direction}"
seeds = 4''')
    row = evaluate(Plan.load(path))[-1]
    p = stats.ttest_rel(GAINS[a], GAINS[b], alternative=direction).pvalue
    assert row.p == pytest.approx(p)
    assert row.verdict(0.05) == verdict.format(high=row.high, low=-row.low)


def test_a_welch_contrast_is_scipys_welch_test(tmp_path):
    from benchmarks.evidence.intervals import welch_interval

    a, b = [0.3, 0.2, 0.5, 0.1, 0.45], [0.8, 0.5, 0.9]
    iv = welch_interval(a, b)
    t = stats.ttest_ind(a, b, equal_var=False)
    assert iv.mean == pytest.approx(np.mean(a) - np.mean(b))
    assert 2 * min(iv.p_above(0), iv.p_below(0)) == pytest.approx(t.pvalue)
    assert iv.n == 3 and iv.low < iv.mean < iv.high


def test_a_row_short_of_its_planned_seeds_shows_its_estimate_but_is_not_tested(tmp_path):
    from dataclasses import replace

    plan = Plan.load(plan_file(tmp_path, folder(tmp_path / "run")))
    plan.hypotheses[0] = replace(plan.hypotheses[0], seeds=10)  # D: 4 of its 10 seeds in
    d_row, e_row, _ = evaluate(plan)
    assert d_row.n == 4 and not d_row.complete and math.isfinite(d_row.estimate)
    assert d_row.verdict(0.05) == "incomplete (4 of 10 seeds): not tested"
    assert e_row.p_holm == pytest.approx(min(1.0, 3 * e_row.p))  # D counted as p = 1
    line = next(x for x in render(plan, [d_row, e_row, _], "p").splitlines()
                if x.startswith("| D |"))
    assert "(n=4)" in line and "| – | – | incomplete" in line


def test_a_run_still_writing_its_points_does_not_count(tmp_path):
    run = folder(tmp_path / "run")
    plan = Plan.load(plan_file(tmp_path, run))
    unmarked = evaluate(plan)[0]  # a folder that keeps no markers: every seed counts
    (run / "ckpt").mkdir()
    (run / "done").mkdir()
    for method, gains in GAINS.items():
        for seed in range(len(gains) - (method == "cory")):  # cory's seed 3 still running
            (run / "done" / f"reviews-{method}-seed{seed}").write_text("")
    d_row = evaluate(plan)[0]
    assert d_row.n == 3 and d_row.verdict(0.05) == "incomplete (3 of 4 seeds): not tested"
    (run / "done" / "reviews-cory-seed3").write_text("")
    d_row = evaluate(plan)[0]
    assert d_row.n == 4 and (d_row.estimate, d_row.p) == (unmarked.estimate, unmarked.p)


def test_budgets_and_provenance_are_read_over_the_seeds_the_estimate_counts(tmp_path):
    run = folder(tmp_path / "run")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    partial = [r for r in rows if not (r["method"] == "cory" and r["seed"] == 3
                                       and r["iteration"] > 0)]  # seed 3: one iteration in
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in partial))
    (run / "done").mkdir()
    for method, gains in GAINS.items():
        for seed in range(len(gains) - (method == "cory")):
            (run / "done" / f"reviews-{method}-seed{seed}").write_text("")
    data = RunData.load(run)
    assert arm_budget(data, "reviews", "cory")["iterations"] == 2.5  # the running seed drags
    assert arm_budget(data, "reviews", "cory", seeds={0, 1, 2})["iterations"] == 3
    assert arm_budget(data, "reviews", "ppo", iterations=2)["episodes"] == 8  # 2 its x batch 4
    e_row = evaluate(Plan.load(plan_file(tmp_path, run)))[1]
    assert e_row.n == 3 and e_row.seeds == ({0, 1, 2}, {0, 1, 2}) and e_row.flags == []


SUMMARY_DOC = """# Fidelity
## What the evidence supports
{body}
## Next section
Nothing here is checked [X9].
"""


def summary_problems(tmp_path, body):
    """check_summary on a document whose summary is `body`, against the test plan's rows."""
    run = folder(tmp_path / "run")
    rows = evaluate(Plan.load(plan_file(tmp_path, run)))  # D: a < b, E: equivalent, L: not run
    return check_summary(SUMMARY_DOC.format(body=body), rows, 0.05)


def test_a_summary_whose_sentences_cite_their_rows_passes(tmp_path):
    body = ("- CORY's models learn less alone than PPO's [D]. Role exchange leaves it the same,\n"
            "  within ±0.1 [E].\n\nBoth hold at 4 seeds [D, E].")
    assert summary_problems(tmp_path, body) == []


@pytest.mark.parametrize("body, problem", [
    ("- CORY trails PPO [D]. It trails by a lot.", "cites no row"),
    ("- CORY trails PPO [D9].", "cites D9, not in the plan"),
    ("- CORY learns the same as PPO [D].", "says 'same' but no row it cites shows equivalence"),
    ("- A later run would tell [L].", "cites L, which is not run (0 of 10 seeds)"),
    ("No section here.", None),
])
def test_a_summary_that_breaks_a_rule_is_told_which(tmp_path, body, problem):
    problems = summary_problems(tmp_path, body)
    if problem is None:  # a sentence without a citation, in a paragraph
        assert any("cites no row" in p for p in problems)
    else:
        assert any(problem in p for p in problems), problems
    assert not any("X9" in p for p in problems)  # the next section is not the summary


def test_an_undecided_row_must_be_said_undecided(tmp_path):
    run = folder(tmp_path / "run")
    rows = evaluate(Plan.load(plan_file(tmp_path, run)))
    rows[0].p_holm = 0.5  # D undecided at this level
    doc = SUMMARY_DOC.format(body="- CORY trails PPO [D].")
    assert any("without saying it is undecided" in p for p in check_summary(doc, rows, 0.05))
    doc = SUMMARY_DOC.format(body="- Whether CORY trails PPO is undecided [D].")
    assert check_summary(doc, rows, 0.05) == []
    assert check_summary("# Other\ntext\n", rows, 0.05) == [
        "no section headed 'What the evidence supports' and no paragraph marked <!-- study -->"]


def test_the_check_command_exits_nonzero_on_a_broken_summary(tmp_path, capsys):
    run = folder(tmp_path / "run")
    path = plan_file(tmp_path, run)
    doc = tmp_path / "doc.md"
    doc.write_text(SUMMARY_DOC.format(body="- CORY trails PPO [D]."))
    with pytest.raises(SystemExit) as ok:
        main([str(path), "--check", str(doc)])
    assert ok.value.code == 0 and "every sentence" in capsys.readouterr().out
    doc.write_text(SUMMARY_DOC.format(body="- CORY trails PPO."))
    with pytest.raises(SystemExit) as bad:
        main([str(path), "--check", str(doc)])
    assert bad.value.code == 1 and "cites no row" in capsys.readouterr().out


def test_a_quoted_holm_p_must_be_the_tables(tmp_path):
    run = folder(tmp_path / "run")
    rows = evaluate(Plan.load(plan_file(tmp_path, run)))
    rows[0].p_holm = 0.0178  # D
    for quoted, ok in [("0.018", True), ("0.0178", True), ("0.02", True), ("0.052", False),
                       ("0.017", False), ("2e-2", True), ("1.8e-2", True), ("1", False),
                       ("3e-2", False)]:
        doc = SUMMARY_DOC.format(body=f"- CORY trails PPO (Holm p {quoted}) [D].")
        problems = check_summary(doc, rows, 0.05)
        assert (problems == []) is ok, (quoted, problems)
        assert ok or f"quotes Holm p {quoted}; the table has D's 0.0178" in problems[0]


def test_a_holm_p_in_a_sentence_citing_several_rows_must_be_one_of_theirs(tmp_path):
    run = folder(tmp_path / "run")
    rows = evaluate(Plan.load(plan_file(tmp_path, run)))
    rows[0].p_holm, rows[1].p_holm = 0.0178, 0.34  # D, E
    for quoted, ok in [("0.018 and 0.34", True), ("0.34", True), ("0.018 and 0.5", False),
                       ("0.05", False)]:
        doc = SUMMARY_DOC.format(body=f"- Both rows (Holm p {quoted}) [D, E].")
        problems = [p for p in check_summary(doc, rows, 0.05) if "quotes Holm p" in p]
        assert (problems == []) is ok, (quoted, problems)
        assert ok or "the table has D's 0.0178, E's 0.34" in problems[0]


def test_an_equivalence_row_shows_its_tests_interval_margin_and_seeds(tmp_path):
    """E (cory − cory-no-re, margin 0.1, 4 seeds): the level Holm asks of its p, with D decided
    first (3 p_D ≤ α), is α / 2 (Holm over three: max(3 p_D, 2 q) ≤ α); the interval consistent
    with TOST there is the (1 − 2 level) t interval, its deciding margin the larger end, and the
    seeds to decide it come from the t formula at the observed spread and estimate."""
    run = folder(tmp_path / "run")
    plan = Plan.load(plan_file(tmp_path, run))
    d_row, e_row, _ = evaluate(plan)
    diffs = np.array(GAINS["cory"]) - np.array(GAINS["cory-no-re"])
    assert 3 * d_row.p <= 0.05
    step = 0.05 / 2
    half = stats.t.ppf(1 - step, 3) * diffs.std(ddof=1) / 2
    assert e_row.step_alpha == pytest.approx(step)
    assert e_row.test_interval() == pytest.approx((diffs.mean() - half, diffs.mean() + half))
    assert e_row.deciding_margin() == pytest.approx(abs(diffs.mean()) + half)
    sd = diffs.std(ddof=1)
    assert e_row.seeds_to_decide() == seeds_needed(sd, e_row.hypothesis, diffs.mean(), step)
    text = render(plan, [d_row, e_row], "plan.toml")
    e_line = next(line for line in text.splitlines() if line.startswith("| E |"))
    assert f"±{math.ceil(e_row.deciding_margin() * 100) / 100:.2f}" in e_line
    assert "the methods differ in role exchange on vs off" in e_line
    assert "| quantity | a − b [95% CI] | test | test's interval | p | Holm p |" in text


def test_rows_per_optimizer_step_are_a_budget_a_contrast_is_flagged_on(tmp_path):
    """One policy trained on both roles' rows in PPO's steps averages twice the rows a step."""
    run = folder(tmp_path / "run", steps={"cory-no-re": 2})
    data = RunData.load(run)
    assert arm_budget(data, "reviews", "ppo")["rows per optimizer step"] == pytest.approx(1.0)
    assert arm_budget(data, "reviews", "cory-no-re")["rows per optimizer step"] == \
        pytest.approx(2.0)
    _, e_row, _ = evaluate(Plan.load(plan_file(tmp_path, run)))
    assert any(f.startswith("rows per optimizer step") for f in e_row.flags), e_row.flags


def test_the_frontier_column_is_the_paired_reward_gap_at_matched_kl(tmp_path):
    """Both arms at the same KL at every point, cory's reward 0.1 above ppo's everywhere: a − b
    at matched KL is +0.1 on every seed, so +0.1 with no spread."""
    run = folder(tmp_path / "run")
    lines = [json.loads(x) for x in (run / "alone.jsonl").read_text().splitlines()]
    ppo = {(e["seed"], e["iteration"]): e["task_reward"] for e in lines if e["method"] == "ppo"}
    for e in lines:
        e["kl"] = e["iteration"] / 6
        if e["method"] == "cory":
            e["task_reward"] = ppo[e["seed"], e["iteration"]] + 0.1
    (run / "alone.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    d_row, _, _ = evaluate(Plan.load(plan_file(tmp_path, run)))
    assert d_row.frontier.mean == pytest.approx(0.1) and d_row.frontier.n == 4
    assert d_row.frontier.high - d_row.frontier.low == pytest.approx(0.0, abs=1e-9)


def test_the_check_covers_marked_paragraphs_and_labels(tmp_path):
    """A paragraph marked <!-- study --> is held to the table like the summary: a sentence
    with no citation is refused unless it says it is descriptive or exploratory."""
    run = folder(tmp_path / "run")
    plan = Plan.load(plan_file(tmp_path, run))
    rows = evaluate(plan)
    doc = ("# A readme\n\nNot about the study.\n\n<!-- study -->\nCORY is worse [D]. It seems "
           "better elsewhere.\nThe mean gains were 0.7 and 0.3 (descriptive).\n<!-- /study -->\n")
    problems = check_summary(doc, rows, 0.05)
    assert len(problems) == 1 and "'It seems better elsewhere.'" in problems[0] \
        and "not labelled descriptive or exploratory" in problems[0]
    assert check_summary(doc.replace("It seems better elsewhere.",
                                     "It seems better elsewhere (exploratory)."), rows, 0.05) == []


def test_power_lines_name_their_pilot_and_how_it_spent_differently(tmp_path):
    """A pilot folder whose arm took other optimizer steps than the plan's is said so."""
    run = folder(tmp_path / "run")
    pilot = folder(tmp_path / "pilot", steps={"cory": 8})
    from benchmarks.evidence.plan import power_lines

    plan = Plan.load(plan_file(tmp_path, run, extra=f'pilot = "{pilot}"\nseeds = 4'))
    line = next(x for x in power_lines(plan) if x.startswith("L:"))
    assert f"pilot {pilot}" in line and "commit unrecorded" in line


@pytest.mark.parametrize("test, n, sd, margin, alpha", [
    ("difference", 12, 0.22, 0.25, 0.05), ("difference", 6, 0.08, 0.1, 0.05 / 42),
    ("superiority", 8, 0.2, 0.15, 0.05), ("equivalence", 10, 0.2, 0.25, 0.05)])
def test_the_power_at_the_planned_seeds_is_the_simulated_tests_rejection_rate(test, n, sd,
                                                                             margin, alpha):
    """power_at against 40,000 simulated paired studies of the same test (the truth at the
    margin for a difference or superiority, at 0 for equivalence)."""
    from benchmarks.evidence.plan import Arm, Hypothesis, power_at

    arm = Arm("x", "ppo")
    h = Hypothesis("H", "c", arm, arm, test=test, margin=margin, seeds=n)
    rng = np.random.default_rng(0)
    truth = 0.0 if test == "equivalence" else margin
    x = rng.normal(truth, sd, size=(40_000, n))
    t_of = lambda shift: (x.mean(1) - shift) / (x.std(1, ddof=1) / np.sqrt(n))  # noqa: E731
    if test == "difference":
        reject = np.abs(t_of(0.0)) > stats.t.ppf(1 - alpha / 2, n - 1)
    elif test == "superiority":
        reject = t_of(0.0) > stats.t.ppf(1 - alpha, n - 1)
    else:
        q = stats.t.ppf(1 - alpha, n - 1)
        reject = (t_of(-margin) > q) & (t_of(margin) < -q)
    assert power_at(sd, n, h, alpha) == pytest.approx(reject.mean(), abs=0.012)
