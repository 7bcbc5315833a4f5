//! Status reports to the farm: a logged-in agent posts its counters to
//! `/api/v1/status/report` every [`REPORT_EVERY`] for the console's live status, with its
//! session export as the credential. Shared by `ferry target` and the boot agent.

use std::path::PathBuf;
use std::time::Duration;

use crate::login::{self, LoginError};

/// How often a logged-in target reports its counters to the farm (the console's live status).
pub const REPORT_EVERY: Duration = Duration::from_secs(2);

/// Starts a thread that reports this device's counters to the farm API every [`REPORT_EVERY`] for the console's
/// live status: bytes read and written, retries and the write cache's use, read from the
/// agent's own control socket and posted to `/api/v1/status/report` with the session export
/// as the credential, with the address of the server in use (the console's Server column). Failures are logged, never fatal: status is not the data path.
pub fn start(api: &str, ca: Option<String>, export_name: String, control: PathBuf) {
    let url = match login::parse_api_url(api).and_then(|u| {
        u.join("api/v1/status/report")
            .map_err(|e| LoginError::BadUrl {
                url: api.to_string(),
                reason: e.to_string(),
            })
    }) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "no status reports to the farm");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("ferry-target-report".into())
        .spawn(move || {
            let client = match login::api_client(&url, ca.as_deref())
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    b.timeout(Duration::from_secs(5))
                        .build()
                        .map_err(|e| e.to_string())
                }) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "no status reports to the farm");
                    return;
                }
            };
            let mut failures = 0u64;
            loop {
                std::thread::sleep(REPORT_EVERY);
                let Ok(v) = crate::control::request(&control, "status") else {
                    continue;
                };
                let body = report_body(&export_name, &v);
                let ok = client
                    .post(url.clone())
                    .json(&body)
                    .send()
                    .is_ok_and(|r| r.status().is_success());
                if !ok {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!(failures, %url, "status report to the farm failed");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no status reports to the farm");
    }
}

/// The body of a status report (`POST /api/v1/status/report`) from the agent's status `v`:
/// the counters, and the NBD server it streams from now (its address, as login gave it;
/// the farm names the server registered there).
pub fn report_body(export_name: &str, v: &serde_json::Value) -> serde_json::Value {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    serde_json::json!({
        "export_name": export_name,
        "server_address": v["server"].as_str(),
        "bytes_read": n("bytes_read"),
        "bytes_written": n("bytes_written"),
        "retries": n("retries"),
        "cache_used_bytes": n("ram_bytes") + n("overflow_bytes"),
    })
}
