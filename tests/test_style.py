"""The lesson's shape rules that hold today, kept from here on (DEVELOPERS.md, issue 51): lines of
at most 100 characters, functions of at most 6 parameters (self aside) and 80 lines in the lesson
files, configurator.py within 120 lines, the README within 200 and its class table within 6 rows
of at most 30 words a cell."""
import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSON = ["model.py", "train.py", "sample.py", "prepare.py", "data.py", "configurator.py"]


def lines(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.mark.parametrize("path", LESSON + ["compare.py", "bench.py", "test_model.py"]
                         + sorted(os.path.relpath(p, ROOT) for p in glob.glob(
                             os.path.join(ROOT, "lab", "*.py"))))
def test_no_line_is_over_100_characters(path):
    long = [i for i, line in enumerate(lines(path), 1) if len(line) > 100]
    assert not long, f"{path}: lines over 100 characters: {long}"


@pytest.mark.parametrize("path", LESSON)
def test_lesson_functions_take_at_most_6_parameters_and_80_lines(path):
    tree = ast.parse("\n".join(lines(path)))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            count = len([n for n in names if n not in ("self", "cls")])
            length = node.end_lineno - node.lineno + 1
            assert count <= 6, f"{path}:{node.lineno} {node.name} takes {count} parameters"
            assert length <= 80, f"{path}:{node.lineno} {node.name} is {length} lines"


def test_the_configurator_and_the_readme_stay_within_their_budgets():
    assert len(lines("configurator.py")) <= 120
    assert len(lines("README.md")) <= 200


def test_the_class_table_has_at_most_6_rows_of_cells_within_30_words():
    text = lines("README.md")
    start = text.index("## What a class will see")
    table = []
    for line in text[start:]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    rows = [[c.strip() for c in r.strip().strip("|").split("|")] for r in table[2:]]
    assert 3 <= len(rows) <= 6, f"the class table has {len(rows)} rows"
    wordy = [(r[0], len(c.split())) for r in rows for c in r if len(c.split()) > 30]
    assert not wordy, f"cells over 30 words: {wordy}"
