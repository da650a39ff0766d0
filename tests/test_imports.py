"""Importing a package of the project changes nothing in the process: no sleep, no environment
variable, no thread setting. The process's threads are chosen at its entry point
(`cory_common.threads.configure`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cory_common", "cory_env", "agents", "benchmarks")

PROBE = textwrap.dedent("""
    import json, os, sys, time
    preload = sys.argv[2] == "torch-first"
    if preload:
        import torch
        set_threads = []
        torch.set_num_threads = lambda n: set_threads.append(n)
        threads = torch.get_num_threads()
    SKIP = ("agents.distributed.", "agents.interop.")
    slept = []
    time.sleep = lambda s: slept.append(s)
    before = dict(os.environ)
    __import__(sys.argv[1])
    import importlib, pkgutil
    package = sys.modules[sys.argv[1]]
    for m in pkgutil.walk_packages(package.__path__, sys.argv[1] + "."):
        # interop modules import their library (Tianshou imports Ray, which sets RAY_CLIENT_MODE)
        if not m.name.endswith("__main__") and not m.name.startswith(SKIP):
            importlib.import_module(m.name)
    after = dict(os.environ)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    out = {"changed": changed, "slept": slept}
    if preload:
        out["set_threads"] = set_threads
        out["threads_same"] = torch.get_num_threads() == threads
    print(json.dumps(out))
""")


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("order", ["package-first", "torch-first"])
def test_importing_a_package_and_its_modules_changes_nothing(package, order):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CORY_WAIT_CHOSEN")}
    out = subprocess.run([sys.executable, "-c", PROBE, package, order], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["changed"] == [], seen
    assert seen["slept"] == [], seen
    if order == "torch-first":
        assert seen["set_threads"] == [] and seen["threads_same"], seen


def test_configure_chooses_once_at_the_entry_point_and_children_keep_it(tmp_path):
    """A `python -m` command chooses the policy before its work: on a machine whose other work
    holds a core it waits passively, and the choice is marked for its children."""
    code = textwrap.dedent("""
        import os, sys
        from cory_common import threads
        threads.busy_cores = lambda seconds=0.1: 2.0
        said = threads.configure(1)
        import torch
        print(said, "|", os.environ.get("OMP_WAIT_POLICY"), os.environ.get("CORY_WAIT_CHOSEN"),
              torch.get_num_threads())
    """)
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CORY_WAIT_CHOSEN")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "1 torch thread(s), wait PASSIVE | PASSIVE 1 1"


def test_another_package_named_agents_first_on_the_path_is_named_in_one_line(tmp_path):
    """openai-agents also imports as `agents`: with such a package first on the path, run from
    outside the repository, the user is told in one line which two packages clash and what to
    do; `python -m cory_common` names them too. From the repository root nothing is said."""
    stand_in = tmp_path / "site" / "agents"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    for cmd in (["-c", "import cory_env"], ["-m", "cory_common"]):
        out = subprocess.run([sys.executable, *cmd], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        said = [line for line in (out.stdout + out.stderr).splitlines() if "`agents`" in line]
        assert len(said) == 1, out.stdout + out.stderr
        assert str(stand_in) in said[0] and str(ROOT / "agents") in said[0], said
        assert "virtual environment" in said[0]
    quiet = subprocess.run([sys.executable, "-c", "import cory_env, agents, benchmarks"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "PackageClash" not in quiet.stderr, quiet.stderr
