//! The tool rule's list is complete: every external tool a test runs or requires is named in
//! `scripts/test.sh`'s `TEST_TOOLS` with the package that installs it, and the script installs
//! every package named there. Under `CI=true` (after the script's install) every tool named
//! there is also on PATH, so a wrong package name fails here rather than in the one test that
//! needs the tool.
//!
//! The tools a test names are read from the sources: `Command::new("TOOL")`, the tool-rule
//! helpers (`require`, `require_all`, `have`, `tool`, `on_path`, … called with string
//! literals), `("TOOL", "--version")` pairs of tool probes, and the QEMU harness's
//! `guest::TOOLS`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `TOOL=PACKAGE` entries of the `TEST_TOOLS=( … )` array in `script`.
fn listed(script: &str) -> BTreeMap<String, String> {
    let start = script
        .find("\nTEST_TOOLS=(")
        .expect("scripts/test.sh has a TEST_TOOLS=( … ) array");
    let body = &script[start + "\nTEST_TOOLS=(".len()..];
    let body = &body[..body
        .find("\n)")
        .expect("TEST_TOOLS is closed by a line `)`")];
    body.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(str::split_whitespace)
        .map(|entry| {
            let (tool, pkg) = entry
                .split_once('=')
                .unwrap_or_else(|| panic!("TEST_TOOLS entry {entry:?} is not TOOL=PACKAGE"));
            (tool.to_owned(), pkg.to_owned())
        })
        .collect()
}

/// The string literals at the start of `rest` (`"a"`, `&["a", "b"]`, `("a", "-V")`), up to the
/// first character that is neither a literal nor list punctuation.
fn literals(rest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut s = rest.trim_start_matches(|c: char| c.is_whitespace() || "&[(".contains(c));
    while let Some(body) = s.strip_prefix('"') {
        let Some(end) = body.find('"') else { break };
        out.push(body[..end].to_owned());
        s = body[end + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == ',');
    }
    out
}

/// Tool-like names (no spaces, no slashes, not a flag) a source file runs or requires.
fn tools_named(source: &str) -> BTreeSet<String> {
    const CALLS: &[&str] = &[
        "Command::new(",
        "require(",
        "require_all(",
        "have(",
        "have_tool(",
        "tool(",
        "on_path(",
    ];
    let mut found = BTreeSet::new();
    for call in CALLS {
        for (at, _) in source.match_indices(call) {
            // `fn tool(` is the helper's definition; `x.tool(` a method of something else.
            let before = source[..at].trim_end();
            if call.starts_with(char::is_lowercase)
                && (before.ends_with("fn") || source[..at].ends_with('.'))
            {
                continue;
            }
            let rest = &source[at + call.len()..];
            // Only the first argument of a helper: `tool("a").arg("b")` names `a` only.
            let first = literals(rest);
            if *call == "require_all(" || rest.trim_start().starts_with("&[") {
                found.extend(first);
            } else {
                found.extend(first.into_iter().take(1));
            }
        }
    }
    // `("mkfs.ext4", "-V")`: a tool probed for its version.
    for probe in ["\"-V\")", "\"--version\")", "\"version\")"] {
        for (at, _) in source.match_indices(probe) {
            let head = source[..at].trim_end().trim_end_matches(',').trim_end();
            if let Some(open) = head.rfind("(\"") {
                found.extend(literals(&head[open..]).into_iter().take(1));
            }
        }
    }
    found
        .into_iter()
        .filter(|n| {
            !n.is_empty()
                && !n.contains([' ', '/', '{', '='])
                && !n.starts_with('-')
                // A name that must not exist, for the tool rule's own tests.
                && !n.contains("no-such")
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && name != "node_modules" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// Every tool the workspace's tests (and the product code they run) name, with the first
/// file naming it. The benchmark crate is left out: `scripts/bench.sh` is not the suite.
fn tools_in_tree() -> BTreeMap<String, PathBuf> {
    let mut files = Vec::new();
    rust_files(&root().join("crates"), &mut files);
    rust_files(&root().join("tests"), &mut files);
    let mut tools = BTreeMap::new();
    for file in files {
        // This file's own examples name no real tools.
        if file.components().any(|c| c.as_os_str() == "bench")
            || file.file_name().is_some_and(|n| n == "tool_list.rs")
        {
            continue;
        }
        let source = std::fs::read_to_string(&file).unwrap();
        for tool in tools_named(&source) {
            tools.entry(tool).or_insert_with(|| file.clone());
        }
    }
    tools
}

#[test]
fn every_tool_a_test_names_is_in_test_tools() {
    let script = std::fs::read_to_string(root().join("scripts/test.sh")).unwrap();
    let list = listed(&script);
    let missing: Vec<String> = tools_in_tree()
        .into_iter()
        .filter(|(tool, _)| !list.contains_key(tool))
        .map(|(tool, file)| format!("{tool} (named in {})", file.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "tools a test runs but scripts/test.sh's TEST_TOOLS does not install: {missing:?}"
    );
}

#[test]
fn the_scan_finds_each_way_a_test_names_a_tool() {
    let source = r#"
        fn tool(name: &str) -> Command { Command::new(name) }
        let a = Command::new("alpha").arg("not-a-tool");
        if !require("bravo") { return; }
        require_all(&["charlie", "delta"]);
        for (t, v) in [("echo-tool", "-V"), ("foxtrot", "--version")] {}
        tool("golf").arg("hotel");
        on_path("ferry-no-such-tool");
    "#;
    let found: Vec<String> = tools_named(source).into_iter().collect();
    assert_eq!(
        found,
        [
            "alpha",
            "bravo",
            "charlie",
            "delta",
            "echo-tool",
            "foxtrot",
            "golf"
        ]
    );
}

#[test]
fn every_listed_package_is_installed_by_the_script() {
    let script = std::fs::read_to_string(root().join("scripts/test.sh")).unwrap();
    let list = listed(&script);
    assert!(
        list.contains_key("tftp") && list["tftp"] == "tftp-hpa",
        "tftp comes from tftp-hpa: {list:?}"
    );
    // The packages come from TEST_TOOLS by the loop that fills APT_PACKAGES; the venv tools
    // by the functions that make their venvs; the guest's by the test OS's recipe.
    assert!(
        script.contains("for entry in \"${TEST_TOOLS[@]}\"")
            && script.contains("APT_PACKAGES+=(\"$pkg\")"),
        "scripts/test.sh no longer installs TEST_TOOLS' packages"
    );
    let recipe = std::fs::read_to_string(root().join("scripts/guest-root.sh")).unwrap();
    for (tool, pkg) in &list {
        match pkg.as_str() {
            "@venv" => assert!(
                script.contains(&format!("install_{}", venv_installer(tool))),
                "{tool}: no venv install step in scripts/test.sh"
            ),
            "@guest" => assert!(
                recipe.contains("initramfs-tools"),
                "{tool}: the test OS's recipe does not install it"
            ),
            p => assert!(
                !p.is_empty() && !p.contains(['/', ' ']),
                "{tool}: {p:?} is not a Debian package name"
            ),
        }
    }
}

/// The `install_…` function of scripts/test.sh that makes `tool`'s venv.
fn venv_installer(tool: &str) -> &str {
    match tool {
        "moto_server" => "moto",
        other => other,
    }
}

#[test]
fn under_ci_every_listed_tool_is_on_path() {
    if std::env::var("CI").as_deref() != Ok("true") {
        eprintln!("not under CI=true: the install step has not necessarily run; skipped");
        return;
    }
    let script = std::fs::read_to_string(root().join("scripts/test.sh")).unwrap();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let on_path = |tool: &str| std::env::split_paths(&path).any(|d| d.join(tool).is_file());
    let mut missing = Vec::new();
    for (tool, pkg) in listed(&script) {
        let ok = match pkg.as_str() {
            "@guest" => true,
            "@venv" => {
                let var = if tool == "moto_server" {
                    "FERRY_MOTO"
                } else {
                    "FERRY_SCHEMATHESIS"
                };
                std::env::var_os(var).is_some_and(|p| Path::new(&p).is_file())
            }
            _ => on_path(&tool),
        };
        if !ok {
            missing.push(format!("{tool} ({pkg})"));
        }
    }
    assert!(
        missing.is_empty(),
        "installed by scripts/test.sh but not found: {missing:?}"
    );
}
