"""The house: every import in ``cocos/`` (at the top of a file or inside a function) goes to the same or an
earlier layer of the order stated in ``cocos/__init__.py``, so there are no cycles and no upward imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cocos

ROOT = Path(cocos.__file__).parent


def stated_layers() -> dict[str, int]:
    """Unit (first name below ``cocos``) -> layer number, read from the package docstring's numbered list."""
    layers = {}
    for number, line in re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\Z)", cocos.__doc__, flags=re.M | re.S):
        for unit in re.findall(r"``(\w+)``", line):
            layers.setdefault(unit, int(number))
    return layers


def imports() -> list[tuple[str, str, str]]:
    """``(file, importing unit, imported unit)`` for every import of a cocos module by another unit."""
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent)
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        unit = module.split(".")[1] if "." in module else None
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: module.count(".") + 1 - node.level + (path.name == "__init__.py")]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                elif node.module:
                    targets = [node.module]
            for target in targets:
                parts = target.split(".")
                if parts[0] == "cocos" and len(parts) > 1 and unit and parts[1] != unit:
                    found.append((str(rel), unit, parts[1]))
    return found


def test_every_unit_of_the_package_has_a_stated_layer():
    layers = stated_layers()
    units = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert units - set(layers) == set(), f"units without a layer in cocos/__init__.py: {units - set(layers)}"


def test_no_import_goes_to_a_later_layer():
    layers = stated_layers()
    upward = [f"{file}: {a} (layer {layers[a]}) imports {b} (layer {layers[b]})"
              for file, a, b in imports() if layers[b] > layers[a]]
    assert upward == []


def test_the_checker_sees_upward_imports(tmp_path, monkeypatch):
    """The test can fail: a planted upward import (data -> report) is reported."""
    planted = ROOT / "data" / "_planted_upward.py"
    planted.write_text("def f():\n    from cocos.report import tables  # noqa: F401\n")
    try:
        layers = stated_layers()
        assert any(a == "data" and b == "report" and layers[b] > layers[a] for _, a, b in imports())
    finally:
        planted.unlink()
