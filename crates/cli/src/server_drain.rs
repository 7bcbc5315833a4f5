//! `ferry server drain|undrain NAME` (issue 20): the same change as `ferry farm server set ID
//! --drain|--no-drain`, by the server's name, over the farm API. The drained server itself
//! then moves its devices away (`member::drain`), and a serving one rebalances
//! (`member::rebalance`): that logic lives in the farm-member runtime, on an injected clock.

use std::process::ExitCode;

use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

use crate::farm_client::{Client, Conn};

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
