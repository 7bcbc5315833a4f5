//! `ferry farm server`: the farm's servers over the API (list, register, heartbeat, remove
//! one that is gone, rating and drain).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use crate::farm_client::{Client, Conn, Paging, cell};

/// `ferry farm server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: ServerCommand,
}

#[derive(Debug, Subcommand)]
enum ServerCommand {
    /// List servers with their last heartbeat.
    List(Paging),
    /// Register a server (again: update it).
    Register {
        /// Its name.
        name: String,
        /// The site's id.
        #[arg(long)]
        site: i64,
        /// Its NBD address (`host:port`).
        #[arg(long)]
        address: String,
    },
    /// Record a heartbeat of a server.
    Heartbeat {
        /// Its id.
        id: i64,
    },
    /// Remove a server that is gone (no heartbeat for a minute; a running server is
    /// refused): it leaves every device's server list.
    #[command(after_help = "Example:\n  ferry farm server remove 3")]
    Remove {
        /// Its id.
        id: i64,
    },
    /// Change a server's weight in load balancing, or drain it: devices are told the least
    /// loaded servers of their site first (live sessions ÷ rating), a draining server after
    /// every other live one.
    #[command(after_help = "Examples:\n  ferry farm server set 2 --rating 200\n  \
        ferry farm server set 3 --drain      # logins name it last\n  \
        ferry farm server set 3 --no-drain")]
    Set {
        /// Its id.
        id: i64,
        /// Its rating, 1 to 10000 (default 100): a server rated 200 gets twice the devices
        /// of one rated 100.
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        rating: Option<i64>,
        /// Drain it: logins name it after every other live server.
        #[arg(long, conflicts_with = "no_drain")]
        drain: bool,
        /// Stop draining it.
        #[arg(long)]
        no_drain: bool,
    },
}

pub fn run(a: ServerArgs) -> anyhow::Result<ExitCode> {
    let c = Client::new(&a.conn)?;
    match a.command {
        ServerCommand::List(p) => {
            let v = c.get(&format!("/servers?{}", p.query()))?;
            c.show(
                &v,
                &[
                    "id",
                    "site_id",
                    "name",
                    "address",
                    "rating",
                    "draining",
                    "heartbeat_at_ms",
                ],
            )?;
        }
        ServerCommand::Register {
            name,
            site,
            address,
        } => {
            let body = json!({"name": name, "site_id": site, "address": address});
            let v = c.post("/servers", Some(body))?;
            c.done(
                &v,
                &format!(
                    "registered server {} (id {})",
                    cell(&v["name"]),
                    cell(&v["id"])
                ),
            )?;
        }
        ServerCommand::Remove { id } => {
            let v = c.call(Method::DELETE, &format!("/servers/{id}"), None)?;
            c.done(&v, &format!("removed server {id}"))?;
        }
        ServerCommand::Heartbeat { id } => {
            let v = c.post(&format!("/servers/{id}/heartbeat"), None)?;
            c.done(&v, &format!("heartbeat of server {id} recorded"))?;
        }
        ServerCommand::Set {
            id,
            rating,
            drain,
            no_drain,
        } => {
            let draining = if drain {
                Some(true)
            } else if no_drain {
                Some(false)
            } else {
                None
            };
            if rating.is_none() && draining.is_none() {
                anyhow::bail!("nothing to change: give --rating, --drain or --no-drain");
            }
            let body = json!({"rating": rating, "draining": draining});
            let v = c.call(Method::PATCH, &format!("/servers/{id}"), Some(body))?;
            c.done(
                &v,
                &format!(
                    "server {id}: rating {}, {}",
                    cell(&v["rating"]),
                    if v["draining"] == true {
                        "draining"
                    } else {
                        "serving"
                    }
                ),
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
