//! Running the external tools the harness drives, with their output kept for the error.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::GuestError;

/// Bytes of a failed tool's stderr (its end) kept in the error.
pub(crate) const STDERR_KEPT: usize = 4000;

/// Runs `cmd` to completion; its stdout on success, [`GuestError::Tool`] otherwise.
pub(crate) fn run(cmd: &mut Command) -> Result<String, GuestError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| GuestError::Spawn {
            cmd: shown.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail_start = stderr.len().saturating_sub(STDERR_KEPT);
    let tail_start = (tail_start..stderr.len())
        .find(|&i| stderr.is_char_boundary(i))
        .unwrap_or(stderr.len());
    Err(GuestError::Tool {
        cmd: shown,
        status: out.status.to_string(),
        stderr: stderr[tail_start..].to_owned(),
    })
}

/// Whether `tool` is an executable on PATH (or an executable path).
pub fn on_path(tool: &str) -> bool {
    if tool.contains('/') {
        return Path::new(tool).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_tool_reports_its_stderr() {
        let err = run(Command::new("sh").args(["-c", "echo nope >&2; exit 3"])).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("nope") && text.contains('3'), "{text}");
    }

    #[test]
    fn succeeding_tool_returns_stdout() {
        assert_eq!(
            run(Command::new("sh").args(["-c", "echo yes"])).unwrap(),
            "yes\n"
        );
    }

    #[test]
    fn sh_is_on_path_and_nonsense_is_not() {
        assert!(on_path("sh"));
        assert!(!on_path("ferry-no-such-tool-xyz"));
    }
}
