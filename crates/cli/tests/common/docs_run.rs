//! Docs that run (issue 31): a page's command block marked `<!-- docs-run: NAME -->` is
//! extracted and run as written by `bash -euo pipefail`, with `ferry` on PATH and only its
//! placeholders swapped (a scratch directory for `/srv/ferry`, free ports for the
//! documented ones), so a page that stops working fails the suite.

use std::path::Path;
use std::process::{Command, Output};

/// The docs directory.
pub fn docs() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs")
}

/// The fenced block right after `<!-- docs-run: NAME -->` in `page`.
pub fn block(page: &str, name: &str) -> String {
    let mark = format!("<!-- docs-run: {name} -->");
    let at = page
        .find(&mark)
        .unwrap_or_else(|| panic!("no {mark} on the page"));
    let rest = &page[at + mark.len()..];
    let open = rest.find("```").expect("a fenced block after the mark");
    let body = &rest[open..];
    let body = &body[body.find('\n').expect("a fence line") + 1..];
    let close = body.find("\n```").expect("the block is closed");
    body[..=close].to_string()
}

/// Runs `script` with each `(placeholder, value)` of `swap` replaced, in `dir`, with the
/// tested `ferry` first on PATH and `env` set; background jobs are stopped at its end.
pub fn run(script: &str, swap: &[(&str, String)], dir: &Path, env: &[(&str, String)]) -> Output {
    let mut text = script.to_string();
    for (from, to) in swap {
        text = text.replace(from, to);
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_ferry")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let full = format!("trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\nset -x\n{text}");
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &full])
        .current_dir(dir)
        .env("PATH", path);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run bash")
}
