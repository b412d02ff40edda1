"""The shape the project keeps: the lesson within nanoGPT's weight (its code tokens, string
characters and long lines as ../shared/tools/lesson_weight.py counts them, line budgets, short
functions of few parameters, train.py's loop flat at the top of train()), lines within 100
characters, a README whose first screen gives the commands, no import cycle, and the demo preset
equal to the comparison preset in every setting they share."""
import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

from configurator import read_preset

ROOT = Path(__file__).resolve().parent.parent
LESSON = ["model.py", "train.py", "sample.py", "prepare.py", "data.py", "configurator.py"]
BUDGETS = {"model.py": 350, "train.py": 380}
# Code tokens (Python's own: names, operators, numbers; no comments, strings or layout), a file's
# and the lesson's; nanoGPT's counterparts hold 5,026.
TOKENS = {"train.py": 2200, "data.py": 1500, "configurator.py": 600, "lesson": 8700}


def tracked(pattern):
    out = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True)
    return [ROOT / p for p in out.stdout.split()] or sorted(ROOT.glob(pattern))


def lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def is_test(path):
    rel = path.relative_to(ROOT).as_posix()
    return rel.startswith("tests/") or path.name.startswith("test_") or path.name == "conftest.py"


@pytest.mark.parametrize("path", [p for p in tracked("*.py") if not p.relative_to(
    ROOT).as_posix().startswith("config/")], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_line_is_over_100_characters(path):
    long = [i + 1 for i, line in enumerate(lines(path)) if len(line) > 100]
    assert not long, f"{path.name}: lines {long} are over 100 characters"


def test_the_lesson_is_within_its_budgets():
    counts = {name: len(lines(ROOT / name)) for name in LESSON}
    assert sum(counts.values()) <= 1450, counts
    for name, most in BUDGETS.items():
        assert counts[name] <= most, f"{name}: {counts[name]} lines, at most {most}"
    code = [p for p in tracked("*.py") if not is_test(p)
            and not p.relative_to(ROOT).as_posix().startswith("config/")]
    non_test = sum(len(lines(p)) for p in code)
    tests = sum(len(lines(p)) for p in tracked("*.py") if is_test(p))
    assert non_test <= 4600, f"non-test code: {non_test} lines, at most 4,600"
    assert tests <= non_test, f"tests: {tests} lines, more than the {non_test} of the code"


def weigh(path):
    """(code tokens, string characters, non-blank lines, of them over 85 characters), counted
    as lesson_weight.py counts: the parts of an f-string (Python 3.12 splits it) are strings."""
    code = strings = in_fstring = 0
    start, end = (getattr(tokenize, f"FSTRING_{n}", "none") for n in ("START", "END"))
    parts = {start, end, getattr(tokenize, "FSTRING_MIDDLE", "none"), tokenize.STRING}
    layout = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
              tokenize.ENDMARKER, tokenize.COMMENT}
    text = path.read_text(encoding="utf-8")
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        in_fstring += (t.type == start) - (t.type == end)  # code inside an f-string is its text
        if t.type in parts:
            strings += len(t.string)
        elif t.type not in layout and not in_fstring:
            code += 1
    non_blank = [line for line in text.splitlines() if line.strip()]
    return code, strings, len(non_blank), sum(len(line) > 85 for line in non_blank)


def test_the_lesson_reads_at_its_weight():
    """Code tokens within TOKENS, string characters (messages, help, docstrings) within 16,000,
    and in each file at most 15% of the lines over 85 characters (nanoGPT's: 11%)."""
    weights = {name: weigh(ROOT / name) for name in LESSON}
    for name, (code, _, non_blank, long) in weights.items():
        assert code <= TOKENS.get(name, code), f"{name}: {code} code tokens"
        assert long <= 0.15 * non_blank, f"{name}: {long} of {non_blank} lines over 85"
    assert sum(w[0] for w in weights.values()) <= TOKENS["lesson"]
    assert sum(w[1] for w in weights.values()) <= 16000


@pytest.mark.parametrize("name", LESSON)
def test_lesson_functions_are_short_and_take_few_parameters(name):
    """At most 70 lines and 6 parameters (self aside) a function: a reader holds each in view."""
    for node in ast.walk(ast.parse((ROOT / name).read_text())):
        if isinstance(node, ast.FunctionDef):
            length = node.end_lineno - node.lineno + 1
            params = [a.arg for a in node.args.args + node.args.kwonlyargs if a.arg != "self"]
            assert length <= 70, f"{name}: {node.name} is {length} lines"
            assert len(params) <= 6, f"{name}: {node.name} takes {len(params)} parameters"


def test_the_training_loop_is_flat_at_the_top_of_train():
    train = next(n for n in ast.parse((ROOT / "train.py").read_text()).body
                 if isinstance(n, ast.FunctionDef) and n.name == "train")
    assert any(isinstance(n, ast.While) for n in train.body), "the loop is not train()'s own"


def test_the_readmes_first_screen_gives_the_commands_and_the_rest_fits():
    readme = lines(ROOT / "README.md")
    assert len(readme) <= 180, f"README.md: {len(readme)} lines, at most 180"
    first = "\n".join(readme[:40])
    cpu = first.find("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    main = first.find("pip install -r requirements.txt && python prepare.py && python train.py")
    tests = first.find("python -m pytest -q")
    assert 0 <= cpu < main and tests >= 0, "the first screen lacks a command, or its order"
    ci = (ROOT / ".ci" / "run").read_text()
    command = "pip install -r requirements.txt -r tests/requirements.txt && python -m pytest -q"
    assert command in ci and command in " ".join(first.split()), "CI runs another test command"
    start = readme.index("## What a class will see")
    end = next(i for i in range(start + 1, len(readme)) if readme[i].startswith("## "))
    table = [line for line in readme[start:end] if line.startswith("| ")]
    assert len(table) - 1 <= 5, "the class table holds more than 5 rows"


def test_the_readmes_prose_is_words_more_than_numbers():
    """At most 7 numbers per 100 words of prose (tables and code blocks aside); nanoGPT's 5."""
    prose, code = [], False
    for line in lines(ROOT / "README.md"):
        code = code != line.startswith("```")
        if not (code or line.startswith(("```", "|", "#"))):
            prose.append(line)
    text = " ".join(prose)
    words = len(re.findall(r"[A-Za-z0-9][\w'.,/%-]*", text))
    numbers = len(re.findall(r"(?<![\w.])[-+]?\d[\d,.]*\d?%?", text))
    assert 100 * numbers / words <= 7, f"{numbers} numbers in {words} words"


def test_no_module_imports_one_that_imports_it():
    """Module-level imports among the project's own modules form no cycle (bench.py and
    lab/gpu_check.py used to import each other)."""
    names = {p.relative_to(ROOT).with_suffix("").as_posix().replace("/", "."): p
             for p in tracked("*.py") if not is_test(p) and "config/" not in p.as_posix()}
    graph = {}
    for name, path in names.items():
        found = set()
        for node in ast.parse(path.read_text()).body:  # the module's top level only
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ("lab." if node.level else "") + (node.module or "")
                found |= {base.strip(".")} | {f"{base}.{a.name}".strip(".") for a in node.names}
        graph[name] = found & set(names)

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n)))
                   for n in graph[start])
    cycles = [name for name in graph if reaches(name, name)]
    assert not cycles, f"import cycles through {cycles}"


def test_the_demo_is_the_comparison_preset_on_one_seed():
    demo, default = (read_preset(ROOT / "config" / f"{n}.py") for n in ("demo", "compare"))
    assert {k: demo[k] for k in default} == default, "config/demo.py differs from compare.py"
    assert demo["seeds"] == "1337" and demo["calibration"]
