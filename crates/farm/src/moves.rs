//! Where a rebalancing server's sessions go (issue 31). A device is told, with its refreshed
//! server list, one server below its share to move to first (drawn for it in proportion to
//! each server's room: [`crate::balance::order_for_device`]), and the farm records that
//! destination (`sessions.move_to`). A server that carries an excess then moves only
//! sessions whose destination still has room, no more to one destination than its room, and
//! counts each on its destination before closing its connections: moved devices spread over
//! every server below its share, ties included, none overshoots, and no device moves twice.
//!
//! ```text
//!   status report (servers_wanted) ─► session_servers: the list; move_to = first serving ≠ own
//!   rebalance check ─► plan(me): excess; rooms; sessions whose move_to has room
//!   move ─► move_session_to: server_id = move_to ─► the server closes the connections
//! ```
//!
//! A session whose server changed has no destination until its next refresh (its list
//! was drawn for the server it left). The room arithmetic is the pure [`rooms`] and [`pick`].

use std::collections::HashMap;

use contract::login::LoginServer;

use crate::Farm;
use crate::balance::{Candidate, Shares};
use crate::error::Result;

/// A session a rebalancing server may move, and where its device goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Movable {
    /// The session's id.
    pub session_id: String,
    /// Its export name.
    pub export_name: String,
    /// The server its device was told to move to.
    pub to: i64,
}

/// What a rebalance check of one server may do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// How many of its sessions it should move ([`crate::balance::excess`]).
    pub excess: usize,
    /// The sessions it may move now: each destination at most its room (by export name).
    pub movable: Vec<Movable>,
}

/// Each serving server's room below its share (`ceil(total × rating / Σ ratings)` minus
/// what it carries), by id; a server at or above its share has none. Serving: heartbeating
/// within [`crate::balance::REBALANCE_ALIVE_MS`] and not draining.
pub fn rooms(servers: &[Candidate], now_ms: i64) -> HashMap<i64, i64> {
    let shares = Shares::of(servers, now_ms);
    shares
        .serving
        .iter()
        .filter_map(|c| {
            let room = shares.share(c) - i128::from(c.sessions.max(0));
            (room > 0).then(|| (c.server.id, i64::try_from(room).unwrap_or(i64::MAX)))
        })
        .collect()
}

/// The sessions of `me` (session id, export name, recorded destination) that may move:
/// those whose destination is another server with room, at most its room to each, in
/// export-name order.
pub fn pick(
    me: i64,
    mut rooms: HashMap<i64, i64>,
    mut sessions: Vec<(String, String, Option<i64>)>,
) -> Vec<Movable> {
    sessions.sort_by(|a, b| a.1.cmp(&b.1));
    let mut out = Vec::new();
    for (session_id, export_name, to) in sessions {
        let Some(to) = to.filter(|t| *t != me) else {
            continue;
        };
        if let Some(room) = rooms.get_mut(&to)
            && *room > 0
        {
            *room -= 1;
            out.push(Movable {
                session_id,
                export_name,
                to,
            });
        }
    }
    out
}

impl Farm {
    /// What server `me` may move now ([`Plan`]).
    ///
    /// # Errors
    /// Database errors; [`crate::Kind::NotFound`] for an unknown server.
    pub async fn rebalance_plan(&self, me: i64) -> Result<Plan> {
        let site = self.server(me).await?.site_id;
        let candidates = self.site_candidates(site).await?;
        let now = self.now_ms();
        let excess = crate::balance::excess(me, &candidates, now);
        if excess == 0 {
            return Ok(Plan::default());
        }
        let sessions: Vec<(String, String, Option<i64>)> = sqlx::query_as(
            "SELECT id, export_name, move_to FROM sessions \
             WHERE server_id = $1 AND expires_at_ms > $2 AND ended_at_ms IS NULL",
        )
        .bind(me)
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        Ok(Plan {
            excess,
            movable: pick(me, rooms(&candidates, now), sessions),
        })
    }

    /// The servers the device of session `session_id` is told when its list is refreshed
    /// ([`crate::balance::order_for_device`]), recording the one it would move to first: the
    /// first serving server other than the session's own.
    ///
    /// # Errors
    /// Database errors; [`crate::Kind::NotFound`] for an unknown session.
    pub async fn session_servers(&self, session_id: &str) -> Result<Vec<LoginServer>> {
        let row: Option<(i64, Option<i64>, Option<i64>)> =
            sqlx::query_as("SELECT device_id, server_id, move_to FROM sessions WHERE id = $1")
                .bind(session_id)
                .fetch_optional(&self.pool)
                .await?;
        let Some((device_id, own, recorded)) = row else {
            return Err(crate::error::FarmError::not_found(format!(
                "no session {session_id:?}"
            )));
        };
        let (list, ids) = self.device_servers_with_ids(device_id).await?;
        let to = list
            .iter()
            .zip(&ids)
            .find(|(s, id)| s.alive && !s.draining && Some(**id) != own)
            .map(|(_, id)| *id);
        if to != recorded {
            sqlx::query("UPDATE sessions SET move_to = $1 WHERE id = $2")
                .bind(to)
                .bind(session_id)
                .execute(&self.pool)
                .await?;
        }
        Ok(list)
    }

    /// Counts session `session_id` on server `to` before its connections are closed for
    /// balance (its device goes there: [`Movable::to`]); its destination is spent.
    ///
    /// # Errors
    /// Database errors.
    pub async fn move_session_to(&self, session_id: &str, to: i64) -> Result<()> {
        sqlx::query("UPDATE sessions SET server_id = $1, move_to = NULL WHERE id = $2")
            .bind(to)
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Flag, Server};

    fn c(id: i64, sessions: i64, draining: bool) -> Candidate {
        Candidate {
            server: Server {
                id,
                site_id: 1,
                name: format!("s{id}"),
                address: format!("10.0.0.{id}:10809"),
                registered_at_ms: 0,
                heartbeat_at_ms: 1_000,
                rating: 100,
                draining: Flag(draining),
                api_url: None,
            },
            sessions,
        }
    }

    fn s(n: u32, to: Option<i64>) -> (String, String, Option<i64>) {
        (format!("id-{n}"), format!("ferry-s-{n:04}"), to)
    }

    #[test]
    fn rooms_are_the_shares_left_and_draining_servers_have_none() {
        let r = rooms(&[c(1, 0, false), c(2, 4, false), c(3, 20, false)], 1_000);
        assert_eq!(r, HashMap::from([(1, 8), (2, 4)]));
        let r = rooms(&[c(1, 0, true), c(2, 0, false), c(3, 10, false)], 1_000);
        assert_eq!(r, HashMap::from([(2, 5)]), "s1 drains");
    }

    #[test]
    fn picks_at_most_each_destination_s_room_and_only_known_destinations() {
        let rooms = HashMap::from([(1, 2), (2, 1)]);
        let sessions = vec![
            s(1, Some(1)),
            s(2, Some(1)),
            s(3, Some(1)),
            s(4, Some(2)),
            s(5, Some(2)),
            s(6, None),
            s(7, Some(3)),
            s(8, Some(9)),
        ];
        let got = pick(3, rooms, sessions);
        let to: Vec<(String, i64)> = got.iter().map(|m| (m.export_name.clone(), m.to)).collect();
        assert_eq!(
            to,
            [
                ("ferry-s-0001".to_string(), 1),
                ("ferry-s-0002".to_string(), 1),
                ("ferry-s-0004".to_string(), 2)
            ]
        );
    }
}
