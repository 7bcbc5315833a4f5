//! `scripts/layout-check.py` tells the truth: run on planted trees in a temporary directory,
//! it reports an import cycle between two files however the code before the cycle's `use`
//! is spelled (a string continued with a backslash-newline, a raw string holding `"`, a
//! `'"'` character, nested block comments, lifetimes), invents none from paths inside
//! comments and strings, and fails a crate map in docs/ARCHITECTURE.md that differs from
//! `cargo metadata`. A clean tree passes.
//!
//! Requires `python3` (the tool rule: skipped on a developer's machine without it, a failure
//! under `CI=true`) and cargo, which runs this test and is found through `$CARGO`.

use std::path::Path;
use std::process::Command;

use interop::require;
use tempfile::TempDir;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/layout-check.py");

/// Writes `files` (path relative to the tree, contents) into a new temporary directory.
fn tree(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// Runs the check with `args` in directory `cwd`; returns its exit status and what it
/// printed on stdout.
fn check(cwd: &Path, args: &[&Path]) -> (i32, String) {
    let out = Command::new("python3")
        .arg(SCRIPT)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Traceback"),
        "the check crashed:\n{stderr}"
    );
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
    )
}

/// The check of one crate `a` whose `src/x.rs` is `x` and `src/y.rs` is `y` (which defines
/// `Y`, re-exported by lib.rs), run on `.` inside it so that it prints paths from there.
fn check_crate(x: &str, y: &str) -> (i32, String) {
    let dir = tree(&[
        ("a/Cargo.toml", "[package]\nname = \"a\"\n"),
        ("a/src/lib.rs", "pub mod x;\npub mod y;\n\npub use y::Y;\n"),
        ("a/src/x.rs", x),
        ("a/src/y.rs", y),
    ]);
    check(dir.path(), &[Path::new(".")])
}

/// `y.rs`, naming `x`: with an `x` that names `y`, the two files are a cycle.
const Y_USES_X: &str = "use crate::x::X;\npub struct Y(pub X);\n";

/// The end of each `x.rs` below: line `n` of x.rs names `y`, and a string follows, so that a
/// stripper that lost step before the `use` pairs a quote before it with this one and
/// swallows the `use` (the old regex stripper did, for each planted line before it).
fn x_naming_y_after(planted: &str) -> String {
    format!("{planted}\nuse crate::y::Y;\npub const T: &str = \"t\";\npub struct X;\n")
}

#[test]
fn cycle_in_plain_code_is_reported() {
    if !require("python3") {
        return;
    }

    let (status, out) = check_crate(&x_naming_y_after("//! X."), Y_USES_X);

    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("import cycle: a/src/x.rs:2 -> a/src/y.rs:1 -> a/src/x.rs"),
        "{out}"
    );
}

#[test]
fn cycle_after_backslash_continued_string_is_reported() {
    if !require("python3") {
        return;
    }
    let x = x_naming_y_after("pub const S: &str = \"one \\\n    two\";");

    let (status, out) = check_crate(&x, Y_USES_X);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("a/src/x.rs:3 -> a/src/y.rs:1"), "{out}");
}

#[test]
fn cycle_after_raw_string_holding_quote_is_reported() {
    if !require("python3") {
        return;
    }
    let x = x_naming_y_after("pub const S: &str = r#\"say \"hi\"#;");

    let (status, out) = check_crate(&x, Y_USES_X);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("a/src/x.rs:2 -> a/src/y.rs:1"), "{out}");
}

#[test]
fn cycle_after_quote_char_literal_is_reported() {
    if !require("python3") {
        return;
    }
    let x = x_naming_y_after("pub const Q: char = '\"';");

    let (status, out) = check_crate(&x, Y_USES_X);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("a/src/x.rs:2 -> a/src/y.rs:1"), "{out}");
}

#[test]
fn cycle_after_nested_block_comment_is_reported() {
    if !require("python3") {
        return;
    }
    // The inner `*/` does not end the comment, so the `"` is inside it.
    let x = x_naming_y_after("/* outer /* inner */ \" */");

    let (status, out) = check_crate(&x, Y_USES_X);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("a/src/x.rs:2 -> a/src/y.rs:1"), "{out}");
}

#[test]
fn cycle_after_lifetimes_and_byte_literals_is_reported() {
    if !require("python3") {
        return;
    }
    // A lexer that took `'a` for the start of a character literal, or the escaped quote
    // in `b'\''` and the backslash in `b"\\"` for the end of one, would lose step here.
    let x = x_naming_y_after(
        "pub fn f<'a>(s: &'a str) -> &'a str { s }\npub const C: u8 = b'\\'';\n\
         pub const B: &[u8] = b\"\\\\\";",
    );

    let (status, out) = check_crate(&x, Y_USES_X);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("a/src/x.rs:4 -> a/src/y.rs:1"), "{out}");
}

#[test]
fn cycle_through_nested_use_tree_is_reported() {
    if !require("python3") {
        return;
    }
    // `y` comes after a nested group, where the old check stopped at the first `}`.
    let x = "use crate::{x::{self}, lib_item, y::Y};\npub struct X;\n";

    let (status, out) = check_crate(x, Y_USES_X);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("a/src/x.rs:1 -> a/src/y.rs:1"), "{out}");
}

#[test]
fn cycle_through_crate_root_reexport_is_reported() {
    if !require("python3") {
        return;
    }
    // `crate::Y` is lib.rs's `pub use y::Y`: the item is y's.
    let x = "use crate::Y;\npub struct X;\n";

    let (status, out) = check_crate(x, Y_USES_X);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("a/src/x.rs:1 -> a/src/y.rs:1"), "{out}");
}

#[test]
fn paths_in_comments_strings_and_inline_tests_are_not_edges() {
    if !require("python3") {
        return;
    }
    // Every mention of `y` in x.rs is a comment, a string, a raw string, or `super` inside
    // the inline `mod tests` (which is x itself), so there is no cycle.
    let x = "// use crate::y::Y;\n/* /* crate::y::Y */ */\n\
             pub const S: &str = \"crate::y::Y \\\n  crate::y\";\n\
             pub const R: &str = r##\"crate::y::Y \"# \"##;\npub struct X;\n\
             #[cfg(test)]\nmod tests {\n    use super::X;\n}\n";

    let (status, out) = check_crate(x, Y_USES_X);

    assert_eq!(status, 0, "{out}");
}

/// A whole tree: a workspace of crates `a` (using `b`) and `b`, the docs the check reads,
/// and `map` as docs/ARCHITECTURE.md's crate map.
fn check_tree_with_map(map: &str) -> (i32, String) {
    let architecture = format!("# Architecture\n\n## Crate map\n\n{map}\n\nMore text.\n");
    let dir = tree(&[
        (
            "Cargo.toml",
            "[workspace]\nresolver = \"3\"\nmembers = [\"crates/a\", \"crates/b\"]\n",
        ),
        (
            "crates/a/Cargo.toml",
            "[package]\nname = \"a\"\nedition = \"2024\"\n\n[dependencies]\n\
             b = { path = \"../b\" }\n\n[dev-dependencies]\nc = { path = \"../c\" }\n",
        ),
        ("crates/a/src/lib.rs", "//! A.\n"),
        (
            "crates/b/Cargo.toml",
            "[package]\nname = \"b\"\nedition = \"2024\"\n",
        ),
        ("crates/b/src/lib.rs", "//! B.\n"),
        (
            "crates/c/Cargo.toml",
            "[package]\nname = \"c\"\nedition = \"2024\"\n",
        ),
        (
            "crates/c/src/lib.rs",
            "//! C, a dev-dependency of `a` only.\n",
        ),
        ("README.md", "crates/a, crates/b and crates/c\n"),
        ("docs/ARCHITECTURE.md", &architecture),
        ("docs/testing.md", "Testing.\n"),
        ("docs/target.md", "Target.\n"),
    ]);
    let (status, out) = check(dir.path(), &[Path::new("--root"), dir.path()]);
    (status, out)
}

const MAP_HEADER: &str = "| crate | depends on | what it is |\n|---|---|---|\n";

#[test]
fn crate_map_as_cargo_metadata_says_passes() {
    if !require("python3") {
        return;
    }
    let map = format!(
        "{MAP_HEADER}| `crates/a` | `b` | top |\n| `crates/c` | — | tests |\n\
         | `crates/b` | — | bottom |"
    );

    let (status, out) = check_tree_with_map(&map);

    assert_eq!(status, 0, "{out}");
}

#[test]
fn crate_map_missing_a_dependency_fails() {
    if !require("python3") {
        return;
    }
    let map = format!(
        "{MAP_HEADER}| `crates/a` | — | top |\n| `crates/c` | — | tests |\n\
         | `crates/b` | — | bottom |"
    );

    let (status, out) = check_tree_with_map(&map);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("does not say crates/a depends on b"), "{out}");
}

#[test]
fn crate_map_with_a_dev_dependency_or_a_stray_crate_fails() {
    if !require("python3") {
        return;
    }
    // `c` is only a dev-dependency of `a`, and there is no crates/d.
    let map = format!(
        "{MAP_HEADER}| `crates/a` | `b`, `c` | top |\n| `crates/c` | — | tests |\n\
         | `crates/b` | — | bottom |\n| `crates/d` | — | none |"
    );

    let (status, out) = check_tree_with_map(&map);

    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("says crates/a depends on c, which is not"),
        "{out}"
    );
    assert!(out.contains("names crates/d, not a crate"), "{out}");
}

#[test]
fn crate_map_without_a_row_or_pointing_upward_fails() {
    if !require("python3") {
        return;
    }
    // No row for `c`, and `b` sits above `a`, which depends on it.
    let map = format!("{MAP_HEADER}| `crates/b` | — | bottom |\n| `crates/a` | `b` | top |");

    let (status, out) = check_tree_with_map(&map);

    assert_eq!(status, 1, "{out}");
    assert!(out.contains("no row for crates/c"), "{out}");
    assert!(out.contains("lists b above crates/a"), "{out}");
}
