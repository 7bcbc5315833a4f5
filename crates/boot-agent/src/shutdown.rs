//! A clean shutdown ends the machine's session (issue 31). systemd-shutdown runs
//! `/usr/lib/systemd/system-shutdown/ferry` (installed by `ferry target install-initramfs`)
//! once the root is read-only, every write done and flushed: it creates `shutdown` in the
//! agent's run directory and waits for `shutdown-done`. The agent, which keeps serving the
//! root until the power goes, ends its session at the farm and answers.
//!
//! The run directory is watched through a descriptor opened before `switch_root`: the
//! initramfs moves its `/run` under the new root, so from the agent's own root (still the
//! initramfs) the path no longer leads there, but the directory is the same.
//!
//! ```text
//!   hook: touch /run/ferry/shutdown ─► agent (polls the dir fd) ─► POST session/end
//!   hook: cat /run/ferry/shutdown-done ◄─ "ferry: session ended …" ◄─┘
//! ```

use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{AtFlags, Mode, OFlags};

/// How often the agent looks for the hook's word.
pub const POLL_EVERY: Duration = Duration::from_millis(250);
/// The file the hook creates.
pub const ASKED: &str = "shutdown";
/// The file the agent answers in (one line for the console).
pub const DONE: &str = "shutdown-done";

/// What ends the session: the farm's API URLs, its CA and the session's export name.
#[derive(Debug, Clone)]
pub struct SessionEnd {
    /// The farm API URLs, tried in turn.
    pub apis: Vec<String>,
    /// The farm's CA (PEM).
    pub ca: Option<String>,
    /// The session's export name at login (its credential).
    pub export_name: String,
    /// The agent's status, whose `export` is the session of now (a new one after a login
    /// again): that one is ended.
    pub feed: Option<std::sync::Arc<agent::report::StatusFeed>>,
}

/// Watches `run_dir` (opened now) on a thread of its own; on the hook's word, ends the
/// session (`end`, when the machine logged in to a farm) and answers.
///
/// # Errors
/// The directory cannot be opened.
pub fn watch(run_dir: &Path, end: Option<SessionEnd>) -> std::io::Result<()> {
    let dir = rustix::fs::open(
        run_dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    std::thread::Builder::new()
        .name("ferry-boot-shutdown".into())
        .spawn(move || {
            while !asked(&dir) {
                std::thread::sleep(POLL_EVERY);
            }
            let line = answer(end.as_ref());
            eprintln!("{line}");
            if let Err(e) = write_done(&dir, &line) {
                eprintln!("ferry-boot: could not answer the shutdown hook: {e}");
            }
        })?;
    Ok(())
}

fn asked(dir: &OwnedFd) -> bool {
    rustix::fs::statat(dir, ASKED, AtFlags::empty()).is_ok()
}

/// The line the console shows: what became of the session.
fn answer(end: Option<&SessionEnd>) -> String {
    match end {
        None => "ferry: shutting down (no farm session to end)".to_string(),
        Some(e) => match agent::report::end_session(&e.apis, e.ca.as_deref(), &current(e)) {
            Ok(api) => format!("ferry: session ended at the farm ({api}): the machine is off"),
            Err(why) => format!(
                "ferry: the session could not be ended at the farm ({why}); it ends when it \
                 has been silent for 2 minutes"
            ),
        },
    }
}

/// The session's export name now: the agent's, else the one of its login.
fn current(e: &SessionEnd) -> String {
    e.feed
        .as_ref()
        .and_then(|f| f.read())
        .and_then(|v| v["export"].as_str().map(str::to_string))
        .filter(|x| x.starts_with("ferry-s-"))
        .unwrap_or_else(|| e.export_name.clone())
}

fn write_done(dir: &OwnedFd, line: &str) -> std::io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        DONE,
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut f = std::fs::File::from(fd);
    f.write_all(format!("{line}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_s_word_is_seen_through_the_directory_and_answered() {
        let tmp = tempfile::tempdir().unwrap();
        watch(tmp.path(), None).unwrap();
        std::fs::write(tmp.path().join(ASKED), b"").unwrap();
        let done = tmp.path().join(DONE);
        for _ in 0..200 {
            if done.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let text = std::fs::read_to_string(&done).unwrap();
        assert!(text.contains("no farm session"), "{text}");
    }

    #[test]
    fn a_farm_that_cannot_be_reached_is_said_on_the_console() {
        let e = SessionEnd {
            apis: vec!["not a url".into()],
            ca: None,
            export_name: "ferry-s-00112233445566778899aabbccddeeff".into(),
            feed: None,
        };
        let line = answer(Some(&e));
        assert!(
            line.contains("could not be ended") && line.contains("not a url"),
            "{line}"
        );
    }
}
