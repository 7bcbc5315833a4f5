//! The failover list a farm refreshes (issue 20): the status reporter offers the farm's
//! newest order of the device's servers ([`ServerRefresh`]), and the next failover of
//! [`crate::remote::Remote`] takes it ([`refreshed_order`]), so a device learns servers
//! that joined or returned since its login without logging in again.

use parking_lot::Mutex;

/// The most servers a refreshed list may hold (a longer one is ignored).
pub const REFRESHED_SERVERS_MAX: usize = 256;

/// One server of a refreshed list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    /// Its NBD address (`host:port`).
    pub address: String,
    /// True when the farm has it live and not draining: a place to move to.
    pub serving: bool,
}

/// A newer server list for a [`crate::remote::Remote`], offered by the status reporter
/// and taken by the next failover.
#[derive(Debug, Default)]
pub struct ServerRefresh(Mutex<Option<Vec<Offered>>>);

impl ServerRefresh {
    /// Offers `servers` in the farm's order: an empty list, or one longer than
    /// [`REFRESHED_SERVERS_MAX`], is ignored.
    pub fn offer(&self, servers: Vec<Offered>) {
        if !servers.is_empty() && servers.len() <= REFRESHED_SERVERS_MAX {
            *self.0.lock() = Some(servers);
        }
    }

    /// The list offered last, if not taken yet.
    pub fn take(&self) -> Option<Vec<Offered>> {
        self.0.lock().take()
    }
}

/// The failover order after a refresh, leaving `current` (the server that closed the
/// connection or was lost): the serving servers other than `current` in the farm's order
/// (least loaded first), then `current`, then the draining and silent ones in the farm's
/// order; duplicates dropped. So a device moved away by rebalancing goes to the least
/// loaded server and never to a draining one while another serves.
pub fn refreshed_order(offered: Vec<Offered>, current: &str) -> Vec<String> {
    let mut serving: Vec<String> = Vec::with_capacity(offered.len() + 1);
    let mut rest: Vec<String> = Vec::new();
    for o in offered {
        if o.address == current || serving.contains(&o.address) || rest.contains(&o.address) {
            continue;
        }
        if o.serving {
            serving.push(o.address);
        } else {
            rest.push(o.address);
        }
    }
    serving.push(current.to_string());
    serving.extend(rest);
    serving
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(address: &str, serving: bool) -> Offered {
        Offered {
            address: address.to_string(),
            serving,
        }
    }

    #[test]
    fn serving_servers_first_then_the_one_left_then_draining_and_silent_ones() {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            refreshed_order(
                vec![
                    o("c:1", true),
                    o("a:1", true),
                    o("b:1", true),
                    o("c:1", true),
                    o("d:1", false),
                ],
                "a:1"
            ),
            v(&["c:1", "b:1", "a:1", "d:1"])
        );
        // A rebalanced device never picks a draining server over its own.
        assert_eq!(
            refreshed_order(vec![o("dead:1", true), o("drain:1", false)], "me:1"),
            v(&["dead:1", "me:1", "drain:1"])
        );
        let r = ServerRefresh::default();
        r.offer(Vec::new());
        assert_eq!(r.take(), None, "an empty list is ignored");
        r.offer(vec![o("x:1", true); REFRESHED_SERVERS_MAX + 1]);
        assert_eq!(r.take(), None, "an overlong list is ignored");
        r.offer(vec![o("a:1", true)]);
        assert_eq!(r.take(), Some(vec![o("a:1", true)]));
        assert_eq!(r.take(), None, "taken once");
    }
}
