//! The connections open on each session export, so that a session that ends (ended by an
//! administrator, replaced by its device's next login, expired, or gone from the farm
//! database) closes them: a session's end is the end of what it granted, not only of new
//! opens.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

/// Open session connections by session export name, each by a connection number.
#[derive(Debug, Default)]
pub struct OpenSessions {
    by_name: Mutex<HashMap<String, HashMap<u64, CancellationToken>>>,
    next: AtomicU64,
}

/// One tracked connection; dropping it (the export's release) forgets it.
#[derive(Debug)]
pub struct Tracked {
    sessions: Arc<OpenSessions>,
    name: String,
    id: u64,
    token: CancellationToken,
}

impl Tracked {
    /// The token the connection ends on.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut map = self.sessions.lock();
        if let Some(conns) = map.get_mut(&self.name) {
            conns.remove(&self.id);
            if conns.is_empty() {
                map.remove(&self.name);
            }
        }
    }
}

impl OpenSessions {
    /// Records a connection on the session `name`.
    pub fn track(self: &Arc<Self>, name: &str) -> Tracked {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.lock()
            .entry(name.to_string())
            .or_default()
            .insert(id, token.clone());
        Tracked {
            sessions: Arc::clone(self),
            name: name.to_string(),
            id,
            token,
        }
    }

    /// Ends every connection open on the session `name`; returns how many.
    pub fn revoke(&self, name: &str) -> usize {
        let conns = self.lock().remove(name).unwrap_or_default();
        for t in conns.values() {
            t.cancel();
        }
        conns.len()
    }

    /// The session names with open connections.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<u64, CancellationToken>>> {
        self.by_name.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoking_a_session_cancels_its_connections_only() {
        let s = Arc::new(OpenSessions::default());
        let a1 = s.track("ferry-s-a");
        let a2 = s.track("ferry-s-a");
        let b = s.track("ferry-s-b");
        assert_eq!(s.revoke("ferry-s-a"), 2);
        assert!(a1.token().is_cancelled() && a2.token().is_cancelled());
        assert!(!b.token().is_cancelled());
        assert_eq!(s.names(), ["ferry-s-b"]);
        drop(b);
        assert!(s.names().is_empty());
        assert_eq!(s.revoke("ferry-s-a"), 0);
    }
}
