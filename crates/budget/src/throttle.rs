//! A log line a client can trigger is written at most once per [`LOG_WINDOW`]; the lines
//! in between are counted, and the next line written says how many were suppressed.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The least time between two log lines of one kind a client can trigger.
pub const LOG_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

/// One rate-limited kind of log line. Time is the caller's `now`.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<State>,
}

impl Throttle {
    /// `Some(suppressed)` when a line may be written at `now` (with how many were not
    /// since the last one), `None` when it is to be suppressed.
    pub(crate) fn allow(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.last
            .is_some_and(|l| now.saturating_duration_since(l) < LOG_WINDOW)
        {
            s.suppressed += 1;
            return None;
        }
        s.last = Some(now);
        Some(std::mem::take(&mut s.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_window_then_the_count_of_the_rest() {
        let t = Throttle::default();
        let t0 = Instant::now();
        assert_eq!(t.allow(t0), Some(0));
        assert_eq!(t.allow(t0 + Duration::from_millis(10)), None);
        assert_eq!(t.allow(t0 + Duration::from_millis(20)), None);
        assert_eq!(t.allow(t0 + LOG_WINDOW), Some(2));
    }
}
