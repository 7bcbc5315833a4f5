//! The failover list a farm refreshes (issue 20): the status reporter offers the farm's
//! newest order of the device's servers ([`ServerRefresh`]), and the next failover of
//! [`crate::remote::Remote`] takes it ([`refreshed_order`]), so a device learns servers
//! that joined or returned since its login without logging in again.

use parking_lot::Mutex;

/// The most servers a refreshed list may hold (a longer one is ignored).
pub const REFRESHED_SERVERS_MAX: usize = 256;

/// A newer server list for a [`Remote`], offered by the status reporter and taken by the
/// next failover.
#[derive(Debug, Default)]
pub struct ServerRefresh(Mutex<Option<Vec<String>>>);

impl ServerRefresh {
    /// Offers `servers` (failover order): an empty list, or one longer than
    /// [`REFRESHED_SERVERS_MAX`], is ignored.
    pub fn offer(&self, servers: Vec<String>) {
        if !servers.is_empty() && servers.len() <= REFRESHED_SERVERS_MAX {
            *self.0.lock() = Some(servers);
        }
    }

    /// The list offered last, if not taken yet.
    pub fn take(&self) -> Option<Vec<String>> {
        self.0.lock().take()
    }
}

/// The failover order after a refresh: `offered` in its order, without `current`, then
/// `current` (tried last: it is the server being left), with duplicates dropped.
pub fn refreshed_order(offered: Vec<String>, current: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(offered.len() + 1);
    for s in offered {
        if s != current && !out.contains(&s) {
            out.push(s);
        }
    }
    out.push(current.to_string());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refreshed_list_keeps_the_farm_s_order_and_leaves_the_current_server_last() {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            refreshed_order(v(&["c:1", "a:1", "b:1", "c:1"]), "a:1"),
            v(&["c:1", "b:1", "a:1"])
        );
        assert_eq!(refreshed_order(v(&["d:1"]), "a:1"), v(&["d:1", "a:1"]));
        let r = ServerRefresh::default();
        r.offer(Vec::new());
        assert_eq!(r.take(), None, "an empty list is ignored");
        r.offer(vec!["x:1".to_string(); REFRESHED_SERVERS_MAX + 1]);
        assert_eq!(r.take(), None, "an overlong list is ignored");
        r.offer(v(&["a:1"]));
        assert_eq!(r.take(), Some(v(&["a:1"])));
        assert_eq!(r.take(), None, "taken once");
    }
}
