//! Status reports to the farm: a logged-in agent posts its counters to
//! `/api/v1/status/report` every [`REPORT_EVERY`] for the console's live status, with its
//! session export as the credential. Shared by `ferry target` and the boot agent.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::login::{self, LoginError};
use crate::server_list::{Offered, ServerRefresh};

/// How often a logged-in target reports its counters to the farm (the console's live status).
pub const REPORT_EVERY: Duration = Duration::from_secs(2);
/// Every this many reports, the agent asks for its site's servers (`servers_wanted`), so
/// that its failover list follows servers that joined or returned (every 10 s).
pub const SERVERS_REFRESH_REPORTS: u64 = 5;

/// The farm API URLs reports go to, in order, and the one in use: a failed report moves to
/// the next, so reports reach the farm while any of its APIs is up (a device logged in
/// through one API keeps reporting when that one goes away).
#[derive(Debug)]
pub struct ReportUrls {
    urls: Vec<reqwest::Url>,
    at: usize,
}

impl ReportUrls {
    /// The report URLs of the farm APIs `apis` (bad ones are logged and left out); `None`
    /// when none is left.
    pub fn new(apis: &[String]) -> Option<ReportUrls> {
        let urls: Vec<reqwest::Url> = apis
            .iter()
            .filter_map(|api| {
                login::parse_api_url(api)
                    .and_then(|u| {
                        u.join("api/v1/status/report")
                            .map_err(|e| LoginError::BadUrl {
                                url: api.clone(),
                                reason: e.to_string(),
                            })
                    })
                    .map_err(|e| tracing::warn!(error = %e, "no status reports to this API"))
                    .ok()
            })
            .collect();
        (!urls.is_empty()).then_some(ReportUrls { urls, at: 0 })
    }

    /// The URL the next report goes to.
    pub fn current(&self) -> &reqwest::Url {
        &self.urls[self.at]
    }

    /// The report to [`ReportUrls::current`] failed: the next one goes to the next API.
    pub fn failed(&mut self) {
        self.at = (self.at + 1) % self.urls.len();
    }
}

/// Reads the agent's status in its own process, for the reporter: filled by [`crate::run`]
/// once the agent is built. Not through the control socket's path: after `switch_root` the
/// boot agent's root is still the initramfs, whose `/run` the initramfs moved under the new
/// root, so that path no longer leads to the socket from the agent itself (its reports
/// stopped at `switch_root`, issue 31).
#[derive(Default)]
pub struct StatusFeed {
    status: OnceLock<StatusFn>,
    /// Reports that failed, counted by the reporter and shown in the agent's status.
    failures: std::sync::atomic::AtomicU64,
}

type StatusFn = Box<dyn Fn() -> Option<serde_json::Value> + Send + Sync>;

impl StatusFeed {
    /// Sets where the status comes from (the first call wins).
    pub fn set(&self, status: StatusFn) {
        let _ = self.status.set(status);
    }

    /// Counts a report that failed.
    pub fn failed(&self) {
        self.failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Reports that failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the agent has set it.
    pub fn is_set(&self) -> bool {
        self.status.get().is_some()
    }

    /// The agent's status now; `None` before the agent runs or after it ended.
    pub fn read(&self) -> Option<serde_json::Value> {
        self.status.get().and_then(|f| f())
    }
}

impl std::fmt::Debug for StatusFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StatusFeed").field(&self.is_set()).finish()
    }
}

/// Starts a thread that reports this device's counters to the farm every [`REPORT_EVERY`]
/// for the console's live status: bytes read and written, retries and the write cache's
/// use, read from the agent in this process (`feed`, which [`crate::run`] fills) and posted to `/api/v1/status/report` with
/// the session export as the credential, with the address of the server in use (the
/// console's Server column). Reports go to the first of `apis` that answers
/// ([`ReportUrls`]: the one login used first); failures are counted and logged (the 1st,
/// 2nd, 4th, ...), never fatal: status is not the data path. With `refresh`, every
/// [`SERVERS_REFRESH_REPORTS`]th report asks for the device's servers and offers their
/// addresses to the agent's failover list.
pub fn start(
    apis: &[String],
    ca: Option<String>,
    export_name: String,
    feed: Arc<StatusFeed>,
    refresh: Option<Arc<ServerRefresh>>,
) {
    let Some(mut urls) = ReportUrls::new(apis) else {
        tracing::warn!(apis = %apis.join(","), "no status reports to the farm: no usable API URL");
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("ferry-target-report".into())
        .spawn(move || {
            let client = match login::api_client(urls.current(), ca.as_deref())
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
            let mut reports = 0u64;
            loop {
                std::thread::sleep(REPORT_EVERY);
                let Some(v) = feed.read() else {
                    // Not yet (the agent is still being built): nothing to say.
                    if feed.is_set() {
                        failures += 1;
                        if failures.is_power_of_two() {
                            tracing::warn!(failures, "no status to report: the agent has ended");
                        }
                    }
                    continue;
                };
                // The session of now: after a login again, the new one's export.
                let current = v["export"]
                    .as_str()
                    .filter(|e| e.starts_with("ferry-s-"))
                    .unwrap_or(&export_name)
                    .to_string();
                let mut body = report_body(&current, &v);
                reports += 1;
                let wanted = refresh.is_some() && reports.is_multiple_of(SERVERS_REFRESH_REPORTS);
                if wanted {
                    body["servers_wanted"] = true.into();
                }
                let url = urls.current().clone();
                let answer = client
                    .post(url.clone())
                    .json(&body)
                    .send()
                    .ok()
                    .filter(|r| r.status().is_success());
                let ok = answer.is_some();
                if let (Some(r), Some(refresh)) = (answer.filter(|_| wanted), &refresh) {
                    match r.json::<serde_json::Value>() {
                        Ok(a) => refresh.offer(answer_servers(&a)),
                        Err(e) => tracing::debug!(error = %e, "servers answer unreadable"),
                    }
                }
                if !ok {
                    failures += 1;
                    feed.failed();
                    urls.failed();
                    if failures.is_power_of_two() {
                        tracing::warn!(failures, %url, next = %urls.current(),
                            "status report to the farm failed; the next goes to the next API");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no status reports to the farm");
    }
}

/// Ends the session `export_name` at the farm (`POST /api/v1/device/session/end`): its
/// machine shut down cleanly, its last write done. Tries each of `apis` in turn (each
/// bounded by the login client's timeouts); returns the API that ended it, or why none did.
///
/// # Errors
/// The last API's refusal or failure, naming it.
pub fn end_session(apis: &[String], ca: Option<&str>, export_name: &str) -> Result<String, String> {
    let mut last = String::from("no usable farm API URL");
    for api in apis {
        let attempt = login::parse_api_url(api)
            .map_err(|e| e.to_string())
            .and_then(|base| {
                let url = base
                    .join("api/v1/device/session/end")
                    .map_err(|e| e.to_string())?;
                let client = login::api_client(&base, ca)
                    .map_err(|e| e.to_string())?
                    .build()
                    .map_err(|e| e.to_string())?;
                let r = client
                    .post(url)
                    .json(&serde_json::json!({ "export_name": export_name }))
                    .send()
                    .map_err(|e| e.to_string())?;
                if r.status().is_success() {
                    Ok(())
                } else {
                    Err(format!(
                        "{}: {}",
                        r.status(),
                        r.text().unwrap_or_default().trim()
                    ))
                }
            });
        match attempt {
            Ok(()) => return Ok(api.clone()),
            Err(e) => last = format!("{api}: {e}"),
        }
    }
    Err(last)
}

/// The servers of a report's answer (`{"servers": [{"address", "alive", "draining"}, …]}`),
/// in its order; a server is a place to move to when alive and not draining. Nothing when
/// it holds none.
pub fn answer_servers(answer: &serde_json::Value) -> Vec<Offered> {
    answer["servers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| {
                    let address = s["address"].as_str()?;
                    (!address.is_empty() && address.len() <= SERVER_ADDRESS_LEN_MAX).then(|| {
                        Offered {
                            address: address.to_string(),
                            serving: s["alive"].as_bool() == Some(true)
                                && s["draining"].as_bool() != Some(true),
                        }
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The longest server address taken from an answer.
const SERVER_ADDRESS_LEN_MAX: usize = 260;

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
        "host_cache_hit_bytes": v["host_cache"]["hit_bytes"].as_u64().unwrap_or(0),
        "host_cache_server_bytes": v["host_cache"]["server_bytes"].as_u64().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_reads_the_agent_in_process_and_counts_failed_reports() {
        let feed = StatusFeed::default();
        assert!(!feed.is_set());
        assert_eq!(feed.read(), None, "not before the agent runs");
        let n = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(7));
        let seen = std::sync::Arc::clone(&n);
        feed.set(Box::new(move || {
            Some(serde_json::json!({ "bytes_read": seen.load(std::sync::atomic::Ordering::Relaxed) }))
        }));
        assert_eq!(feed.read().unwrap()["bytes_read"], 7);
        n.store(9, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(feed.read().unwrap()["bytes_read"], 9, "read anew each time");
        feed.set(Box::new(|| None));
        assert_eq!(
            feed.read().unwrap()["bytes_read"],
            9,
            "the first setter stays"
        );
        feed.failed();
        feed.failed();
        assert_eq!(feed.failures(), 2);
    }

    #[test]
    fn a_failed_report_moves_to_the_next_api_and_comes_round() {
        let apis = [
            "https://a.example:8443".to_string(),
            "not a url".to_string(),
            "https://b.example:8443/".to_string(),
        ];
        let mut u = ReportUrls::new(&apis).expect("two usable URLs");
        assert_eq!(
            u.current().as_str(),
            "https://a.example:8443/api/v1/status/report"
        );
        u.failed();
        assert_eq!(
            u.current().as_str(),
            "https://b.example:8443/api/v1/status/report"
        );
        u.failed();
        assert_eq!(u.current().host_str(), Some("a.example"));
        assert!(ReportUrls::new(&["not a url".to_string()]).is_none());
    }

    #[test]
    fn an_answer_s_addresses_come_in_its_order_and_bad_ones_are_dropped() {
        let a = serde_json::json!({"servers": [
            {"name": "s3", "address": "10.0.0.3:10809", "alive": true},
            {"name": "s1", "address": "", "alive": true},
            {"name": "s2", "address": "x".repeat(SERVER_ADDRESS_LEN_MAX + 1), "alive": true},
            {"name": "s4", "address": 7, "alive": false},
            {"name": "s1", "address": "10.0.0.1:10809", "alive": true}
        ]});
        let got: Vec<(String, bool)> = answer_servers(&a)
            .into_iter()
            .map(|o| (o.address, o.serving))
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.3:10809".to_string(), true),
                ("10.0.0.1:10809".to_string(), true)
            ]
        );
        let d = serde_json::json!({"servers": [
            {"address": "a:1", "alive": true, "draining": true},
            {"address": "b:1", "alive": false}
        ]});
        assert!(answer_servers(&d).iter().all(|o| !o.serving));
        assert!(answer_servers(&serde_json::json!({})).is_empty());
    }

    #[test]
    fn a_report_carries_the_host_cache_s_bytes_when_there_is_one() {
        let with = serde_json::json!({"bytes_read": 10, "ram_bytes": 3, "overflow_bytes": 4,
            "host_cache": {"hit_bytes": 65536, "server_bytes": 131072}});
        let b = report_body("ferry-s-x", &with);
        assert_eq!(b["host_cache_hit_bytes"], 65536);
        assert_eq!(b["host_cache_server_bytes"], 131072);
        assert_eq!(b["cache_used_bytes"], 7);
        let b = report_body("ferry-s-x", &serde_json::json!({"host_cache": null}));
        assert_eq!(b["host_cache_hit_bytes"], 0);
    }
}
