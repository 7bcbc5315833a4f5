//! Limits that protect the server from its clients rather than from one request: log lines
//! per second per kind ([`LogLimiter`]) and the length of a client's string in a log line
//! ([`clip`]). Connections per listener and per address are the `budget` crate's `Gate`.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The most bytes of a client-sent string (an export name) a log line shows.
pub const CLIENT_STRING_LOG_MAX: usize = 256;
/// Log lines of one kind (refusals, protocol errors, capacity) written per [`LOG_WINDOW`];
/// the rest are counted and reported as one "suppressed" line, written with the kind's next
/// line after the window.
pub const LOG_LINES_PER_WINDOW: u32 = 10;
/// The window of [`LOG_LINES_PER_WINDOW`].
pub const LOG_WINDOW: Duration = Duration::from_secs(1);

/// A client's string as a log field: quoted, cut to [`CLIENT_STRING_LOG_MAX`] bytes (at a
/// character boundary) with its full length when longer.
pub fn clip(s: &str) -> Clipped<'_> {
    Clipped(s)
}

/// See [`clip`].
#[derive(Debug, Clone, Copy)]
pub struct Clipped<'a>(&'a str);

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if s.len() <= CLIENT_STRING_LOG_MAX {
            return write!(f, "{s:?}");
        }
        let mut end = CLIENT_STRING_LOG_MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{:?}... ({} bytes)", &s[..end], s.len())
    }
}

/// What a rate-limited log line is about; each kind has its own budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogKind {
    /// An export refused, a connection closed over an unopenable export.
    Refused,
    /// A client broke the protocol or timed out.
    Protocol,
}

impl LogKind {
    const ALL: usize = 2;

    fn index(self) -> usize {
        match self {
            LogKind::Refused => 0,
            LogKind::Protocol => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            LogKind::Refused => "refused",
            LogKind::Protocol => "protocol",
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Window {
    start: Option<Instant>,
    lines: u32,
    suppressed: u64,
}

/// Allows at most [`LOG_LINES_PER_WINDOW`] lines of each kind per [`LOG_WINDOW`]. The first
/// line of a window after one that suppressed some is preceded by a line saying how many
/// (a burst's count is reported when the next line of its kind comes).
#[derive(Debug, Default)]
pub(crate) struct LogLimiter {
    windows: Mutex<[Window; LogKind::ALL]>,
}

impl LogLimiter {
    /// Whether a line of `kind` may be written now.
    pub(crate) fn allow(&self, kind: LogKind) -> bool {
        let (ok, suppressed) = self.allow_at(kind, Instant::now());
        if suppressed > 0 {
            tracing::warn!(
                kind = kind.name(),
                suppressed,
                "suppressed {suppressed} log lines of this kind in the last window"
            );
        }
        ok
    }

    /// Whether a line may be written at `now`, and how many the window that just ended
    /// suppressed (to report).
    fn allow_at(&self, kind: LogKind, now: Instant) -> (bool, u64) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let w = &mut windows[kind.index()];
        let mut ended = 0;
        if w.start.is_none_or(|s| now.duration_since(s) >= LOG_WINDOW) {
            ended = w.suppressed;
            *w = Window {
                start: Some(now),
                ..Window::default()
            };
        }
        if w.lines < LOG_LINES_PER_WINDOW {
            w.lines += 1;
            (true, ended)
        } else {
            w.suppressed += 1;
            (false, ended)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_cuts_long_strings_and_says_how_long() {
        assert_eq!(clip("disk").to_string(), "\"disk\"");
        let long = "é".repeat(3000);
        let shown = clip(&long).to_string();
        assert!(shown.len() < CLIENT_STRING_LOG_MAX + 40, "{}", shown.len());
        assert!(shown.ends_with("(6000 bytes)"), "{shown}");
    }

    #[test]
    fn limiter_allows_a_window_budget_then_reports_the_rest() {
        let l = LogLimiter::default();
        let t0 = Instant::now();
        let allowed = (0..100)
            .filter(|_| l.allow_at(LogKind::Refused, t0).0)
            .count();
        assert_eq!(allowed, LOG_LINES_PER_WINDOW as usize);
        // Another kind has its own budget.
        assert!(l.allow_at(LogKind::Protocol, t0).0);
        let (ok, suppressed) = l.allow_at(LogKind::Refused, t0 + LOG_WINDOW);
        assert!(ok);
        assert_eq!(suppressed, 100 - u64::from(LOG_LINES_PER_WINDOW));
    }
}
