//! Nonsense flag values are refused by the argument parser with a message naming the flag
//! and the rule (a usage error, nothing started): zero RAM, zero sizes, zero timeouts. And
//! the CLI reference (docs/cli.md) names every flag the parser shows.

use std::process::Command;

/// Runs `ferry ARGS` and returns (exit code, stderr).
fn ferry(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts `args` is refused as a usage error whose message names `flag` and holds `why`.
fn refused(args: &[&str], flag: &str, why: &str) {
    let (code, err) = ferry(args);
    assert!(
        code.is_some_and(|c| c != 0) && err.starts_with("error: invalid value"),
        "{args:?} was not refused by the parser: {err}"
    );
    assert!(
        err.contains(flag) && err.contains(why),
        "{args:?}: the error lacks {flag:?} or {why:?}: {err}"
    );
}

const TARGET: [&str; 5] = ["target", "--server", "127.0.0.1:1", "--vdisk", "golden"];

#[test]
fn target_refuses_zero_ram_sizes_and_timeouts() {
    for (flag, value, why) in [
        ("--ram", "0", "cannot be zero"),
        ("--ram", "0G", "cannot be zero"),
        ("--overflow-max", "0", "cannot be zero"),
        ("--boot-bytes", "0", "cannot be zero"),
        ("--timeout", "0", "at least 1 second"),
        ("--failover-timeout", "0", "at least 1 second"),
        ("--timeout", "soon", "not a whole number"),
    ] {
        let mut args = TARGET.to_vec();
        args.extend([flag, value]);
        refused(&args, flag, why);
    }
}

#[test]
fn server_and_farm_commands_refuse_zero_sizes() {
    refused(
        &["server", "--store", "/nonexistent", "--cache-ram", "0"],
        "--cache-ram",
        "cannot be zero",
    );
    refused(
        &[
            "farm", "vdisk", "add", "golden", "--store", "1", "--size", "0",
        ],
        "--size",
        "cannot be zero",
    );
    refused(
        &[
            "farm",
            "vdisk",
            "add",
            "golden",
            "--store",
            "1",
            "--ram-bytes",
            "0",
        ],
        "--ram-bytes",
        "0 is not in 1..",
    );
    refused(
        &["device", "set", "1", "--ram-bytes", "0"],
        "--ram-bytes",
        "0 is not in 1..",
    );
}

/// `ferry PATH --help`'s text.
fn help(path: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(path)
        .arg("--help")
        .output()
        .expect("run ferry --help");
    assert!(out.status.success(), "ferry {path:?} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands a help text lists (its `Commands:` section), `help` left out.
fn subcommands(text: &str) -> Vec<String> {
    let Some(at) = text.find("\nCommands:\n") else {
        return Vec::new();
    };
    text[at + "\nCommands:\n".len()..]
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// The long flags a help text lists in its option sections (`--help`, `--version` left out):
/// read from each option line's flag part (`-s, --store <DIR>`, before the description).
fn long_flags(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    for line in text.lines() {
        let spec = line.trim_start();
        if !spec.starts_with('-') {
            continue;
        }
        let spec = spec.split("  ").next().unwrap_or_default();
        for word in spec.split(|c: char| c.is_whitespace() || c == ',' || c == '=') {
            let name: String = word
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if name.starts_with("--")
                && name.len() > 2
                && !["--help", "--version"].contains(&name.as_str())
                && !flags.contains(&name)
            {
                flags.push(name);
            }
        }
    }
    flags
}

/// The text of docs/cli.md's section for `path`: the `## ferry …` heading of the longest
/// prefix of `path` that has one (its `###` parts included), else the whole page.
fn doc_section<'a>(doc: &'a str, path: &[String]) -> &'a str {
    for n in (1..=path.len()).rev() {
        let heading = format!("\n## ferry {}\n", path[..n].join(" "));
        if let Some(at) = doc.find(&heading) {
            let body = &doc[at + 1..];
            let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
            return &body[..end];
        }
    }
    doc
}

/// Issue 31: docs/cli.md left out flags (`ferry server --db --site --server-name …`,
/// `ferry target --state-dir`). Every long flag clap shows for every command (read from
/// the binary's own `--help`, recursively) is in the reference: in the command's section
/// when it has one, else somewhere on the page. Hidden flags (`hide`) are not shown, so not
/// asked for.
#[test]
fn every_flag_clap_shows_is_in_the_cli_reference() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md"),
    )
    .unwrap();
    // The global options (`ferry --help`'s own) are documented once, in GLOBAL OPTIONS.
    let global_at = doc
        .find("\n## GLOBAL OPTIONS\n")
        .expect("a GLOBAL OPTIONS section");
    let global_doc = &doc[global_at..global_at + 1 + doc[global_at + 1..].find("\n## ").unwrap()];
    let global = long_flags(&help(&[]));
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    let mut missing = Vec::new();
    let mut commands = 0;
    while let Some(path) = todo.pop() {
        let text = help(&path);
        commands += 1;
        let section = doc_section(&doc, &path);
        for flag in long_flags(&text) {
            let documented = if global.contains(&flag) {
                global_doc.contains(&flag)
            } else {
                section.contains(&flag)
            };
            if !documented {
                missing.push(format!("ferry {} {flag}", path.join(" ")));
            }
        }
        for sub in subcommands(&text) {
            let mut next = path.clone();
            next.push(sub);
            todo.push(next);
        }
    }
    assert!(
        commands > 30,
        "only {commands} commands found: is the help's shape read right?"
    );
    assert!(
        missing.is_empty(),
        "docs/cli.md does not name these flags (in the command's section):\n{}",
        missing.join("\n")
    );
}
