#!/usr/bin/env python3
"""Checks the rules of Ferry's layout (docs/ARCHITECTURE.md, "Crate map") over every crate.

1. No Rust source file is longer than 800 lines unless one of its first 30 lines says why,
   with the words "longer than 800 lines".
2. No import cycle between the files of one crate. A file is a module; it depends on each
   module it names through a path starting with `crate`, `$crate`, `super` or `self` (`use`
   trees of them expanded). A module may name its ancestors (whose items it extends, as an
   `impl` split over files does) and its descendants (the parts it is made of): those edges
   are not counted. Every other edge must leave the graph acyclic. Sources are read with a
   lexer of Rust's lexical structure (`tokenize`), so no comment, string, raw string or
   character literal hides a path or invents one; `super` inside an inline `mod x { .. }`
   means the file's own module; and a name that a module re-exports (`pub use db::Farm` in
   lib.rs) leads to the module defining it, so `crate::Farm` is an edge to db.rs.
3. The docs name the tree as it is: every test file (`crates/*/tests/*.rs`,
   `tests/interop/tests/*.rs`) is named in docs/testing.md; every crate is named in
   README.md's layout and in docs/ARCHITECTURE.md; and every path those three files and
   docs/target.md name (`crates/...`, `tests/...`, `scripts/...`, `web/...`, `fuzz/...`,
   `docs/...`, brace lists like `crates/disk/tests/{ops,check}.rs` included) exists.
4. docs/ARCHITECTURE.md's crate map says what `cargo metadata` says: its table "crate |
   depends on" has one row per crate (every workspace member, and every crate with a
   workspace of its own under crates/, tests/ or fuzz/), each row lists exactly the
   workspace crates of the crate's `[dependencies]` (dev- and build-dependencies left out),
   and every crate a row lists has its own row further down (dependencies point downward).

Exit status 0 when all hold, 1 with every breach listed otherwise.

    ./scripts/layout-check.py                  # the whole tree: rules 1 to 4
    ./scripts/layout-check.py crates/disk      # rules 1 and 2 for the crates under a path
    ./scripts/layout-check.py --root DIR       # rules 1 to 4 for another tree (the tests')

`cargo` is `$CARGO` when set (as under `cargo test`), else `cargo` on PATH.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

LINES_MAX = 800
REASON = "longer than 800 lines"

# ---------------------------------------------------------------------------------------------
# A lexer for Rust's lexical structure: enough of it that no comment, string or character
# literal can hide code or pass for code.
# ---------------------------------------------------------------------------------------------

IDENT_PREFIXES_STR = ("b", "c", "r", "br", "cr")


class Token:
    """One token: `kind` is "ident", "lifetime", "literal" or "punct"; `text` its text (a
    raw identifier without its `r#`, `::` as one punct); `line` the 1-based line it starts on."""

    __slots__ = ("kind", "text", "line")

    def __init__(self, kind, text, line):
        self.kind = kind
        self.text = text
        self.line = line

    def __repr__(self):
        return f"{self.kind}:{self.text}@{self.line}"


class LexError(Exception):
    """A literal or block comment that does not end before the file does."""


def is_ident_start(ch):
    return ch == "_" or ch.isalpha()


def is_ident_char(ch):
    return ch == "_" or ch.isalnum()


def tokenize(text):
    """The tokens of Rust source `text`, comments left out.

    Handles line comments (`//`, `///`, `//!`), block comments nested to any depth, string
    literals with escapes (a backslash-newline included), byte and C strings (`b"…"`,
    `c"…"`), raw strings with any number of `#` (`r"…"`, `r#"…"#`, `br##"…"##`, `cr"…"`),
    character and byte literals (`'"'`, `'\\''`, `b'\\x7f'`, `'\\u{1F600}'`) told apart from
    lifetimes and labels (`'a`, `'static`, `'outer:`), raw identifiers (`r#type`) and numbers
    with suffixes. Raises LexError for a literal or comment that the file ends inside.
    """
    out = []
    i, n, line = 0, len(text), 1

    def skip_to(j):
        nonlocal i, line
        line += text.count("\n", i, j)
        i = j

    def quoted(start, body):
        """End (exclusive) of a `"`-delimited literal whose opening quote is at `body`."""
        j = body + 1
        while j < n:
            ch = text[j]
            if ch == "\\":
                j += 2  # any escaped character, a newline (string continuation) included
                continue
            if ch == '"':
                return j + 1
            j += 1
        raise LexError(f"line {line}: string not closed")

    def raw(start, hashes_at):
        """End (exclusive) of a raw string whose `#`s (possibly none) start at `hashes_at`,
        or None when what follows is not a raw string (`r#ident`)."""
        j = hashes_at
        while j < n and text[j] == "#":
            j += 1
        if j >= n or text[j] != '"':
            return None
        close = '"' + "#" * (j - hashes_at)
        end = text.find(close, j + 1)
        if end < 0:
            raise LexError(f"line {line}: raw string not closed")
        return end + len(close)

    def char_literal(q):
        """End (exclusive) of the character literal opening at the quote `q`, or None when
        the quote starts a lifetime or label instead."""
        if q + 1 < n and text[q + 1] == "\\":
            end = text.find("'", q + 3)  # past the backslash and the escaped character
            if end < 0:
                raise LexError(f"line {line}: character literal not closed")
            return end + 1
        if q + 2 < n and text[q + 2] == "'" and text[q + 1] != "\n":
            return q + 3
        return None

    while i < n:
        ch = text[i]
        two = text[i : i + 2]
        if ch in " \t\r\n":
            skip_to(i + 1)
        elif two == "//":
            end = text.find("\n", i)
            skip_to(n if end < 0 else end)
        elif two == "/*":
            depth, j = 1, i + 2
            while depth:
                if j >= n:
                    raise LexError(f"line {line}: block comment not closed")
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            skip_to(j)
        elif ch == '"':
            out.append(Token("literal", '""', line))
            skip_to(quoted(i, i))
        elif ch == "'":
            end = char_literal(i)
            if end is not None:
                out.append(Token("literal", "''", line))
                skip_to(end)
            else:
                j = i + 1
                if text.startswith("r#", j):
                    j += 2
                while j < n and is_ident_char(text[j]):
                    j += 1
                out.append(Token("lifetime", text[i:j], line))
                skip_to(j)
        elif is_ident_start(ch):
            j = i
            while j < n and is_ident_char(text[j]):
                j += 1
            word = text[i:j]
            nxt = text[j] if j < n else ""
            if word in IDENT_PREFIXES_STR and nxt in ('"', "#"):
                end = raw(i, j) if "r" in word else (quoted(i, j) if nxt == '"' else None)
                if end is not None:
                    out.append(Token("literal", '""', line))
                    skip_to(end)
                    continue
                if word == "r" and nxt == "#" and j + 1 < n and is_ident_start(text[j + 1]):
                    k = j + 1
                    while k < n and is_ident_char(text[k]):
                        k += 1
                    out.append(Token("ident", text[j + 1 : k], line))
                    skip_to(k)
                    continue
            if word == "b" and nxt == "'":
                end = char_literal(j)
                if end is not None:
                    out.append(Token("literal", "''", line))
                    skip_to(end)
                    continue
            out.append(Token("ident", word, line))
            skip_to(j)
        elif ch.isdigit():
            j = i + 1
            while j < n and (is_ident_char(text[j]) or
                             (text[j] == "." and j + 1 < n and text[j + 1].isdigit())):
                j += 1
            out.append(Token("literal", text[i:j], line))
            skip_to(j)
        elif two == "::":
            out.append(Token("punct", "::", line))
            skip_to(i + 2)
        else:
            out.append(Token("punct", ch, line))
            skip_to(i + 1)
    return out


# ---------------------------------------------------------------------------------------------
# Module paths named in a file
# ---------------------------------------------------------------------------------------------

ANCHORS = ("crate", "super", "self")


def use_tree(toks, i):
    """Parses a use tree or path continuing at `toks[i]` (just after a `::`). Returns (paths,
    next index): each path a list of segments; `self` in a brace list names the prefix, and a
    glob ends in the segment "*"."""
    t = toks[i] if i < len(toks) else None
    if t is None:
        return [[]], i
    if t.text == "{":
        paths, i = [], i + 1
        while i < len(toks) and toks[i].text != "}":
            if toks[i].text == ",":
                i += 1
                continue
            sub, j = use_tree(toks, i)
            paths.extend(sub)
            i = max(j, i + 1)  # a token no tree starts with is skipped
        return paths or [[]], i + 1
    if t.text == "*":
        return [["*"]], i + 1
    if t.kind != "ident":
        return [[]], i  # `<` of a turbofish, or the end of the path
    segs = [] if t.text == "self" else [t.text]
    i += 1
    if i < len(toks) and toks[i].text == "::":
        tails, i = use_tree(toks, i + 1)
        return [segs + tail for tail in tails], i
    return [segs], i


def named_paths(toks, file_module):
    """(module, anchor path, line) for every path starting with `crate`, `$crate`, `super`
    or `self` in the tokens of one file; `module` is where the path is written: the file's
    module, or an inline `mod name { ... }` inside it."""
    out = []
    depth = 0
    inline = []  # (name, brace depth inside the inline module)
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.text == "{":
            depth += 1
        elif t.text == "}":
            if inline and inline[-1][1] == depth:
                inline.pop()
            depth -= 1
        elif (t.kind == "ident" and t.text == "mod" and i + 2 < len(toks)
              and toks[i + 1].kind == "ident" and toks[i + 2].text == "{"):
            inline.append((toks[i + 1].text, depth + 1))
        elif (t.kind == "ident" and t.text in ANCHORS and i + 1 < len(toks)
              and toks[i + 1].text == "::" and (i == 0 or toks[i - 1].text != "::")):
            here = file_module + tuple(name for name, _ in inline)
            anchor, j = [t.text], i + 2
            while j + 1 < len(toks) and toks[j].text == "super" and toks[j + 1].text == "::":
                anchor.append("super")
                j += 2
            tails, _ = use_tree(toks, j)
            for tail in tails:
                out.append((here, anchor + tail, t.line))
            i = j
            continue
        i += 1
    return out


def reexports(toks, file_module):
    """{name: (module, path)} for the items a file re-exports (`pub use`, of any visibility,
    at the file's top level), by name; a path not starting with an anchor is relative to
    the file's module (a child module, or another crate's path that resolves to none).
    Globs and aliases (`as`) are not followed."""
    out = {}
    depth = 0
    for i, t in enumerate(toks):
        depth += {"{": 1, "}": -1}.get(t.text, 0)
        if depth or t.text != "pub":
            continue
        j = i + 1
        if j < len(toks) and toks[j].text == "(":
            while j < len(toks) and toks[j].text != ")":
                j += 1
            j += 1
        if j + 1 >= len(toks) or toks[j].text != "use" or toks[j + 1].kind != "ident":
            continue
        if toks[j + 1].text in ANCHORS and j + 2 < len(toks) and toks[j + 2].text == "::":
            head, tails = [toks[j + 1].text], use_tree(toks, j + 3)[0]
        else:
            head, tails = ["self"], use_tree(toks, j + 1)[0]
        for tail in tails:
            if tail and tail[-1] != "*":
                out[tail[-1]] = (file_module, head + tail)
    return out


def absolute(here, path):
    """The path from the crate root that `path` (starting with its anchor, as written in
    module `here`) names."""
    head, rest = path[0], list(path[1:])
    if head == "crate":
        base = ()
    else:
        base = here if head == "self" else here[:-1]
        while rest and rest[0] == "super":
            base = base[:-1]
            rest.pop(0)
    return base + tuple(rest)


def resolve(here, path, modules, exports, hops_max=8):
    """The module file that the item `path` names is defined in (as written in module
    `here`): the longest prefix of its absolute path that is a file of the crate, and when
    that file re-exports the next segment (`pub use`), where the re-export leads, for up to
    `hops_max` re-exports."""
    target = None
    for _ in range(hops_max):
        full = absolute(here, path)
        target = next((full[:n] for n in range(len(full), -1, -1) if full[:n] in modules), None)
        rest = full[len(target):] if target is not None else ()
        if not rest or rest[0] not in exports.get(target, {}):
            break
        here, via = exports[target][rest[0]]
        path = via + list(rest[1:])
    return target


# ---------------------------------------------------------------------------------------------
# Rules 1 and 2: file lengths, import cycles
# ---------------------------------------------------------------------------------------------


def shown(path, root):
    """`path` relative to the tree's root when inside it, else as it is."""
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def crate_roots(paths):
    """Every directory under `paths` holding a Cargo.toml."""
    for base in paths:
        for toml in sorted(Path(base).rglob("Cargo.toml")):
            if "target" in toml.parts or "node_modules" in toml.parts:
                continue
            yield toml.parent


def module_of(src: Path, file: Path):
    """The module path of `file` inside the crate whose sources are in `src`."""
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def library_files(src: Path):
    """The files of the crate rooted at src/lib.rs (else src/main.rs): a `src/bin/` file,
    and src/main.rs beside a lib.rs, are crates of their own."""
    files = []
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).parts
        if rel[0] == "bin" or (rel == ("main.rs",) and (src / "lib.rs").exists()):
            continue
        files.append(f)
    return files


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


def import_graph(src: Path, problems, root):
    """{module: {module it names: first line naming it}} over the files of one crate."""
    modules = {module_of(src, f): f for f in library_files(src)}
    tokens = {}
    for mod, f in modules.items():
        try:
            tokens[mod] = tokenize(f.read_text())
        except LexError as e:
            problems.append(f"{shown(f, root)}: {e}")
    exports = {mod: reexports(toks, mod) for mod, toks in tokens.items()}
    graph = {}
    for mod, toks in tokens.items():
        for here, path, line in named_paths(toks, mod):
            target = resolve(here, path, modules, exports)
            if target is None or target == mod or is_lineage(mod, target):
                continue
            graph.setdefault(mod, {}).setdefault(target, line)
    return modules, graph


def check_crate(crate: Path, problems, root):
    src = crate / "src"
    if src.is_dir():
        modules, graph = import_graph(src, problems, root)
        while True:
            cycle = find_cycle(graph)
            if not cycle:
                break
            names = " -> ".join(
                f"{shown(modules[a], root)}:{graph[a][b]}" for a, b in zip(cycle, cycle[1:])
            )
            problems.append(f"import cycle: {names} -> {shown(modules[cycle[0]], root)}")
            del graph[cycle[0]][cycle[1]]
    for f in sorted(crate.rglob("*.rs")):
        if "target" in f.relative_to(crate).parts:
            continue
        lines = f.read_text().splitlines()
        if len(lines) > LINES_MAX:
            head = "\n".join(lines[:30]).lower()
            if REASON not in head:
                problems.append(
                    f"{shown(f, root)}: {len(lines)} lines and no reason "
                    f"('{REASON} because ...') in its first 30 lines"
                )


# ---------------------------------------------------------------------------------------------
# Rule 3: the docs name the tree
# ---------------------------------------------------------------------------------------------

PATH_RE = re.compile(r"\b((?:crates|tests|scripts|web|fuzz|docs)/[\w./{},*-]*[\w}*/])")
DOCS = ("README.md", "docs/ARCHITECTURE.md", "docs/testing.md", "docs/target.md")


def expand_braces(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand_braces(path[: m.start()] + alt.strip() + path[m.end():]))
    return out


def doc_paths(text):
    names = set()
    for m in PATH_RE.finditer(text):
        raw = m.group(1).rstrip(".,")
        if "*" in raw or "..." in raw or "…" in raw:
            continue
        names.update(expand_braces(raw))
    return names


def check_docs(root, texts, problems):
    named = {name: doc_paths(text) for name, text in texts.items()}
    for name, paths in named.items():
        for p in sorted(paths):
            if not (root / p).exists():
                problems.append(f"{name} names {p}, which does not exist")
    tests = sorted(root.glob("crates/*/tests/*.rs")) + sorted(root.glob("tests/interop/tests/*.rs"))
    for t in tests:
        rel = str(t.relative_to(root))
        if rel not in named["docs/testing.md"]:
            problems.append(f"docs/testing.md does not name the test file {rel}")
    crates = sorted(p.parent.name for p in root.glob("crates/*/Cargo.toml"))
    for doc in ("README.md", "docs/ARCHITECTURE.md"):
        for c in crates:
            if f"crates/{c}" not in texts[doc]:
                problems.append(f"{doc} does not name crates/{c}")


# ---------------------------------------------------------------------------------------------
# Rule 4: the crate map against `cargo metadata`
# ---------------------------------------------------------------------------------------------

MAP_HEADER = ("crate", "depends on")
CRATE_CELL_RE = re.compile(r"`([\w./-]+?)/?`")  # the crate's directory, first in its cell


def cargo_metadata(manifest: Path):
    cargo = os.environ.get("CARGO", "cargo")
    out = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps", "--offline",
         "--manifest-path", str(manifest)],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"cargo metadata --manifest-path {manifest}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def actual_crate_map(root: Path):
    """{crate directory relative to root: set of package names of its workspace
    [dependencies]}, from `cargo metadata` of the root's workspace and of every other
    workspace under crates/, tests/ or fuzz/ (the fuzz targets' own)."""
    packages = {}  # manifest dir -> package JSON
    pending = [root / "Cargo.toml"]
    seen = set()
    while pending:
        manifest = pending.pop(0)
        meta = cargo_metadata(manifest)
        for p in meta["packages"]:
            packages[Path(p["manifest_path"]).parent.resolve()] = p
        seen.add(Path(meta["workspace_root"]).resolve())
        for d in crate_roots([root / "crates", root / "tests", root / "fuzz"]):
            d = d.resolve()
            if d not in packages and d not in seen and d / "Cargo.toml" not in pending:
                pending.append(d / "Cargo.toml")
                seen.add(d)
    names = {d: p["name"] for d, p in packages.items()}
    crate_map = {}
    for d, p in packages.items():
        if d == root:
            continue
        deps = set()
        for dep in p["dependencies"]:
            path = dep.get("path")
            if dep.get("kind") is None and path and Path(path).resolve() in names:
                deps.add(names[Path(path).resolve()])
        crate_map[str(d.relative_to(root))] = (p["name"], deps)
    return crate_map


def cells(line):
    """The cells of a Markdown table row (`\\|` is a `|` inside a cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def documented_crate_map(text):
    """[(crate directory, set of crates named in "depends on", line number)] of the table
    whose header starts "crate | depends on", in the order of its rows; None when the doc
    has no such table."""
    rows = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            if rows:
                break
            continue
        row = cells(line)
        if rows is None:
            if tuple(c.lower() for c in row[:2]) == MAP_HEADER:
                rows = []
            continue
        if set("".join(row)) <= set("-: "):
            continue  # the line under the header
        m = CRATE_CELL_RE.search(row[0])
        if m is None:
            rows.append((row[0], set(), number))
            continue
        deps = set(re.findall(r"`([\w-]+)`", row[1])) if len(row) > 1 else set()
        rows.append((m.group(1), deps, number))
    return rows


def check_crate_map(root: Path, text, problems):
    doc = "docs/ARCHITECTURE.md"
    rows = documented_crate_map(text)
    if rows is None:
        problems.append(f"{doc} has no crate map (a table whose header is 'crate | depends on')")
        return
    try:
        actual = actual_crate_map(root)
    except (RuntimeError, OSError, ValueError) as e:
        problems.append(f"crate map not checked: {e}")
        return
    position = {}
    for index, (crate, _, number) in enumerate(rows):
        if crate not in actual:
            problems.append(f"{doc}:{number}: the crate map names {crate}, not a crate")
        elif crate in position:
            problems.append(f"{doc}:{number}: the crate map has a second row for {crate}")
        position.setdefault(crate, index)
    package_row = {actual[c][0]: position[c] for c in position if c in actual}
    for crate, (package, deps) in sorted(actual.items()):
        if crate not in position:
            problems.append(f"{doc}: the crate map has no row for {crate} ({package})")
            continue
        _, stated, number = rows[position[crate]]
        for dep in sorted(deps - stated):
            problems.append(f"{doc}:{number}: the crate map does not say {crate} depends on {dep}")
        for dep in sorted(stated - deps):
            problems.append(f"{doc}:{number}: the crate map says {crate} depends on {dep}, "
                            "which is not in its [dependencies]")
        for dep in sorted(deps & stated):
            if dep in package_row and package_row[dep] <= position[crate]:
                problems.append(f"{doc}:{number}: the crate map lists {dep} above {crate}, "
                                "which depends on it (rows go downward)")


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def check_tree(root: Path, problems):
    for crate in crate_roots([root / "crates", root / "tests", root / "fuzz"]):
        check_crate(crate, problems, root)
    texts = {}
    for name in DOCS:
        path = root / name
        if path.is_file():
            texts[name] = path.read_text()
        else:
            problems.append(f"{name} is missing")
            texts[name] = ""
    check_docs(root, texts, problems)
    check_crate_map(root, texts["docs/ARCHITECTURE.md"], problems)


def main(argv):
    root = Path(__file__).resolve().parent.parent
    if argv[:1] == ["--root"]:
        if len(argv) != 2:
            print("usage: layout-check.py [--root DIR | PATH...]", file=sys.stderr)
            return 2
        root, argv = Path(argv[1]).resolve(), []
    problems = []
    if argv:
        for crate in crate_roots(argv):
            check_crate(crate, problems, root)
    else:
        check_tree(root, problems)
    for p in problems:
        print(p)
    if problems:
        print(f"layout-check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("layout-check: ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
