"""docs/design.md's module table names every module under handler/: a module added without a
line there fails here (a sub-package such as `tool_parsers/` may be named as a whole)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def module_table() -> str:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index("| module | concern |")
    end = text.find("\n\n", start)
    return text[start:end]


def test_every_handler_module_is_in_the_module_table():
    table = module_table()
    named = set(re.findall(r"`([^`]+)`", table))
    names = {part.strip() for entry in named for part in re.split(r"[ ,]", entry) if part.strip()}
    missing = []
    for path in sorted((REPO / "handler").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        relative = path.relative_to(REPO / "handler")
        folder = f"{relative.parent.name}/" if len(relative.parts) > 2 else None
        if path.name not in names and f"handler/{relative}" not in names and folder not in names:
            missing.append(str(relative))
    assert not missing, f"docs/design.md's module table does not name: {', '.join(missing)}"
