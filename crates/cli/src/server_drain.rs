//! Draining a farm server (issue 20): when the farm marks this server draining
//! (`ferry farm server set ID --drain`), it closes the connections of the sessions it
//! serves, a few each second, so that each device fails over to the next server of the list
//! its login gave it: the same path as a crash, without the wait for a dead connection and
//! without a new login. Logins name a draining server last (`farm::balance`).
//!
//! Each session is moved once per drain: a device whose list holds no other server comes
//! back and is served. Ending the drain (`--no-drain`) forgets the moves.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

use crate::farm_client::{Client, Conn};
use crate::server_farm::FarmHandle;

/// `ferry server drain|undrain NAME`: the same change as `ferry farm server set ID
/// --drain|--no-drain`, by the server's name.
#[derive(Debug, Subcommand)]
pub enum DrainCommand {
    /// Drain a farm server: logins name it last, and it moves the devices it serves to the
    /// other servers of their lists (each fails over without a new login).
    #[command(
        after_help = "Examples:\n  ferry server drain pvs1 --api https://farm:8080 \\\n      \
        --farm-ca ca-cert.pem --token $FERRY_TOKEN\n  ferry server undrain pvs1"
    )]
    Drain {
        /// The server's name in the farm.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// End a server's drain: logins name it by its load again.
    #[command(after_help = "Example:\n  ferry server undrain pvs1")]
    Undrain {
        /// The server's name in the farm.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Runs `ferry server drain|undrain NAME`.
///
/// # Errors
/// API errors; no server of that name.
pub fn run(c: &DrainCommand) -> anyhow::Result<ExitCode> {
    let (name, conn, draining) = match c {
        DrainCommand::Drain { name, conn } => (name, conn, true),
        DrainCommand::Undrain { name, conn } => (name, conn, false),
    };
    let client = Client::new(conn)?;
    let mut offset = 0;
    let id = loop {
        let page = client.get(&format!("/servers?limit=1000&offset={offset}"))?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if let Some(s) = items.iter().find(|s| s["name"] == name.as_str()) {
            break s["id"].as_i64().unwrap_or_default();
        }
        if items.is_empty() {
            anyhow::bail!("the farm has no server named {name:?} (see `ferry farm server list`)");
        }
        offset += items.len();
    };
    let v = client.call(
        Method::PATCH,
        &format!("/servers/{id}"),
        Some(json!({ "draining": draining })),
    )?;
    let what = if draining {
        "draining: logins name it last, and it moves its devices to their next servers"
    } else {
        "serving: logins name it by its load again"
    };
    client.done(&v, &format!("server {name} (id {id}) {what}"))?;
    Ok(ExitCode::SUCCESS)
}

/// How often the server reads whether it is draining.
pub const DRAIN_CHECK_EVERY: Duration = Duration::from_secs(1);
/// The most sessions moved per check: a drain must not turn into a reconnect storm on the
/// other servers.
pub const DRAIN_SESSIONS_PER_CHECK: usize = 16;

/// The sessions to move now: those open and not moved yet, at most
/// [`DRAIN_SESSIONS_PER_CHECK`], starting at a position that changes with `turn` so that no
/// session is always last.
pub fn to_move(open: &[String], moved: &HashSet<String>, turn: usize) -> Vec<String> {
    let waiting: Vec<&String> = open.iter().filter(|n| !moved.contains(*n)).collect();
    if waiting.is_empty() {
        return Vec::new();
    }
    let start = turn % waiting.len();
    waiting
        .iter()
        .cycle()
        .skip(start)
        .take(waiting.len().min(DRAIN_SESSIONS_PER_CHECK))
        .map(|n| (*n).clone())
        .collect()
}

/// Watches this server's draining flag and moves its sessions away while it is set.
pub fn drain_when_told(
    handle: &FarmHandle,
    registry: &server::exports::Registry,
    runtime: &tokio::runtime::Handle,
) {
    let reg = registry.clone();
    let farm = Arc::clone(&handle.farm);
    let id = handle.server_id;
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(DRAIN_CHECK_EVERY);
        let mut moved: HashSet<String> = HashSet::new();
        let mut turn = 0usize;
        loop {
            tick.tick().await;
            let draining = match farm.server(id).await {
                Ok(s) => s.draining.0,
                Err(e) => {
                    tracing::warn!(error = %e, "drain check failed");
                    continue;
                }
            };
            if !draining {
                if !moved.is_empty() {
                    tracing::info!(moved = moved.len(), "drain ended");
                    moved.clear();
                }
                continue;
            }
            let mut open = reg.open_session_names();
            open.sort();
            turn = turn.wrapping_add(1);
            for name in to_move(&open, &moved, turn) {
                let n = reg.move_session(&name);
                tracing::info!(session = %name, connections = n,
                    "draining: closed the session's connections (the device fails over)");
                moved.insert(name);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("ferry-s-{i:04}")).collect()
    }

    #[test]
    fn moves_each_session_once_a_bounded_number_at_a_time() {
        let open = names(40);
        let mut moved = HashSet::new();
        let mut checks = 0;
        loop {
            let now = to_move(&open, &moved, checks);
            if now.is_empty() {
                break;
            }
            assert!(now.len() <= DRAIN_SESSIONS_PER_CHECK);
            for n in now {
                assert!(moved.insert(n), "a session moved twice");
            }
            checks += 1;
        }
        assert_eq!(moved.len(), 40);
        assert_eq!(checks, 3, "40 sessions, 16 per check");
    }

    #[test]
    fn the_first_session_moved_changes_with_the_turn() {
        let open = names(5);
        let moved = HashSet::new();
        let firsts: HashSet<String> = (0..5)
            .map(|t| to_move(&open, &moved, t)[0].clone())
            .collect();
        assert_eq!(firsts.len(), 5);
    }
}
