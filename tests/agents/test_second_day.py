"""What a new user hit following the README and docs literally (second pass): each fix here,
named by the mistake a user makes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cory_common import cli, plugins
from cory_common.pretrained import check_model

ROOT = Path(__file__).resolve().parents[2]


def test_make_install_says_to_activate_the_environment_and_the_readme_does_too():
    makefile = (ROOT / "Makefile").read_text()
    install = makefile[makefile.index("$(STAMP): pyproject.toml"):makefile.index("install:")]
    assert "source $(VENV)/bin/activate" in install
    assert "source .venv/bin/activate" in (ROOT / "README.md").read_text()


def test_a_bad_option_is_one_line_and_where_the_help_is(capsys):
    parser = cli.Parser("python -m tool")
    parser.add_argument("--n", type=int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--n", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m tool: error: argument --n: invalid int value: 'x'",
                   "(see python -m tool --help)"]  # no usage block


@pytest.mark.parametrize("argv, message", [
    (["--kl-penalty", "kll"], "--kl-penalty (KLConfig.penalty) must be one of"),
    (["--lr", "-1"], "--lr (PPOConfig.lr) must be > 0"),
    (["--model", "smollm2"], "did you mean 'smollm2-135m'?"),
])
def test_the_benchmark_names_the_flag_typed(argv, message, capsys, tmp_path):
    from benchmarks.run import main

    with pytest.raises(SystemExit):
        main([*argv, "--quick", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert message in err and "usage:" not in err
    assert not (tmp_path / "run").exists()


def test_a_model_typo_or_a_folder_that_is_not_a_model_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"model='gemma3' .* did you mean 'gemma3-270m'"):
        check_model("gemma3")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"is a folder but not a model: it has no config.json "
                                         r"and no weights .*it holds notes.txt"):
        check_model(str(tmp_path))
    check_model("gpt2")  # any other name is a hub name, read at load time


def test_a_syntax_error_in_a_learner_file_names_the_file_and_line(tmp_path):
    bad = tmp_path / "mine.py"
    bad.write_text("from agents.learners.registry import Learner\n\nclass X(Learner)\n    pass\n")
    with pytest.raises(ValueError, match=rf"--import '{bad}': .*\({bad}, line 3"):
        plugins.load_plugin(str(bad))


def test_a_learner_without_update_is_refused_when_it_registers(tmp_path):
    plugin = tmp_path / "noupdate.py"
    plugin.write_text("from agents.learners.registry import Learner, register_learner\n\n"
                      "@register_learner('no-update-yet')\nclass NoUpdate(Learner):\n"
                      "    pass\n")
    with pytest.raises(ValueError, match=r"learner 'no-update-yet' \(NoUpdate\) has no "
                                         r"update\(turns, iteration\).*line 3"):
        plugins.load_plugin(str(plugin))


def test_a_policy_of_a_missing_module_is_named_as_a_policy(capsys):
    from cory_env.demo import main

    with pytest.raises(SystemExit):
        main(["--tasks", "course", "--policy", "observer=nomod:f"])
    err = capsys.readouterr().err
    assert "policy 'nomod:f': module 'nomod'" in err and "--import" not in err


def test_the_server_refuses_a_port_in_use_before_announcing_itself():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "cory_env.openenv", "--port", str(port)],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "cannot listen there" in out.stderr
    assert "ws://" not in out.stdout  # no "ready" banner


def test_play_takes_the_thread_setting(monkeypatch, capsys):
    import torch

    from agents import play

    monkeypatch.setattr(play, "transcripts", lambda *a, **k: [])
    monkeypatch.setattr(play, "model_source", lambda path: None)
    monkeypatch.setattr(play, "resolve_model", lambda name: name)
    before = torch.get_num_threads()
    try:
        play.main(["--model", "gpt2", "--task", "course", "--episodes", "1", "--threads", "1"])
        assert torch.get_num_threads() == 1
        assert "[1 torch thread(s), wait " in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_threads_wait_passively_only_when_other_work_holds_a_core(monkeypatch):
    from cory_common import threads

    assert threads.wait_env(0.1) == {} and threads.wait_env(1.0) == {"OMP_WAIT_POLICY": "PASSIVE"}
    for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CORY_WAIT_CHOSEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(threads, "busy_cores", lambda seconds=0.1: 1.0)
    assert threads.wait_choice() == {"OMP_WAIT_POLICY": "PASSIVE", "CORY_WAIT_CHOSEN": "1"}
    # a parent's choice is kept by its children: chosen once, not re-sampled
    assert threads.wait_choice({"CORY_WAIT_CHOSEN": "1"}) == {"CORY_WAIT_CHOSEN": "1"}
    # the user's own setting wins
    assert threads.wait_choice({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    # torch is loaded in this process: a late choice says it reaches child processes only
    monkeypatch.setattr(threads, "_startup_env", lambda: {})
    monkeypatch.setattr(threads, "_LATE", [])
    before = __import__("torch").get_num_threads()
    try:
        said = threads.configure(1)
        assert said.startswith("1 torch thread(s), wait OpenMP's default (torch loaded first: "
                               "PASSIVE reaches child processes only)"), said
        assert __import__("os").environ["OMP_WAIT_POLICY"] == "PASSIVE"
    finally:
        __import__("torch").set_num_threads(before)


def test_play_demo_and_openenv_options_are_their_configs_fields():
    import argparse
    import dataclasses

    from agents.play import PlayConfig
    from cory_common import cli
    from cory_env.demo import DemoConfig

    configs = [PlayConfig, DemoConfig]
    try:
        from cory_env.openenv import ServeConfig
        configs.append(ServeConfig)
    except ModuleNotFoundError:  # the optional openenv extra
        pass
    for cls in configs:
        parser = argparse.ArgumentParser()
        cfg, _ = cli.parse_into(parser, cls, [])
        assert cfg == cls()  # no option given: the dataclass's defaults
        flags = {a.option_strings[0] for a in parser._actions if a.option_strings}
        fields = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(cls)}
        assert fields <= flags, cls
        assert all(a.help and "(default:" in a.help for a in parser._actions
                   if a.option_strings and a.option_strings[0] in fields)
    cfg, _ = cli.parse_into(argparse.ArgumentParser(), DemoConfig,
                            ["--tasks", "course", "--episodes", "3", "--policy", "observer=m:f",
                             "--policy", "pioneer=m:g"], special={"policy": {"action": "append"}})
    assert cfg == DemoConfig(tasks=["course"], episodes=3, policy=["observer=m:f", "pioneer=m:g"])
