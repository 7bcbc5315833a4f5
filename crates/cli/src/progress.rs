//! Progress bars on stderr for long operations, behind [`disk::ops::Progress`].
//!
//! A bar draws only when stderr is a terminal and `--quiet` was not given, so scripts, CI logs
//! and `--json` consumers see nothing of it. The library reports bytes; the bar shows bytes,
//! rate and time left, and the library's phase name ("copying", "verifying") as its message.

use std::io::IsTerminal;
use std::time::Duration;

use disk::ops::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a spinner redraws while the library is busy without reporting.
const SPINNER_TICK: Duration = Duration::from_millis(120);

/// A progress bar (or spinner) on stderr, hidden when it should not draw.
#[derive(Debug)]
pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    /// A byte-counting bar with `label` as its first message. Its length comes from the
    /// library's [`Progress::set_total`].
    pub fn new(quiet: bool, label: &str) -> Bar {
        let bar = if visible(quiet) {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{msg:>10} [{wide_bar:.cyan/blue}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar
        } else {
            ProgressBar::hidden()
        };
        bar.set_message(label.to_string());
        Bar { bar }
    }

    /// A spinner for work that reports no byte counts (for instance `check`).
    pub fn spinner(quiet: bool, label: &str) -> Bar {
        let bar = if visible(quiet) {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.enable_steady_tick(SPINNER_TICK);
            bar
        } else {
            ProgressBar::hidden()
        };
        bar.set_message(label.to_string());
        Bar { bar }
    }

    /// Removes the bar from the terminal, so that a summary printed next stands alone.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        // An error path returns early; never leave a half-drawn bar above the error message.
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}

impl Progress for Bar {
    fn set_total(&self, bytes: u64) {
        // A new total starts a new count (a "verifying" pass after "copying").
        self.bar.set_length(bytes);
        self.bar.set_position(0);
    }

    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    fn phase(&self, name: &str) {
        self.bar.set_message(name.to_string());
    }
}

fn visible(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}
