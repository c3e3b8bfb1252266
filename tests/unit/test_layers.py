"""The layers of handler/ (docs/design.md, "Layers"), checked on every import statement, those
inside functions included, so that a change cannot break a rule quietly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

HANDLER = Path(__file__).resolve().parents[2] / "handler"
ENGINE_DRIVERS = ("handler.engine.step_engine", "handler.engine.micro_batch", "handler.engine.scheduler")
# What the rooms under the backends (sampling/, and grammar/ under it) import none of.
NOT_UNDER_BACKENDS = (
    "handler.api",
    "handler.serving",
    "handler.config",
    "handler.engine",
    "handler.backends",
    "handler.replicas",
    "handler.neuron",
)
# (modules the rule is about, imports they must not make, why)
RULES = [
    (
        ("handler.engine",),
        ("handler.serving", "handler.api", "handler.config", "handler.replicas"),
        "the engine knows token ids only",
    ),
    (
        ("handler.replicas",),
        ("handler.serving", "handler.api"),
        "replicas run engines on backends and never see the wire or TorchServe",
    ),
    (
        ("handler.engine.sequence", "handler.engine.detokenizer", "handler.engine.stops"),
        ENGINE_DRIVERS,
        "a Sequence drives nothing",
    ),
    (
        ("handler.api",),
        ("handler.backends", "handler.serving", "handler.config", *ENGINE_DRIVERS),
        "wire formats never see the backend contract, TorchServe or the engine's drivers",
    ),
    (
        ("handler.backends",),
        ("handler.api", "handler.serving", "handler.engine", "handler.replicas"),
        "backends never see the wire, TorchServe or the engine",
    ),
    (
        ("handler.neuron",),
        ("handler.config", "handler.backends", "handler.serving"),
        "the SDK-free neuron/ takes plain values",
    ),
    (
        ("handler.sampling",),
        NOT_UNDER_BACKENDS,
        "the sampler knows logits, the domain types and grammars: backends call it, it calls no backend",
    ),
    (
        ("handler.grammar",),
        (*NOT_UNDER_BACKENDS, "handler.sampling"),
        "grammars know tokenizers and token ids: no wire, no backend, no config, no sampler",
    ),
    (("handler.request", "handler.errors", "handler.failpoints"), ("handler",), "the domain types stand alone"),
    (
        ("handler.core",),
        ("handler.serving", "handler.frontend", "handler.inf2_handler"),
        "the serving core both frontends share knows neither frontend",
    ),
    (
        ("handler.core",),
        ("ts", "starlette", "uvicorn"),
        "the serving core is frontend-free: no TorchServe, no Starlette or uvicorn",
    ),
    (
        ("handler.frontend",),
        ("handler.serving", "handler.inf2_handler"),
        "the ASGI frontend uses the wire formats, the engine and the core, never the TorchServe adapter",
    ),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(HANDLER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from handler import drain`
    return found


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


MODULES = {module_name(p): imports_of(p) for p in sorted(HANDLER.rglob("*.py"))}


@pytest.mark.parametrize(("subjects", "forbidden", "why"), RULES, ids=[r[2] for r in RULES])
def test_layer_rule(subjects: tuple[str, ...], forbidden: tuple[str, ...], why: str) -> None:
    broken = [
        f"{module} imports {name}"
        for module, names in MODULES.items()
        if within(module, subjects)
        for name in sorted(names)
        if within(name, forbidden)
    ]
    assert not broken, f"{why}: " + "; ".join(broken)


def test_only_the_adapter_imports_torchserve() -> None:
    allowed = ("handler.serving", "handler.inf2_handler")
    broken = [
        f"{module} imports {name}"
        for module, names in MODULES.items()
        if not within(module, allowed)
        for name in names
        if within(name, ("ts",))
    ]
    assert not broken, "`ts` only in serving/ and inf2_handler.py: " + "; ".join(broken)


def test_nothing_imports_the_asgi_frontend() -> None:
    broken = [
        f"{module} imports {name}"
        for module, names in MODULES.items()
        if not within(module, ("handler.frontend",))
        for name in sorted(names)
        if within(name, ("handler.frontend",))
    ]
    assert not broken, "the ASGI frontend is an entry point, not a library: " + "; ".join(broken)


def test_the_asgi_frontend_loads_no_torchserve() -> None:
    """At run time too: the modules it imports pull in no `ts` (a TorchServe import hidden a level down)."""
    code = (
        "import sys, handler.frontend.app, handler.frontend.__main__; "
        "print(sorted(m for m in sys.modules if m == 'ts' or m.startswith('ts.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=HANDLER.parent, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# Where a StepEngine is built: the engine client both frontends use, and a replica's child process.
ENGINE_BUILDERS = {"handler/core/engine_client.py", "handler/replicas/child.py"}


def constructs(path: Path, name: str) -> bool:
    """Whether the module calls `name(...)` (or `something.name(...)`) anywhere."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Name) and func.id == name) or (
                isinstance(func, ast.Attribute) and func.attr == name
            ):
                return True
    return False


def test_only_the_engine_client_and_a_replica_child_build_a_step_engine() -> None:
    builders = {
        str(path.relative_to(HANDLER.parent))
        for path in sorted(HANDLER.rglob("*.py"))
        if constructs(path, "StepEngine")
    }
    assert builders <= ENGINE_BUILDERS, (
        f"StepEngine( outside {sorted(ENGINE_BUILDERS)}: {sorted(builders - ENGINE_BUILDERS)}"
    )


def test_handler_holds_few_loose_modules() -> None:
    loose = sorted(p.name for p in HANDLER.glob("*.py"))
    assert loose == ["__init__.py", "config.py", "errors.py", "failpoints.py", "inf2_handler.py", "request.py"]


def test_the_rules_see_a_break(tmp_path: Path) -> None:
    """The scan itself: a forbidden import inside a function is found."""
    path = tmp_path / "layer-probe.py"
    path.write_text("def f():\n    from handler.serving.service import body_of\n    import ts.context\n")
    assert {"handler.serving.service", "ts.context"} <= imports_of(path)
    path.write_text("def f(b):\n    return step_engine.StepEngine(b, 8)\n")
    assert constructs(path, "StepEngine") and not constructs(path, "Engine")
