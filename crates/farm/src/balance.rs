//! Load balancing at login (issue 20): which servers a device is told, in which order.
//!
//! A device fails over down its list without a new login, so the order is the whole
//! decision: the live servers of its site that are not draining first, the least loaded
//! first (a server's load is the live sessions it carries divided by its rating), then the
//! draining ones, then those that stopped heartbeating. A session's server is the one its
//! login named first, and after a failover the one its status reports name, so the counts
//! follow the devices without a new login, and a storm of logins spreads as it arrives
//! (each login's assignment is counted by the next).
//!
//! ```text
//!   login ──► site_servers ──► order(servers, live sessions per server) ──► grant.servers
//!         └─► sessions.server_id = grant.servers[0]     status report ─► note_session_server
//! ```
//!
//! The ordering is the pure [`order`]; the rest reads and writes the farm database.

use std::cmp::Ordering;
use std::sync::PoisonError;

use contract::login::LoginServer;
use serde_json::json;

use crate::Farm;
use crate::db::audit;
use crate::error::{FarmError, Result};
use crate::input::ServerPatch;
use crate::model::{Flag, SERVER_ALIVE_MS, Server};

pub use crate::model::{DEFAULT_RATING, RATING_MAX};

/// How long [`Farm::device_servers`] reuses a site's order.
pub const ORDER_REUSE_MS: i64 = 1_000;
/// The most sites whose order is kept for reuse (past it the cache starts over).
pub const ORDER_CACHE_SITES_MAX: usize = 4_096;

/// The columns of `servers` a [`Server`] is read from.
pub(crate) const SERVER_COLUMNS: &str =
    "id, site_id, name, address, registered_at_ms, heartbeat_at_ms, rating, draining, api_url";

/// How a session's server is named: by login (its name) or by a status report (its id, or
/// the address login gave the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionServer<'a> {
    /// The server's id.
    Id(i64),
    /// Its name.
    Name(&'a str),
    /// Its registered NBD address.
    Address(&'a str),
}

/// One server as [`order`] weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The server.
    pub server: Server,
    /// Live sessions it carries.
    pub sessions: i64,
}

impl Candidate {
    fn alive(&self, now_ms: i64) -> bool {
        now_ms.saturating_sub(self.server.heartbeat_at_ms) <= SERVER_ALIVE_MS
    }

    /// Its class: 0 live and serving, 1 live and draining, 2 not heartbeating.
    fn class(&self, now_ms: i64) -> u8 {
        match (self.alive(now_ms), self.server.draining.0) {
            (true, false) => 0,
            (true, true) => 1,
            (false, _) => 2,
        }
    }
}

/// Compares the loads `a.sessions / a.rating` and `b.sessions / b.rating` exactly (cross
/// multiplication in 128 bits: no rounding, no overflow).
fn load_cmp(a: &Candidate, b: &Candidate) -> Ordering {
    (i128::from(a.sessions) * rating(b)).cmp(&(i128::from(b.sessions) * rating(a)))
}

/// The servers in the order a device is told them: live and serving, least loaded first
/// (ties: the higher rating, then the lower id); then live and draining, the same way; then
/// the ones that stopped heartbeating, the most recent heartbeat first.
pub fn order(mut servers: Vec<Candidate>, now_ms: i64) -> Vec<LoginServer> {
    servers.sort_by(|a, b| {
        let (ca, cb) = (a.class(now_ms), b.class(now_ms));
        ca.cmp(&cb).then_with(|| {
            if ca == 2 {
                b.server
                    .heartbeat_at_ms
                    .cmp(&a.server.heartbeat_at_ms)
                    .then(a.server.id.cmp(&b.server.id))
            } else {
                load_cmp(a, b)
                    .then(b.server.rating.cmp(&a.server.rating))
                    .then(a.server.id.cmp(&b.server.id))
            }
        })
    });
    servers
        .into_iter()
        .map(|c| LoginServer {
            alive: c.alive(now_ms),
            draining: c.server.draining.0,
            name: c.server.name,
            address: c.server.address,
        })
        .collect()
}

/// [`order`] as device `device_id`'s status report is told it: the live, serving servers
/// below their share (by rating) lead, one of them drawn for this device in proportion to
/// how far below its share each is (a fixed draw per device, from its id). A device moved by
/// rebalancing leaves for the first serving server of its list other than its own, so the
/// devices one check moves spread over every server below its share in proportion to its
/// room, ties included, instead of all going to the one that sorts first and overshooting
/// it. With none below its share, one of the least loaded is drawn the same way.
pub fn order_for_device(servers: Vec<Candidate>, now_ms: i64, device_id: i64) -> Vec<LoginServer> {
    let serving: Vec<&Candidate> = servers.iter().filter(|c| c.class(now_ms) == 0).collect();
    let total: i128 = serving.iter().map(|c| i128::from(c.sessions.max(0))).sum();
    let ratings: i128 = serving.iter().map(|c| rating(c)).sum();
    // Room below the share, in units of 1 / Σ ratings of a session: exact integers.
    let room = |c: &Candidate| (total * rating(c) - i128::from(c.sessions.max(0)) * ratings).max(0);
    let draw = u128::from(spread_hash(device_id));
    let rooms: i128 = serving.iter().map(|c| room(c)).sum();
    let chosen = if rooms > 0 {
        let mut at = i128::try_from(draw % rooms.unsigned_abs()).unwrap_or(0);
        serving.iter().find(|c| {
            at -= room(c);
            at < 0
        })
    } else {
        let least: Vec<&&Candidate> = serving
            .iter()
            .filter(|c| serving.iter().all(|o| load_cmp(c, o) != Ordering::Greater))
            .collect();
        let pick = usize::try_from(draw % (least.len().max(1) as u128)).unwrap_or(0);
        least.get(pick).copied()
    }
    .map(|c| c.server.name.clone());
    let mut list = order(servers, now_ms);
    if let Some(name) = chosen
        && let Some(at) = list.iter().position(|s| s.name == name)
    {
        let first = list.remove(at);
        list.insert(0, first);
    }
    list
}

/// A fixed, well-mixed draw for a device (SplitMix64's finalizer of its id).
fn spread_hash(device_id: i64) -> u64 {
    let mut z = (device_id as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How recent a server's heartbeat must be for rebalancing to count it as serving: two
/// heartbeats (every 10 s), not login's minute, so that a server killed a moment ago is not
/// taken for an empty one that devices should move to. With a settling time longer than
/// this (`ferry server`'s 25 s), an excess that only a dead server's place made never moves
/// a device.
pub const REBALANCE_ALIVE_MS: i64 = 20_000;

/// How far above its fair share a server may carry sessions before it moves some: 10 %, and
/// at least one session, so that rounding and a device in flight never trigger moves.
pub const REBALANCE_TOLERANCE_PERCENT: i64 = 10;

/// How many of server `me`'s sessions to move so that the live, serving servers of its site
/// carry sessions in proportion to their ratings (0 when it is within
/// [`REBALANCE_TOLERANCE_PERCENT`] of its share, is draining or has not heartbeat within
/// [`REBALANCE_ALIVE_MS`] (a drain moves everything anyway), or is the only serving
/// server).
///
/// Its share is `ceil(total × rating / Σ ratings)` over the serving servers; when it
/// carries more than that plus the tolerance, it moves down to the share. Moved devices
/// go to the least loaded servers of their (refreshed) lists, which are the ones below
/// their share: a server that joins or returns fills up without a reconnect storm, each
/// overloaded server giving only its own excess.
pub fn excess(me: i64, servers: &[Candidate], now_ms: i64) -> usize {
    let shares = Shares::of(servers, now_ms);
    let Some(mine) = shares.serving.iter().find(|c| c.server.id == me) else {
        return 0;
    };
    if shares.serving.len() < 2 {
        return 0;
    }
    let share = shares.share(mine);
    let tolerance = (share * i128::from(REBALANCE_TOLERANCE_PERCENT) / 100).max(1);
    let carried = i128::from(mine.sessions.max(0));
    if carried <= share + tolerance {
        return 0;
    }
    debug_assert!(carried > share);
    usize::try_from(carried - share).unwrap_or(usize::MAX)
}

/// The servers rebalancing counts as serving (heartbeating within [`REBALANCE_ALIVE_MS`],
/// not draining), and what their shares are computed from: [`excess`] and
/// `moves::rooms` share it.
pub(crate) struct Shares<'a> {
    /// The serving servers.
    pub(crate) serving: Vec<&'a Candidate>,
    total: i128,
    ratings: i128,
}

impl<'a> Shares<'a> {
    /// The serving servers of `servers` at `now_ms`, with their sessions and ratings summed.
    pub(crate) fn of(servers: &'a [Candidate], now_ms: i64) -> Shares<'a> {
        let serving: Vec<&Candidate> = servers
            .iter()
            .filter(|c| {
                !c.server.draining.0
                    && now_ms.saturating_sub(c.server.heartbeat_at_ms) <= REBALANCE_ALIVE_MS
            })
            .collect();
        let total = serving.iter().map(|c| i128::from(c.sessions.max(0))).sum();
        let ratings = serving.iter().map(|c| rating(c)).sum();
        Shares {
            serving,
            total,
            ratings,
        }
    }

    /// `c`'s share: `ceil(total × rating / Σ ratings)` (0 with no serving server).
    pub(crate) fn share(&self, c: &Candidate) -> i128 {
        if self.ratings == 0 {
            return 0;
        }
        (self.total * rating(c) + self.ratings - 1) / self.ratings
    }
}

/// A server's rating within 1..=[`RATING_MAX`], as balancing weighs it.
fn rating(c: &Candidate) -> i128 {
    i128::from(c.server.rating.clamp(1, RATING_MAX))
}

impl Farm {
    /// The servers of a collection's site in the order its devices are told them
    /// ([`order`]).
    ///
    /// # Errors
    /// Database errors; [`crate::Kind::NotFound`] for an unknown collection.
    pub(crate) async fn site_servers(&self, collection_id: i64) -> Result<Vec<LoginServer>> {
        let db = self.site_servers_db(collection_id);
        self.or_snapshot(db, |s| s.site_servers(collection_id))
            .await
    }

    pub(crate) async fn site_servers_db(&self, collection_id: i64) -> Result<Vec<LoginServer>> {
        let site = self.collection(collection_id).await?.site_id;
        let candidates = self.site_candidates(site).await?;
        Ok(order(candidates, self.now_ms()))
    }

    /// The servers of a collection's site with their live session counts.
    pub(crate) async fn site_candidates(&self, site: i64) -> Result<Vec<Candidate>> {
        let servers: Vec<Server> = sqlx::query_as(&format!(
            "SELECT {SERVER_COLUMNS} FROM servers WHERE site_id = $1 ORDER BY id"
        ))
        .bind(site)
        .fetch_all(&self.pool)
        .await?;
        let counts = self.sessions_per_server().await?;
        Ok(servers
            .into_iter()
            .map(|server| Candidate {
                sessions: counts
                    .iter()
                    .find(|(id, _)| *id == server.id)
                    .map_or(0, |(_, n)| *n),
                server,
            })
            .collect())
    }

    /// How many of its sessions server `id` should move now ([`excess`] over its site).
    ///
    /// # Errors
    /// Database errors; [`crate::Kind::NotFound`] for an unknown server.
    pub async fn rebalance_excess(&self, id: i64) -> Result<usize> {
        let site = self.server(id).await?.site_id;
        let candidates = self.site_candidates(site).await?;
        Ok(excess(id, &candidates, self.now_ms()))
    }

    /// The servers a device's status report is told ([`order_for_device`]), so that a
    /// device learns servers that joined since its login and fails over (or is moved) to
    /// one below its share. Within [`ORDER_REUSE_MS`] a site's servers and counts are
    /// reused: a thousand devices refreshing their lists cost one count, not a thousand
    /// (logins never reuse them: each login must be counted by the next).
    ///
    /// # Errors
    /// Database errors; [`crate::Kind::NotFound`] for an unknown device.
    pub async fn device_servers(&self, device_id: i64) -> Result<Vec<LoginServer>> {
        Ok(self.device_servers_with_ids(device_id).await?.0)
    }

    /// [`Farm::device_servers`] with each server's id, in the list's order.
    pub(crate) async fn device_servers_with_ids(
        &self,
        device_id: i64,
    ) -> Result<(Vec<LoginServer>, Vec<i64>)> {
        let collection = self.device(device_id).await?.collection_id;
        let site = self.collection(collection).await?.site_id;
        let now = self.now_ms();
        let cached = {
            let cache = self
                .order_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            cache
                .get(&site)
                .filter(|(at, _)| now.saturating_sub(*at) < ORDER_REUSE_MS)
                .map(|(_, counted)| {
                    counted
                        .iter()
                        .map(|(server, sessions)| Candidate {
                            server: server.clone(),
                            sessions: *sessions,
                        })
                        .collect::<Vec<_>>()
                })
        };
        let candidates = match cached {
            Some(c) => c,
            None => {
                let c = self.site_candidates(site).await?;
                let mut cache = self
                    .order_cache
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if cache.len() >= ORDER_CACHE_SITES_MAX {
                    cache.clear();
                }
                let counted = c.iter().map(|x| (x.server.clone(), x.sessions)).collect();
                cache.insert(site, (now, counted));
                c
            }
        };
        let list = order_for_device(candidates.clone(), now, device_id);
        let ids = list
            .iter()
            .map(|s| {
                candidates
                    .iter()
                    .find(|c| c.server.name == s.name)
                    .map_or(0, |c| c.server.id)
            })
            .collect();
        Ok((list, ids))
    }

    /// Records that the session `session_id` streams from `server` (login's first choice,
    /// or what a status report says after a failover). A server not registered, or a
    /// session gone, changes nothing; neither does the server it already has.
    ///
    /// # Errors
    /// Database errors.
    pub async fn note_session_server(
        &self,
        session_id: &str,
        server: SessionServer<'_>,
    ) -> Result<()> {
        let id: Option<i64> = match server {
            SessionServer::Id(id) => {
                sqlx::query_scalar("SELECT id FROM servers WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?
            }
            SessionServer::Name(n) => {
                sqlx::query_scalar("SELECT id FROM servers WHERE name = $1")
                    .bind(n)
                    .fetch_optional(&self.pool)
                    .await?
            }
            SessionServer::Address(a) => {
                sqlx::query_scalar("SELECT MIN(id) FROM servers WHERE address = $1")
                    .bind(a.trim())
                    .fetch_one(&self.pool)
                    .await?
            }
        };
        let Some(id) = id else { return Ok(()) };
        sqlx::query(
            "UPDATE sessions SET server_id = $1, move_to = NULL \
             WHERE id = $2 AND (server_id IS NULL OR server_id <> $1)",
        )
        .bind(id)
        .bind(session_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Live sessions per server id (what [`order`] weighs).
    ///
    /// # Errors
    /// Database errors.
    pub async fn sessions_per_server(&self) -> Result<Vec<(i64, i64)>> {
        Ok(sqlx::query_as(
            "SELECT server_id, COUNT(*) FROM sessions \
             WHERE server_id IS NOT NULL AND expires_at_ms > $1 \
             GROUP BY server_id ORDER BY server_id",
        )
        .bind(self.now_ms())
        .fetch_all(&self.pool)
        .await?)
    }

    /// Changes a server's rating or draining flag (audited).
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a rating out of 1..=[`RATING_MAX`];
    /// [`crate::Kind::NotFound`].
    pub async fn set_server(&self, id: i64, p: &ServerPatch, actor: &str) -> Result<Server> {
        if let Some(r) = p.rating
            && !(1..=RATING_MAX).contains(&r)
        {
            return Err(FarmError::invalid(format!(
                "rating must be 1 to {RATING_MAX}, not {r}"
            )));
        }
        let mut s = self.server(id).await?;
        if let Some(r) = p.rating {
            s.rating = r;
        }
        if let Some(d) = p.draining {
            s.draining = Flag(d);
        }
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE servers SET rating = $1, draining = $2 WHERE id = $3")
            .bind(s.rating)
            .bind(i64::from(s.draining.0))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        audit(
            &mut tx,
            now,
            actor,
            "server.set",
            "server",
            &id.to_string(),
            &json!({ "rating": s.rating, "draining": s.draining.0 }),
        )
        .await?;
        tx.commit().await?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn c(id: i64, rating: i64, sessions: i64, heartbeat_ago_ms: i64, draining: bool) -> Candidate {
        Candidate {
            server: Server {
                id,
                site_id: 1,
                name: format!("s{id}"),
                address: format!("10.0.0.{id}:10809"),
                registered_at_ms: 0,
                heartbeat_at_ms: NOW - heartbeat_ago_ms,
                rating,
                draining: Flag(draining),
                api_url: None,
            },
            sessions,
        }
    }

    fn names(v: &[LoginServer]) -> Vec<&str> {
        v.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn least_loaded_by_rating_first_then_draining_then_dead() {
        let got = order(
            vec![
                c(1, 100, 10, 0, false),         // load 0.10
                c(2, 200, 10, 0, false),         // load 0.05
                c(3, 100, 0, 0, true),           // draining
                c(4, 100, 0, 2 * 60_000, false), // dead
                c(5, 100, 5, 0, false),          // load 0.05, lower rating than s2
            ],
            NOW,
        );
        assert_eq!(names(&got), ["s2", "s5", "s1", "s3", "s4"]);
        assert!(got[..4].iter().all(|s| s.alive));
        assert!(!got[4].alive);
    }

    #[test]
    fn logins_one_by_one_spread_in_proportion_to_the_ratings() {
        // Each login's first server is counted by the next, as login records it.
        let mut servers = vec![
            c(1, 100, 0, 0, false),
            c(2, 100, 0, 0, false),
            c(3, 200, 0, 0, false),
        ];
        for _ in 0..400 {
            let first = order(servers.clone(), NOW)[0].name.clone();
            let s = servers.iter_mut().find(|s| s.server.name == first).unwrap();
            s.sessions += 1;
        }
        let counts: Vec<i64> = servers.iter().map(|s| s.sessions).collect();
        assert_eq!(counts, [100, 100, 200]);
    }

    #[test]
    fn a_server_that_joins_is_filled_by_the_others_excess_only() {
        // 30 devices on s1 and s2; s3 joins empty: each gives its excess over 10.
        let servers = vec![
            c(1, 100, 15, 0, false),
            c(2, 100, 15, 0, false),
            c(3, 100, 0, 0, false),
        ];
        assert_eq!(excess(1, &servers, NOW), 5);
        assert_eq!(excess(2, &servers, NOW), 5);
        assert_eq!(excess(3, &servers, NOW), 0);
        // After the moves nobody moves again.
        let after = vec![
            c(1, 100, 10, 0, false),
            c(2, 100, 10, 0, false),
            c(3, 100, 10, 0, false),
        ];
        assert!((1..=3).all(|id| excess(id, &after, NOW) == 0));
    }

    #[test]
    fn moves_follow_the_ratings_and_stop_within_the_tolerance() {
        // s2 is rated twice s1: of 30 sessions its share is 20, s1's 10.
        let servers = vec![c(1, 100, 30, 0, false), c(2, 200, 0, 0, false)];
        assert_eq!(excess(1, &servers, NOW), 20);
        // One over the share (and within 10 %, at least one) is left alone.
        let near = vec![c(1, 100, 11, 0, false), c(2, 200, 19, 0, false)];
        assert_eq!(excess(1, &near, NOW), 0);
        // Rounding of an odd count never moves a device back and forth.
        let odd = vec![c(1, 100, 2, 0, false), c(2, 100, 1, 0, false)];
        assert_eq!(excess(1, &odd, NOW) + excess(2, &odd, NOW), 0);
    }

    #[test]
    fn draining_dead_and_lone_servers_do_not_rebalance() {
        let lone = vec![c(1, 100, 50, 0, false), c(2, 100, 0, 2 * 60_000, false)];
        assert_eq!(excess(1, &lone, NOW), 0, "the other server is dead");
        let just_killed = vec![
            c(1, 100, 50, 0, false),
            c(2, 100, 0, REBALANCE_ALIVE_MS + 1, false),
        ];
        assert_eq!(
            excess(1, &just_killed, NOW),
            0,
            "a server two heartbeats late is not a place to move to, though login still \
             names it alive"
        );
        let draining = vec![c(1, 100, 50, 0, true), c(2, 100, 0, 0, false)];
        assert_eq!(excess(1, &draining, NOW), 0, "a drain moves them, not this");
        let onto_draining = vec![c(1, 100, 50, 0, false), c(2, 100, 0, 0, true)];
        assert_eq!(
            excess(1, &onto_draining, NOW),
            0,
            "never onto a draining server"
        );
        assert_eq!(excess(9, &lone, NOW), 0, "an unknown server");
    }

    #[test]
    fn extreme_counts_and_ratings_compare_without_overflow() {
        let got = order(
            vec![
                c(1, RATING_MAX, i64::MAX, 0, false),
                c(2, 1, i64::MAX / 2, 0, false),
            ],
            NOW,
        );
        assert_eq!(names(&got), ["s1", "s2"]);
    }

    /// The first server other than `own` device `id` is told: where a move sends it.
    fn moves_to(servers: &[Candidate], id: i64, own: &str) -> String {
        order_for_device(servers.to_vec(), NOW, id)
            .into_iter()
            .find(|s| s.name != own)
            .unwrap()
            .name
    }

    #[test]
    fn moved_devices_spread_over_the_servers_below_their_share_in_proportion_to_their_room() {
        // s3 carries everything; s1 and s2 joined, empty: a tie, each 1/3 of 30 below.
        let tie = [
            c(1, 100, 0, 0, false),
            c(2, 100, 0, 0, false),
            c(3, 100, 30, 0, false),
        ];
        let to_s1 = (1..=20)
            .filter(|id| moves_to(&tie, *id, "s3") == "s1")
            .count();
        assert!((6..=14).contains(&to_s1), "{to_s1} of 20 to s1");
        // s1 has room for 8, s2 for 4 (shares of 8 each): 2 to 1, over many devices.
        let room = [
            c(1, 100, 0, 0, false),
            c(2, 100, 4, 0, false),
            c(3, 100, 20, 0, false),
        ];
        let mut to = [0usize; 3];
        for id in 1..=3000 {
            match moves_to(&room, id, "s3").as_str() {
                "s1" => to[0] += 1,
                "s2" => to[1] += 1,
                _ => to[2] += 1,
            }
        }
        assert_eq!(to[2], 0, "never back to s3");
        let ratio = to[0] as f64 / to[1] as f64;
        assert!((1.8..=2.2).contains(&ratio), "{to:?}");
        // By rating: s2 (rating 300) has three times s1's share; both are empty.
        let rated = [
            c(1, 100, 0, 0, false),
            c(2, 300, 0, 0, false),
            c(3, 100, 50, 0, false),
        ];
        let to_s2 = (1..=3000)
            .filter(|id| moves_to(&rated, *id, "s3") == "s2")
            .count();
        // Rooms: s1 50·100 = 5000, s2 50·300 = 15000 (in 1/500 of a session): 3 to 1.
        assert!((2100..=2400).contains(&to_s2), "{to_s2} of 3000 to s2");
    }

    #[test]
    fn a_device_s_list_is_the_login_order_but_its_drawn_server() {
        // Draining and dead servers are never drawn and stay last.
        let servers = [
            c(1, 100, 5, 0, false),
            c(2, 100, 0, 0, true),
            c(3, 100, 0, 2 * 60_000, false),
            c(4, 100, 1, 0, false),
        ];
        for id in 1..50 {
            let got = order_for_device(servers.to_vec(), NOW, id);
            let n = names(&got);
            assert_eq!(n[2..], ["s2", "s3"], "{n:?}");
            // s4 is the only one below its share (3 each).
            assert_eq!(n[..2], ["s4", "s1"], "{n:?}");
        }
        // All at their share: one of the least loaded is drawn, each by some device.
        let even = [c(1, 100, 2, 0, false), c(2, 100, 2, 0, false)];
        let firsts: std::collections::HashSet<String> = (1..50)
            .map(|id| order_for_device(even.to_vec(), NOW, id)[0].name.clone())
            .collect();
        assert_eq!(firsts.len(), 2);
    }
}
