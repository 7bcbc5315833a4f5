#!/usr/bin/env python3
"""Checks two rules of Ferry's layout (docs/ARCHITECTURE.md, "Layout rules") over every crate.

1. No Rust source file is longer than 800 lines unless one of its first 30 lines says why,
   with the words "longer than 800 lines".
2. No import cycle between the files of one crate. A file is a module; it depends on each
   module it names through `crate::`, `super::` or `self::` paths (and `use` trees of
   them). A module may name its ancestors (whose items it extends, as an `impl` split over
   files does) and its descendants (the parts it is made of): those edges are not counted.
   Every other edge must leave the graph acyclic.
3. The docs name the tree as it is: every test file (`crates/*/tests/*.rs`,
   `tests/interop/tests/*.rs`) is named in docs/testing.md; every crate is named in
   README.md's layout and in docs/ARCHITECTURE.md; and every path those three files and
   docs/target.md name (`crates/...`, `tests/...`, `scripts/...`, `web/...`, `fuzz/...`,
   `docs/...`, brace lists like `crates/disk/tests/{ops,check}.rs` included) exists.

Exit status 0 when both hold, 1 with every breach listed otherwise.

    ./scripts/layout-check.py            # the whole tree
    ./scripts/layout-check.py crates/disk
"""

import re
import sys
from pathlib import Path

LINES_MAX = 800
REASON = "longer than 800 lines"
ROOT = Path(__file__).resolve().parent.parent


def crate_roots(paths):
    """Every directory under `paths` holding a Cargo.toml and a src/ or tests/ directory."""
    for base in paths:
        for toml in sorted(Path(base).rglob("Cargo.toml")):
            if "target" in toml.parts or "node_modules" in toml.parts:
                continue
            yield toml.parent


def module_of(src: Path, file: Path):
    """The module path of `file` inside the crate whose sources are in `src`."""
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def expand_use_tree(prefix, tree):
    """Paths of `use prefix::{a, b::c, d::{e}}` as lists of segments (first level only)."""
    out = []
    depth = 0
    item = ""
    for ch in tree:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(item)
            item = ""
        else:
            item += ch
    out.append(item)
    paths = []
    for it in out:
        it = it.strip()
        if not it:
            continue
        head = re.match(r"(\w+(?:::\w+)*)", it)
        if head:
            paths.append(prefix + head.group(1).split("::"))
    return paths


def references(text: str):
    """(anchor, segments) for every crate/super/self path in `text`."""
    refs = []
    for m in re.finditer(r"\b(crate|super|self)((?:::super)*)::\{([^;]*?)\}", text, flags=re.S):
        ups = m.group(2).count("super")
        for p in expand_use_tree([], m.group(3)):
            refs.append((m.group(1), ups, p))
    for m in re.finditer(r"\b(crate|super|self)((?:::super)*)((?:::\w+)+)", text):
        ups = m.group(2).count("super")
        refs.append((m.group(1), ups, m.group(3).strip(":").split("::")))
    return refs


def resolve(anchor, ups, segs, here, modules):
    if anchor == "crate":
        base = ()
    elif anchor == "super":
        base = here[: max(0, len(here) - 1 - ups)]
    else:
        base = here
    path = base + tuple(segs)
    # The longest prefix that is a module file.
    for n in range(len(path), -1, -1):
        if path[:n] in modules:
            return path[:n]
    return None


def is_lineage(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def find_cycle(graph):
    color = {}
    stack = []

    def visit(n):
        color[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if color.get(m) is None:
                c = visit(m)
                if c:
                    return c
        stack.pop()
        color[n] = 2
        return None

    for n in sorted(graph):
        if color.get(n) is None:
            c = visit(n)
            if c:
                return c
    return None


def check_crate(crate: Path, problems):
    for src in (crate / "src",):
        if not src.is_dir():
            continue
        files = sorted(src.rglob("*.rs"))
        modules = {module_of(src, f): f for f in files}
        graph = {}
        for mod, f in modules.items():
            text = strip_comments(f.read_text())
            for anchor, ups, segs in references(text):
                target = resolve(anchor, ups, segs, mod, modules)
                if target is None or target == mod or is_lineage(mod, target):
                    continue
                graph.setdefault(mod, set()).add(target)
        while True:
            cycle = find_cycle(graph)
            if not cycle:
                break
            names = " -> ".join(str(modules[m].relative_to(ROOT)) for m in cycle)
            problems.append(f"import cycle: {names}")
            graph[cycle[0]].discard(cycle[1])
    for f in sorted(crate.rglob("*.rs")):
        if "target" in f.relative_to(crate).parts:
            continue
        lines = f.read_text().splitlines()
        if len(lines) > LINES_MAX:
            head = "\n".join(lines[:30]).lower()
            if REASON not in head:
                problems.append(
                    f"{f.relative_to(ROOT)}: {len(lines)} lines and no reason "
                    f"('{REASON} because ...') in its first 30 lines"
                )


PATH_RE = re.compile(r"\b((?:crates|tests|scripts|web|fuzz|docs)/[\w./{},*-]*[\w}*/])")


def expand_braces(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand_braces(path[: m.start()] + alt.strip() + path[m.end():]))
    return out


def named_paths(doc: Path):
    text = doc.read_text()
    names = set()
    for m in PATH_RE.finditer(text):
        raw = m.group(1).rstrip(".,")
        if "*" in raw or "..." in raw or "…" in raw:
            continue
        names.update(expand_braces(raw))
    return names


def check_docs(problems):
    docs = {name: ROOT / name for name in
            ("README.md", "docs/ARCHITECTURE.md", "docs/testing.md", "docs/target.md")}
    named = {name: named_paths(path) for name, path in docs.items()}
    for name, paths in named.items():
        for p in sorted(paths):
            if not (ROOT / p).exists():
                problems.append(f"{name} names {p}, which does not exist")
    tests = sorted(ROOT.glob("crates/*/tests/*.rs")) + sorted(ROOT.glob("tests/interop/tests/*.rs"))
    for t in tests:
        rel = str(t.relative_to(ROOT))
        if rel not in named["docs/testing.md"]:
            problems.append(f"docs/testing.md does not name the test file {rel}")
    crates = sorted(p.parent.name for p in ROOT.glob("crates/*/Cargo.toml"))
    for doc in ("README.md", "docs/ARCHITECTURE.md"):
        text = (ROOT / doc).read_text()
        for c in crates:
            if f"crates/{c}" not in text:
                problems.append(f"{doc} does not name crates/{c}")


def main():
    paths = sys.argv[1:] or [ROOT / "crates", ROOT / "tests", ROOT / "fuzz"]
    problems = []
    for crate in crate_roots(paths):
        check_crate(crate, problems)
    if not sys.argv[1:]:
        check_docs(problems)
    for p in problems:
        print(p)
    if problems:
        print(f"layout-check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("layout-check: ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
