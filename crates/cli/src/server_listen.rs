//! The budgets of `ferry server`'s listeners (and `ferry farm serve`'s API): the open-file
//! limit raised as far as the hard limit allows, shared out among the listeners
//! ([`budget::files::plan`]), one gate per listener, and the one start line that says what
//! each got. Hidden flags ([`ListenArgs`]) set what `[limits]` sets, so tests can use short
//! timeouts and make loopback count as remote.

use std::sync::Arc;
use std::time::Duration;

use budget::files::{FileLimit, Plan, Wants};
use budget::http::HttpLimits;
use budget::{Gate, GateConfig};
use clap::Args as ClapArgs;
use server::config::{LimitsSection, ListenLimits, Resolved};

use crate::server_farm::parse_duration;

/// `[limits]` as hidden flags (over the file's).
#[derive(Debug, Clone, Default, ClapArgs)]
pub struct ListenArgs {
    /// Loopback clients count as remote: NBD's per-address cap and idle timeout apply to
    /// them, and `[access]` does not see them as local ([limits] trust_loopback = false).
    #[arg(long, hide = true)]
    pub loopback_is_remote: bool,
    /// NBD connections per client address ([limits] nbd_per_address).
    #[arg(long, hide = true, value_name = "N")]
    pub nbd_per_address: Option<usize>,
    /// API connections per client address ([limits] api_per_address).
    #[arg(long, hide = true, value_name = "N")]
    pub api_per_address: Option<usize>,
    /// Boot-port connections per client address ([limits] boot_per_address).
    #[arg(long, hide = true, value_name = "N")]
    pub boot_per_address: Option<usize>,
    /// NBD handshake, STARTTLS included ([limits] nbd_handshake_timeout_ms).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub nbd_handshake_timeout: Option<Duration>,
    /// The API's TLS handshake ([limits] tls_handshake_timeout_ms).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub tls_handshake_timeout: Option<Duration>,
    /// An HTTP request head, and a kept-alive connection's idle time
    /// ([limits] http_header_timeout_ms).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub http_header_timeout: Option<Duration>,
    /// An HTTP body read or response write moving nothing ([limits] http_stall_timeout_ms).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub http_stall_timeout: Option<Duration>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl ListenArgs {
    /// Sets the flags given over `l`.
    pub fn apply(&self, l: &mut LimitsSection) {
        if self.loopback_is_remote {
            l.trust_loopback = Some(false);
        }
        l.nbd_per_address = self.nbd_per_address.or(l.nbd_per_address);
        l.api_per_address = self.api_per_address.or(l.api_per_address);
        l.boot_per_address = self.boot_per_address.or(l.boot_per_address);
        let set = |flag: Option<Duration>, key: &mut Option<u64>| {
            if let Some(d) = flag {
                *key = Some(ms(d));
            }
        };
        set(self.nbd_handshake_timeout, &mut l.nbd_handshake_timeout_ms);
        set(self.tls_handshake_timeout, &mut l.tls_handshake_timeout_ms);
        set(self.http_header_timeout, &mut l.http_header_timeout_ms);
        set(self.http_stall_timeout, &mut l.http_stall_timeout_ms);
    }
}

/// The HTTP timeouts of `[limits]`.
pub fn http_limits(l: &ListenLimits) -> HttpLimits {
    HttpLimits {
        header_timeout: l.http_header_timeout,
        stall_timeout: l.http_stall_timeout,
        handshake_timeout: l.tls_handshake_timeout,
        ..HttpLimits::default()
    }
}

/// The gates of the listeners beside NBD (whose gate the NBD listener makes from
/// `Resolved::nbd`).
#[derive(Debug, Clone)]
pub struct Budgets {
    /// The farm API.
    pub api: api::Listen,
    /// The HTTP boot port.
    pub boot: api::Listen,
    /// The metrics endpoint.
    pub metrics: Arc<Gate>,
}

/// Which listeners `ferry server` runs besides NBD.
#[derive(Debug, Clone, Copy)]
pub struct Listeners {
    /// The farm API.
    pub api: bool,
    /// The HTTP boot port.
    pub boot: bool,
    /// TFTP.
    pub tftp: bool,
}

fn gate(name: &'static str, connections_max: usize, per_address_max: usize) -> Arc<Gate> {
    Gate::new(GateConfig {
        name,
        connections_max,
        per_address_max,
        // Loopback is a client like any other on the HTTP listeners: nothing on this
        // machine needs more than a per-address cap's worth of them.
        loopback_exempt: false,
        // Served by `budget::http::serve`, which closes an evicted connection.
        evict_for_newcomers: true,
    })
}

/// Raises the open-file limit, shares it out among the listeners `on` (setting
/// `r.nbd.max_connections` to NBD's share), logs the plan in one line, and returns the
/// gates of the HTTP listeners.
pub fn plan(r: &mut Resolved, on: Listeners) -> Budgets {
    let files = budget::files::raise_open_files();
    // Each TFTP transfer holds its socket and the file it sends.
    let tftp_files = if on.tftp {
        u64::try_from(tftp::Config::default().max_transfers).unwrap_or(u64::MAX) * 2
    } else {
        0
    };
    let wants = Wants {
        nbd_connections: r.nbd.max_connections,
        api: on.api,
        boot: on.boot,
        metrics: r.metrics_listen.is_some(),
        other_files: tftp_files,
    };
    let p = budget::files::plan(files.soft, &wants);
    r.nbd.max_connections = p.nbd;
    log_plan(&files, &p, wants.nbd_connections, r);
    let http = http_limits(&r.limits);
    let l = &r.limits;
    Budgets {
        api: api::Listen {
            gate: gate("api", p.api, l.api_per_address),
            limits: http,
        },
        boot: api::Listen {
            gate: gate("boot", p.boot, l.boot_per_address),
            limits: http,
        },
        metrics: gate("metrics", p.metrics.max(1), l.metrics_per_address),
    }
}

/// The gate of `ferry farm serve`'s API: the open-file limit raised and, of it, what is
/// left after the reserve (at most [`budget::files::API_CONNECTIONS_MAX`]).
pub fn farm_api(l: &ListenLimits) -> api::Listen {
    let files = budget::files::raise_open_files();
    let left = files.soft.saturating_sub(budget::files::FILES_RESERVED);
    let max = budget::files::API_CONNECTIONS_MAX.min(usize::try_from(left).unwrap_or(usize::MAX));
    let max = max.max(budget::files::CONNECTIONS_MIN);
    tracing::info!(
        open_files = files.soft,
        open_files_before = files.before,
        api_connections = max,
        api_per_address = l.api_per_address,
        "open files: {} (was {}); the API holds at most {max} connections, {} per address",
        files.soft,
        files.before,
        l.api_per_address,
    );
    api::Listen {
        gate: gate("api", max, l.api_per_address),
        limits: http_limits(l),
    }
}

fn log_plan(files: &FileLimit, p: &Plan, nbd_asked: usize, r: &Resolved) {
    let hard = files
        .hard
        .map_or("unlimited".to_string(), |h| h.to_string());
    let line = format!(
        "open files: soft limit {} raised to {} (hard {hard}); {} reserved; connections: \
         nbd {} ({} per address), api {}, boot {}, metrics {}",
        files.before,
        files.soft,
        p.reserved,
        p.nbd,
        r.nbd.max_connections_per_address,
        p.api,
        p.boot,
        p.metrics,
    );
    if let Some(e) = files.error {
        tracing::warn!(error = %e, "{line}; could not raise the soft limit");
    } else if p.short {
        tracing::warn!(
            nbd_asked,
            "{line}; the open-file limit is too low for nbd.max_connections = {nbd_asked}: \
             raise it (LimitNOFILE= in a systemd unit, ulimit -Hn)"
        );
    } else {
        tracing::info!("{line}");
    }
}
