#!/usr/bin/env python3
"""Coding-agent sandbox workloads: a template interpreter holding a source tree, sandboxes that
parse, search, edit, query and test it.

    codingsandbox.py --role template --style fork --n 8 --cgroup-root CGDIR --status DIR
    codingsandbox.py --role template --style fresh --status DIR
    codingsandbox.py --role sandbox --index 3 --status DIR

The process roles, options and readiness protocol are mlsandbox.py's (its main()). The template
state (built from --seed and --size, identical in every process that builds it):
  - a checkout: the Python standard library's sources (sorted, tests left out) read into str
    up to the size's budget, and the same files as line lists (how an agent edits them);
  - a symbol index (every def/class name -> file and line) and the ASTs of the first files;
  - an sqlite3 database of the files and symbols (in memory);
  - a conversation history of tool calls and results (JSON-shaped dicts);
  - a warmed interpreter (mlsandbox.warm_interpreter: stdlib modules imported and exercised).

Sandbox tasks (round robin over TASKS, each from its own seed), each appending its tool calls
and results to the history, as an agent's context grows:
  parse   ast.parse of files, signatures, docstrings and call edges collected
  search  regular-expression searches for symbols over the whole checkout, with context lines
  edit    renames and inserted lines in a set of files (the sandbox's working copy) and their
          unified diffs
  query   JSON reports of the symbol index (dumps/loads) and sqlite queries into new tables
  test    generated test modules compiled and run, tokenize over files, results kept
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import io
import json
import re
import sqlite3
import sys
import sysconfig
import tokenize
from pathlib import Path

import mlsandbox
import numpy as np

TASKS = ("parse", "search", "edit", "query", "test")

SIZES = {
    #          source bytes  parsed files  history messages
    "tiny": (1 << 20, 10, 40),
    "small": (3 << 20, 30, 120),
    "default": (6 << 20, 60, 300),
    "large": (10 << 20, 150, 1000),
}
SYMBOL = re.compile(r"^\s*(def|class)\s+(\w+)", re.M)


class State:
    pass


def source_files() -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__")
    return sorted(p for p in lib.rglob("*.py") if not set(p.relative_to(lib).parts) & set(skip))


def message(rng: np.random.Generator, st: State, role: str, tool: str, body: str) -> dict:
    return {
        "role": role,
        "tool_call": {"name": tool, "arguments": json.dumps({"id": int(rng.integers(1 << 30))})},
        "content": body,
        "tokens": len(body) // 4,
        "turn": len(st.history),
    }


def build_state(seed: int, size: str) -> State:
    budget, nparse, nhist = SIZES[size]
    rng = np.random.default_rng(seed)
    st = State()
    st.files = {}
    total = 0
    for p in source_files():
        if total >= budget:
            break
        text = p.read_text(encoding="utf-8", errors="replace")
        st.files[str(p)] = text
        total += len(text)
    st.lines = {k: v.splitlines() for k, v in st.files.items()}
    st.symbols = {}
    for path, text in st.files.items():
        for m in SYMBOL.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            st.symbols.setdefault(m[2], []).append((path, line, m[1]))
    st.asts = {}
    for path in list(st.files)[:nparse]:
        with contextlib.suppress(SyntaxError):
            st.asts[path] = ast.parse(st.files[path])
    st.db = sqlite3.connect(":memory:")
    st.db.execute("create table files (path text primary key, bytes int, lines int)")
    st.db.execute("create table symbols (name text, path text, line int, kind text)")
    st.db.executemany(
        "insert into files values (?, ?, ?)",
        [(p, len(t), len(st.lines[p])) for p, t in st.files.items()],
    )
    st.db.executemany(
        "insert into symbols values (?, ?, ?, ?)",
        [(n, p, ln, k) for n, locs in st.symbols.items() for p, ln, k in locs],
    )
    st.db.commit()
    st.history = []
    paths = list(st.files)
    for _ in range(nhist):
        p = paths[int(rng.integers(len(paths)))]
        lines = st.lines[p]
        a = int(rng.integers(max(1, len(lines))))
        st.history.append(message(rng, st, "tool", "read_file", "\n".join(lines[a : a + 40])))
    st.warm = mlsandbox.warm_interpreter()
    return st


def pick(rng: np.random.Generator, seq: list, k: int) -> list:
    return [seq[int(i)] for i in rng.choice(len(seq), size=min(k, len(seq)), replace=False)]


def task_parse(st: State, rng: np.random.Generator) -> None:
    st.parsed = []
    for path in pick(rng, list(st.files), 40):
        try:
            tree = ast.parse(st.files[path])
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                doc = ast.get_docstring(node) or ""
                calls = [
                    ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)
                ][:20]
                st.parsed.append({"file": path, "name": node.name, "doc": doc, "calls": calls})
        st.history.append(message(rng, st, "tool", "parse", json.dumps(st.parsed[-20:])))


def task_search(st: State, rng: np.random.Generator) -> None:
    st.hits = []
    for name in pick(rng, sorted(st.symbols), 60):
        pat = re.compile(rf"\b{re.escape(name)}\b")
        for path, text in st.files.items():
            for m in pat.finditer(text):
                line = text.count("\n", 0, m.start())
                ctx = st.lines[path][max(0, line - 2) : line + 3]
                st.hits.append((name, path, line + 1, "\n".join(ctx)))
        st.history.append(
            message(rng, st, "tool", "grep", "\n".join(h[3] for h in st.hits[-30:]))
        )


def task_edit(st: State, rng: np.random.Generator) -> None:
    st.work = {}
    st.diffs = []
    for path in pick(rng, list(st.files), 30):
        lines = list(st.lines[path])
        names = [n for n, locs in st.symbols.items() if any(p == path for p, _, _ in locs)]
        for old in pick(rng, names, 3):
            new = f"{old}_v{int(rng.integers(100))}"
            lines = [re.sub(rf"\b{re.escape(old)}\b", new, ln) for ln in lines]
        for _ in range(int(rng.integers(1, 6))):
            at = int(rng.integers(len(lines) + 1))
            lines[at:at] = [f"    # agent note {int(rng.integers(1 << 20))}", "    pass"]
        st.work[path] = lines
        diff = "\n".join(difflib.unified_diff(st.lines[path], lines, path, path, lineterm=""))
        st.diffs.append(diff)
        st.history.append(message(rng, st, "tool", "apply_patch", diff[:8000]))


def task_query(st: State, rng: np.random.Generator) -> None:
    report = {
        path: sorted(n for n, locs in st.symbols.items() for p, _, _ in locs if p == path)
        for path in pick(rng, list(st.files), 40)
    }
    st.report = json.loads(json.dumps(report, indent=1))
    db = st.db
    db.execute(f"create table hot{int(rng.integers(1 << 20))} as select s.name, f.path, f.bytes "
               "from symbols s join files f on s.path = f.path where s.kind = 'def'")
    st.rows = db.execute(
        "select name, count(*) as n from symbols group by name order by n desc limit 2000"
    ).fetchall()
    st.rows += db.execute("select path, bytes from files where lines > ?",
                          (int(rng.integers(50, 500)),)).fetchall()
    st.history.append(message(rng, st, "tool", "sql", json.dumps(st.rows[:200])))


def task_test(st: State, rng: np.random.Generator) -> None:
    st.results = []
    for k in range(40):
        a, b = int(rng.integers(1000)), int(rng.integers(1, 1000))
        src = (
            f"def test_{k}():\n    xs = [i * {a} % {b} for i in range({a} + 100)]\n"
            f"    assert sorted(xs) == sorted(xs, reverse=True)[::-1]\n"
            f"    return sum(xs), max(xs), {{str(i): i for i in xs[:50]}}\n"
        )
        ns: dict = {}
        exec(compile(src, f"<test_{k}>", "exec"), ns)
        st.results.append((f"test_{k}", ns[f"test_{k}"]()))
    st.tokens = []
    for path in pick(rng, list(st.files), 10):
        toks = tokenize.generate_tokens(io.StringIO(st.files[path]).readline)
        st.tokens.append([(t.type, t.string) for t in toks])
    st.history.append(message(rng, st, "tool", "pytest", repr(st.results)[:8000]))


TASK_FNS = {
    "parse": task_parse,
    "search": task_search,
    "edit": task_edit,
    "query": task_query,
    "test": task_test,
}

if __name__ == "__main__":
    mlsandbox.LOG_NAME = "codingsandbox"
    mlsandbox.main(doc=__doc__, sizes=SIZES, build=build_state, fns=TASK_FNS)
    sys.exit(0)
