"""Every environment variable the code reads is named in docs/configuration.md: the settings
table (tests/unit/test_configuration_doc.py checks its rows), the secrets' ``_FILE`` forms,
and the variables the tests and benchmarks read for themselves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tradecore_entrypoints.settings import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
CODE = ("src", "tests", "bench")
PASSED_THROUGH = {"PATH"}
"""Handed on to a child process unchanged, not configuration."""
_LUA_GETENV = re.compile(r"""os\.getenv\(\s*["']([A-Z][A-Z0-9_]*)["']""")


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's ``NAME = "TEXT"`` assignments."""
    found = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def read_in_python(source: str) -> set[str]:
    """Names read through ``os.environ.get``, ``os.environ[...]`` or ``os.getenv``, given as
    a string or a module constant."""
    tree = ast.parse(source)
    constants = _constants(tree)
    keys: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            getter = node.func
            if (getter.attr == "get" and _is_environ(getter.value)) or getter.attr == "getenv":
                keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            keys.append(node.slice)
    names = set()
    for key in keys:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
        elif isinstance(key, ast.Name) and key.id in constants:
            names.add(constants[key.id])
    return names


def read_by_the_code() -> set[str]:
    names: set[str] = set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            names |= read_in_python(path.read_text(encoding="utf-8"))
        for path in (ROOT / folder).rglob("*.lua"):
            names |= set(_LUA_GETENV.findall(path.read_text(encoding="utf-8")))
    return names - PASSED_THROUGH


def named_on_the_page() -> set[str]:
    return set(re.findall(r"`([A-Z][A-Z0-9_]*)`", PAGE.read_text(encoding="utf-8")))


def test_every_variable_the_code_reads_is_on_the_page() -> None:
    read = read_by_the_code() | {v.name for v in VARIABLES}

    assert read - named_on_the_page() == set()


def test_every_secret_file_form_is_on_the_page() -> None:
    file_forms = {f"{v.name}_FILE" for v in VARIABLES if v.secret}

    assert file_forms - named_on_the_page() == set()


def test_the_scan_finds_each_way_of_reading() -> None:
    """The check itself: a literal, a module constant, a subscript and getenv are all seen."""
    source = (
        "import os\n"
        'URL_ENV = "A_URL"\n'
        'os.environ.get("A_FLAG")\n'
        "os.environ.get(URL_ENV, 'x')\n"
        'os.environ["A_KEY"]\n'
        'os.getenv("A_NAME")\n'
        'os.environ.get("PATH")\n'
    )

    assert read_in_python(source) == {"A_FLAG", "A_URL", "A_KEY", "A_NAME", "PATH"}
    assert "PATH" not in read_by_the_code()
