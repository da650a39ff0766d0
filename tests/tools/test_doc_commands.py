"""tools/doc_commands.py: the docs' commands are read as written and a wrong one is caught."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import doc_commands as dc  # noqa: E402  (a script, not a package)


def test_commands_are_read_with_continuations_joined_and_comments_cut():
    text = ("intro\n```bash\n# a comment line\npython -m benchmarks.run --quick   # smoke\n"
            "python -m benchmarks.run --preset real \\\n    --out runs/x\n```\n"
            "```python\nprint('not shell')\n```\n")
    assert dc.commands(text) == ["python -m benchmarks.run --quick",
                                 "python -m benchmarks.run --preset real --out runs/x"]
    assert dc.how("python -m benchmarks.run --preset real --out runs/x") == "plan"
    assert dc.how("python -m benchmarks.run --out runs/nothing-here --resume") == "help"
    assert dc.how("OMP_NUM_THREADS=1 torchrun --standalone -m agents.distributed --cpu") == \
        "help"
    assert dc.how("make demo") == "make" and dc.how("pip install x") == "skip"
    assert dc.how("python -m benchmarks.run --model /no/such/model --tasks imdb") == "help"


def test_a_wrong_option_or_value_is_caught_and_a_right_one_passes():
    assert dc.check("python -m benchmarks.run --lr 2e-4 --quick") is None
    assert "--lr" in dc.check("python -m benchmarks.run --lr -1")
    assert "--no-such-flag" in dc.check("python -m benchmarks.report runs/X --no-such-flag")
    assert dc.check("python -m benchmarks.report runs/X") is None
    assert "make -n" in dc.check("make no-such-target")
    quoted = 'python tools/perf/study_workers.py --study "--preset real-demo" --compare "--a|--b"'
    assert dc.check(quoted) is None  # a quoted value that starts with -- is not an option
    assert "--no-such" in dc.check(quoted + " --no-such")


def test_every_documented_command_is_read():
    seen = [c for doc in dc.DOCS for c in dc.commands((ROOT / doc).read_text())]
    assert "make test" in seen and "make demo" in seen
    assert any(c.startswith("python -m benchmarks.run --preset real") for c in seen)
