"""The tree is the architecture: layers import one way, no module imports itself back."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cory_common", "cory_env", "agents", "benchmarks")
LAYER = {"cory_common": 0, "cory_env": 1, "agents": 2, "benchmarks": 3}


def modules() -> dict[str, Path]:
    """Every module of the four packages, by dotted name."""
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules a module imports, anywhere in it (functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def is_package_init(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").exists()


def test_layers_import_one_way():
    bad = [(a, b) for a, targets in graph().items() for b in targets
           if LAYER[b.split(".")[0]] > LAYER[a.split(".")[0]]]
    assert not bad, bad


def test_the_common_package_is_below_the_env_and_imports_no_layer():
    """What every layer uses (checks, files, plug-ins, model files) lives below cory_env,
    and the env package holds the env."""
    g = graph()
    common = [a for a in g if a.startswith("cory_common")]
    assert {"cory_common.checks", "cory_common.files", "cory_common.plugins",
            "cory_common.pretrained"} <= set(common)
    assert not [(a, b) for a in common for b in g[a] if not b.startswith("cory_common")]
    users = {a.split(".")[0] for a, targets in g.items()
             if any(b.startswith("cory_common") for b in targets)}
    assert users >= {"cory_env", "agents", "benchmarks"}


def test_no_import_circles_between_modules():
    """A package's __init__ re-exporting its own modules is not a circle; anything else is."""
    g = {a: {b for b in targets if not (is_package_init(b) and a.startswith(b + "."))}
         for a, targets in graph().items()}
    assert cycles(g) == []


def test_every_agents_room_says_its_job_in_one_line():
    import agents

    rooms = [m.name for m in pkgutil.iter_modules(agents.__path__) if m.ispkg]
    assert {"llm", "learners", "training", "distributed", "refmodels", "interop"} <= set(rooms)
    for room in rooms:
        doc = importlib.import_module(f"agents.{room}").__doc__ or ""
        assert doc.strip() and len(doc.strip().splitlines()[0]) <= 100, room


# Inside agents, rooms import downward: llm < learners < training < the rooms built on training.
# The reference LMs are built below training; whether a model has CORY's mechanism is a study,
# measured in benchmarks (benchmarks.mechanism.measure), so no room of agents imports a higher one.
ROOMS = {"llm": 0, "learners": 1, "refmodels": 1, "training": 2, "distributed": 3,
         "interop": 3, "play": 3}


def room(module: str) -> int | None:
    parts = module.split(".")[1:]
    for k in (2, 1):
        key = ".".join(parts[:k])
        if len(parts) >= k and key in ROOMS:
            return ROOMS[key]
    return None


def test_agents_rooms_import_downward():
    bad = [(a, b) for a, targets in graph().items() if a.startswith("agents.")
           for b in targets if b.startswith("agents.") and room(a) is not None
           and room(b) is not None and room(b) > room(a)]
    assert not bad, bad


# benchmarks' rooms import downward too: what a study is asked to run, the evidence the records
# hold, the mechanism measured and the report read from them, the study that makes them, and
# the commands at the top.
BENCH_ROOMS = {"settings": 0, "evidence": 1, "mechanism": 2, "report": 2, "study": 3}
COMMAND = 4


def bench_room(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return COMMAND + 1  # the package's own __init__: the public API, above everything
    return BENCH_ROOMS.get(parts[1], COMMAND)


def test_benchmarks_rooms_import_downward_and_the_top_holds_only_commands():
    g = graph()
    bad = [(a, b) for a, targets in g.items() if a.startswith("benchmarks.")
           for b in targets if b.startswith("benchmarks") and bench_room(b) > bench_room(a)]
    assert not bad, bad
    top = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__"}
    assert top == {"run", "why", "compare", "merge", "migrate", "calibrate", "cluster",
                   "allocate", "leaderboard"}, top
    rooms = {p.name for p in (ROOT / "benchmarks").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(BENCH_ROOMS), rooms
    for room_ in rooms:  # each room says what it holds
        doc = importlib.import_module(f"benchmarks.{room_}").__doc__ or ""
        assert doc.strip() and len(doc.strip().splitlines()[0]) <= 100, room_
    for name, targets in g.items():  # the commands are leaves: no room imports one
        assert not [t for t in targets if t.startswith("benchmarks.")
                    and bench_room(t) == COMMAND and name != t
                    and bench_room(name) < COMMAND], name


def test_the_run_log_lives_with_its_users_below_both():
    """The run log (ledger, lock, code identity) serves agents.distributed and the benchmark
    alike, so it lives in cory_common, not in a room of training that does not use it."""
    mods = modules()
    assert "cory_common.runlog" in mods and "agents.training.runlog" not in mods


SOURCE = ("cory_common", "cory_env", "agents", "benchmarks", "examples", "tools")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 60


def source_files() -> list[Path]:
    return sorted(p for package in SOURCE for p in (ROOT / package).rglob("*.py"))


def test_no_source_file_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in source_files()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"split these files (lines): {long}"


def test_no_function_of_the_packages_is_over_60_lines():
    long = {}
    for path in source_files():
        if path.relative_to(ROOT).parts[0] == "tools":  # measuring scripts, read top to bottom
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert not long, f"split these functions (lines): {long}"


def test_no_package_rewrites_imports():
    """Old module paths are not kept alive by import hooks: one name per module."""
    for path in source_files():
        text = path.read_text()
        assert "sys.meta_path" not in text and "MetaPathFinder" not in text, path


def test_registries_are_filled_by_discovery_not_by_hand_kept_lists():
    """Every module of the task and learner packages is found by walking the package: their
    __init__ names none of them, and a module added there registers without an edit elsewhere."""
    for package in ("cory_env/tasks", "agents/learners"):
        init = ast.parse((ROOT / package / "__init__.py").read_text())
        named = {a.name for node in ast.walk(init) if isinstance(node, ast.ImportFrom)
                 and node.level == 1 and not node.module for a in node.names}
        named |= {node.module for node in ast.walk(init) if isinstance(node, ast.ImportFrom)
                  and node.level == 1 and node.module and node.module != "base"}
        assert not named, (package, named)
    for path in sorted((ROOT / "agents/learners").glob("*.py")):  # each module its own names
        loops = [node for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.For) and any(
                     isinstance(n, ast.Call) and getattr(n.func, "id", "").startswith("register")
                     for n in ast.walk(node))]
        assert not loops, f"{path.name}: registers names in a loop over a hand-kept list"
    import cory_env
    from agents.learners.registry import registered_methods

    assert {"sentiment", "arithmetic", "course", "reviews", "reasoning"} <= set(
        cory_env.registered_tasks())
    assert {"ppo", "cory", "cory-mappo", "grpo", "rloo"} <= set(registered_methods())


def test_a_project_import_inside_a_function_says_why_it_is_deferred():
    """The project's own modules are imported at the top of a module; the few imported inside a
    function (a heavy import put off, a module run as __main__) say so on the line."""
    unsaid = []
    for path in modules().values():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    ours = node.level > 0 or (node.module or "").split(".")[0] in LAYER
                elif isinstance(node, ast.Import):
                    ours = any(a.name.split(".")[0] in LAYER for a in node.names)
                else:
                    continue
                if ours and "deferred" not in lines[node.lineno - 1]:
                    unsaid.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unsaid, unsaid


def test_the_mechanism_and_its_intervals_are_studies_in_benchmarks():
    """agents/ trains and plays; measuring a model's mechanism and the intervals it is read
    with are the benchmark's (one home each, nothing re-exported)."""
    mods = modules()
    assert "benchmarks.mechanism.measure" in mods and "benchmarks.evidence.intervals" in mods
    assert not [m for m in mods if m.startswith("agents.") and m.rpartition(".")[2] in (
        "transfer", "intervals")]
    stats = ast.parse((ROOT / "benchmarks/evidence/stats.py").read_text())
    exported = next(n for n in stats.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "__all__")
    assert not {"Interval", "mean_interval", "t_quantile"} & {
        e.value for e in exported.value.elts}


def test_views_share_their_pieces_through_modules_below_them():
    """The token view (aec), the text view and the batched env share the chain's pieces
    (cory_env.chain); the OpenEnv service seats its players from cory_env.seats, not from the
    demo's command line; and nothing in agents imports a view of the env."""
    g = graph()
    views = {"cory_env.aec", "cory_env.text", "cory_env.demo", "cory_env.openenv"}
    assert "cory_env.chain" in g["cory_env.batched"] and "cory_env.aec" not in g["cory_env.batched"]
    assert "cory_env.demo" not in g["cory_env.openenv"]
    assert not [(a, b) for a, targets in g.items() if a.startswith("agents.")
                for b in targets if b in views]
