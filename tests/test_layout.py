"""The project's shape, checked: layers inside eagle2/ that point one way (model, then the cycle's
building blocks, then the policies, then the decoders that drive them, then the tools), no import
cycle, the top-level packages pointing one way (ui over viz and eagle2, eagle2_train over eagle2,
the engine importing none of them nor a page library), the trace reader and viz free of torch,
one registry that is the only place naming a policy (and "plain"), one module reading device
strings, and the tracked tree under 40 MB."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "eagle2"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Modules a file imports (module level and inside functions), relative imports resolved."""
    mod = module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names}  # `from . import verify` names a module
    return out


def engine_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ENGINE.rglob("*.py")}
    graph = {}
    for m, p in files.items():
        deps = set()
        for imp in imports_of(p):
            while imp and imp not in files:  # `pkg.mod.name` -> `pkg.mod`
                imp = imp.rpartition(".")[0]
            if imp and imp != m and not files[imp].name == "__init__.py":
                deps.add(imp)
        graph[m] = deps
    return graph


def test_no_import_cycle_in_the_engine():
    graph = engine_graph()
    assert len(graph) > 20
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(d):] + [m, d]))
            if d not in state:
                visit(d, stack + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


# eagle2's packages, lowest first: a module may import its own layer and those below, never above
LAYERS = (("config", "errors", "devices", "files", "heap", "logs", "machine", "phases", "threads"), ("model",), ("cycle",), ("policies",), ("decoding",), ("tools",))


def layer_of(module: str) -> int:
    part = module.split(".")[1]
    return next(i for i, names in enumerate(LAYERS) if part in names)


def test_layers_point_one_way():
    graph = engine_graph()
    checked = 0
    for m, deps in graph.items():
        if m in ("eagle2", "eagle2.__main__") or m.count(".") < 1:
            continue  # the package's lazy facade and the entry point sit above every layer
        for d in deps:
            if d.count(".") >= 1 and d not in ("eagle2", "eagle2.__main__"):
                checked += 1
                assert layer_of(d) <= layer_of(m), f"{m} (layer {LAYERS[layer_of(m)]}) imports {d} from above"
    assert checked > 40


def test_the_registry_imports_its_policies():
    """No "module:Class" strings: the registry's imports name every module that defines a policy
    (a module of a policy's parts, such as its acceptance rule, is imported by that policy)."""
    reg = ENGINE / "policies" / "registry.py"
    mods = {p.stem for p in (ENGINE / "policies").glob("*.py")
            if any(isinstance(n, ast.ClassDef) and n.name.endswith("Policy") for n in ast.parse(p.read_text()).body)}
    mods -= {"base"}
    assert {"eagle2", "lantern", "ddd"} <= mods
    assert {f"eagle2.policies.{m}" for m in mods} <= imports_of(reg)
    assert "importlib" not in imports_of(reg)


# The top-level packages, and which of the others each may import: the page draws with the figures
# and drives the engine, the training package drives the engine, the figures read the engine's
# torch-free trace types only (test_viz_imports_no_engine_code_but_the_trace_types), and the engine
# imports none of them (its CLI included: training has its own entry point, python -m eagle2_train).
MAY_IMPORT = {"eagle2": set(), "viz": {"eagle2"}, "ui": {"eagle2", "viz"}, "eagle2_train": {"eagle2"}}


def test_packages_point_one_way():
    """No import runs back up between eagle2/, eagle2_train/, ui/ and viz/ (nor into app.py)."""
    ours = set(MAY_IMPORT) | {"app"}
    checked = 0
    for pkg, allowed in MAY_IMPORT.items():
        for p in (ROOT / pkg).rglob("*.py"):
            tops = {i.split(".")[0] for i in imports_of(p)} & ours
            checked += len(tops)
            bad = tops - allowed - {pkg}
            assert not bad, f"{p.relative_to(ROOT)} imports {bad}, above {pkg}"
    assert checked > 50
    assert not {i for i in imports_of(ROOT / "app.py") if i.split(".")[0] == "eagle2_train"}


def _string_uses(paths, value):
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and node.value == value:
                yield p, node.lineno


def runtime_files():
    return [p for d in ("eagle2", "ui") for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]


def test_plain_is_named_in_one_place():
    where = {(p.relative_to(ROOT).as_posix(), n) for p, n in _string_uses(runtime_files(), "plain")}
    # profile.py's "plain" is a matmul without prepacked weights (a key of its output), not the decoder
    assert {f for f, _ in where} <= {"eagle2/policies/registry.py", "eagle2/tools/profile.py"}, where


def test_device_strings_are_read_in_one_place():
    """Whether a device is CUDA is decided by eagle2/devices.py only (no startswith("cuda") or
    comparisons with "cuda" elsewhere)."""
    for p in runtime_files():
        if p == ENGINE / "devices.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            consts = []
            if isinstance(node, ast.Compare):
                consts = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("startswith", "endswith"):
                consts = node.args
            if any(isinstance(c, ast.Constant) and c.value == "cuda" for c in consts):
                pytest.fail(f"{p.relative_to(ROOT)}:{node.lineno} reads a device string; use eagle2.devices")


def test_engine_imports_no_page_library():
    for p in ENGINE.rglob("*.py"):
        bad = {i for i in imports_of(p) if i.split(".")[0] in ("gradio", "plotly")}
        assert not bad, f"{p.relative_to(ROOT)} imports {bad}"


def test_viz_imports_no_engine_code_but_the_trace_types():
    # verify_times: t(N), which traces record and the what-ifs price with (torch-free, numpy only);
    # series: a decoder's progress as traces record it; phases: a cycle's phases, named once
    allowed = {"eagle2", "eagle2.errors", "eagle2.cycle", "eagle2.cycle.trace", "eagle2.cycle.tree",
               "eagle2.cycle.series", "eagle2.phases", "eagle2.model.verify_times"}
    for p in (ROOT / "viz").rglob("*.py"):
        bad = {i for i in imports_of(p) if i.split(".")[0] in ("eagle2", "torch", "ui", "app")
               and i.rpartition(".")[0] not in allowed and i not in allowed}
        assert not bad, f"{p.relative_to(ROOT)} imports {bad}"


def test_trace_reader_and_viz_import_without_torch():
    code = ("import sys; import eagle2.cycle.trace, viz, viz.report; "
            "bad = [m for m in ('torch', 'transformers', 'gradio') if m in sys.modules]; "
            "print(bad); raise SystemExit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_only_the_registry_names_policies():
    """Outside eagle2/policies/ (and tests), no module spells a policy's name as a string."""
    from eagle2.policies.registry import names
    pols = set(names()) - {"eagle2"}  # "eagle2" is also the package's name; checked below
    files = [p for d in ("eagle2", "viz", "ui") if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.py")
             if "policies" not in p.parts] + [ROOT / "app.py"]
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in pols:
                pytest.fail(f"{p.relative_to(ROOT)}:{node.lineno} names the policy {node.value!r}")
    dec = imports_of(ENGINE / "decoding" / "decoder.py")
    assert not {i for i in dec if i.startswith("eagle2.policies.") and
                i.split(".")[2] not in ("base", "registry")}, "the decoder imports a specific policy"


def test_every_registered_policy_implements_the_interface():
    from eagle2.policies.base import TreePolicy
    from eagle2.policies.registry import make_policy, names, policy_class
    flags = set()
    for n in names():
        cls = policy_class(n)
        assert issubclass(cls, TreePolicy) and cls.name == n
        assert cls.draft is not TreePolicy.draft, f"{n} does not draft"
        p = make_policy(n)
        assert p.total_tokens >= 1 and isinstance(p.params(), dict) and isinstance(p.summary_stats(), dict)
        assert isinstance(p.lossy, bool)
        for o in cls.options:
            assert o.flag not in flags, f"flag {o.flag} defined twice"
            flags.add(o.flag)


TRACKED_LIMIT = 40_000_000   # bytes: generated pages are drawn on demand, large logs kept compressed


def test_the_tracked_tree_stays_small():
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    sizes = {f: os.lstat(ROOT / f).st_size for f in listed.decode().split("\0") if f and os.path.lexists(ROOT / f)}
    biggest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert sum(sizes.values()) < TRACKED_LIMIT, [(f, sizes[f]) for f in biggest]
