//! Server metrics: the [`NbdMetrics`] sink (atomic counters and fixed-bucket latency
//! histograms per request type) and the Prometheus text exposition of everything, including
//! the block cache's and the registry's counters.
//!
//! Request types are a fixed set ([`REQUEST_TYPES`]; anything else counts as `other`), so
//! recording is lock-free and the number of series is bounded whatever a client sends.
//! Protocol-error kinds are `&'static str`s chosen by the server's code, kept in a small
//! table capped at [`PROTOCOL_ERROR_KINDS_MAX`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use block_cache::BlockCacheStats;

use crate::exports::{MODE_LABELS, RegistryStats};
use nbd_server::NbdMetrics;

/// The request types with their own series; the last one takes every other kind.
pub const REQUEST_TYPES: [&str; 8] = [
    "read",
    "write",
    "flush",
    "trim",
    "write_zeroes",
    "block_status",
    "cache",
    "other",
];
/// Upper bounds of the latency buckets, in seconds (`+Inf` is implicit).
pub const LATENCY_BUCKETS_SECONDS: [f64; 16] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 5.0,
];
/// Distinct protocol-error kinds kept; more are counted as `other`.
pub const PROTOCOL_ERROR_KINDS_MAX: usize = 64;

#[derive(Debug, Default)]
struct RequestStats {
    ok: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    /// Per-bucket (not cumulative) counts; requests slower than the last bound are only in
    /// `ok + errors`.
    buckets: [AtomicU64; LATENCY_BUCKETS_SECONDS.len()],
    sum_ns: AtomicU64,
}

/// The server's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    connections_open: AtomicU64,
    connections_total: AtomicU64,
    requests: [RequestStats; REQUEST_TYPES.len()],
    protocol_errors: Mutex<Vec<(&'static str, u64)>>,
}

fn request_index(kind: &str) -> usize {
    REQUEST_TYPES
        .iter()
        .position(|t| *t == kind)
        .unwrap_or(REQUEST_TYPES.len() - 1)
}

fn bucket_index(latency: Duration) -> Option<usize> {
    let s = latency.as_secs_f64();
    LATENCY_BUCKETS_SECONDS.iter().position(|&b| s <= b)
}

impl NbdMetrics for Metrics {
    fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Ordering::Relaxed);
        self.connections_total.fetch_add(1, Ordering::Relaxed);
    }

    fn connection_closed(&self) {
        // Saturating: a close without an open must not wrap the gauge to 2^64.
        let _ = self
            .connections_open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    fn request(&self, kind: &'static str, bytes: u64, latency: Duration, ok: bool) {
        let r = &self.requests[request_index(kind)];
        let outcome = if ok { &r.ok } else { &r.errors };
        outcome.fetch_add(1, Ordering::Relaxed);
        r.bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(i) = bucket_index(latency) {
            r.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        r.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn protocol_error(&self, what: &'static str) {
        let mut t = self
            .protocol_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let slot = match t.iter().position(|(w, _)| *w == what) {
            Some(i) => i,
            None if t.len() < PROTOCOL_ERROR_KINDS_MAX - 1 => {
                t.push((what, 0));
                t.len() - 1
            }
            None => match t.iter().position(|(w, _)| *w == "other") {
                Some(i) => i,
                None => {
                    t.push(("other", 0));
                    t.len() - 1
                }
            },
        };
        t[slot].1 += 1;
    }
}

/// Writes one metric family: HELP, TYPE, then its samples.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &'static str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out, name }
    }

    /// A sample; `suffix` is `_bucket`, `_sum`, `_count` or empty.
    fn sample(&mut self, suffix: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let _ = write!(self.out, "{}{suffix}", self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn single(out: &mut String, name: &'static str, kind: &str, help: &str, value: u64) {
    Family::new(out, name, kind, help).sample("", &[], value);
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Everything in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self, cache: &BlockCacheStats, registry: &RegistryStats) -> String {
        let mut out = String::with_capacity(16 << 10);
        self.render_nbd(&mut out);
        render_cache(&mut out, cache);
        render_registry(&mut out, registry);
        out
    }

    fn render_nbd(&self, out: &mut String) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let conns = load(&self.connections_open);
        single(
            out,
            "ferry_nbd_connections",
            "gauge",
            "NBD connections open now.",
            conns,
        );
        let total = load(&self.connections_total);
        single(
            out,
            "ferry_nbd_connections_total",
            "counter",
            "NBD connections accepted.",
            total,
        );
        let per_type = |out: &mut String, name, help, f: &dyn Fn(&RequestStats) -> u64| {
            let mut fam = Family::new(out, name, "counter", help);
            for (t, r) in REQUEST_TYPES.iter().zip(&self.requests) {
                fam.sample("", &[("type", t)], f(r));
            }
        };
        per_type(
            out,
            "ferry_nbd_requests_total",
            "NBD requests completed, by type.",
            &|r| load(&r.ok) + load(&r.errors),
        );
        per_type(
            out,
            "ferry_nbd_request_errors_total",
            "NBD requests that failed, by type.",
            &|r| load(&r.errors),
        );
        per_type(
            out,
            "ferry_nbd_bytes_total",
            "NBD payload bytes, by request type.",
            &|r| load(&r.bytes),
        );
        let mut fam = Family::new(
            out,
            "ferry_nbd_request_seconds",
            "histogram",
            "NBD request latency from receipt to reply, by type.",
        );
        for (t, r) in REQUEST_TYPES.iter().zip(&self.requests) {
            let mut cumulative = 0;
            for (bound, n) in LATENCY_BUCKETS_SECONDS.iter().zip(&r.buckets) {
                cumulative += load(n);
                let le = bound.to_string();
                fam.sample("_bucket", &[("type", t), ("le", &le)], cumulative);
            }
            let count = load(&r.ok) + load(&r.errors);
            fam.sample("_bucket", &[("type", t), ("le", "+Inf")], count);
            fam.sample("_sum", &[("type", t)], load(&r.sum_ns) as f64 / 1e9);
            fam.sample("_count", &[("type", t)], count);
        }
        let errors = self
            .protocol_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut fam = Family::new(
            out,
            "ferry_nbd_protocol_errors_total",
            "counter",
            "NBD clients that broke the protocol, by what they did.",
        );
        for (what, n) in errors {
            fam.sample("", &[("what", what)], n);
        }
    }
}

fn render_cache(out: &mut String, c: &BlockCacheStats) {
    let counters: [(&'static str, &str, u64); 15] = [
        (
            "ferry_cache_hits_total",
            "Block lookups served from the cache.",
            c.hits,
        ),
        (
            "ferry_cache_misses_total",
            "Blocks a reader filled from the store.",
            c.misses,
        ),
        (
            "ferry_cache_inflight_waits_total",
            "Block lookups that waited for another reader's fill.",
            c.inflight_waits,
        ),
        (
            "ferry_store_reads_total",
            "Reads issued to the store.",
            c.store_reads,
        ),
        (
            "ferry_store_read_bytes_total",
            "Bytes read from the store.",
            c.store_read_bytes,
        ),
        (
            "ferry_cache_evictions_total",
            "Blocks evicted to stay in budget.",
            c.evictions,
        ),
        (
            "ferry_cache_read_ahead_blocks_total",
            "Blocks filled by read-ahead.",
            c.read_ahead_blocks,
        ),
        (
            "ferry_cache_read_ahead_dropped_total",
            "Read-ahead jobs dropped on a full queue.",
            c.read_ahead_dropped,
        ),
        (
            "ferry_cache_read_ahead_errors_total",
            "Read-ahead fills that failed.",
            c.read_ahead_errors,
        ),
        (
            "ferry_cache_read_ahead_used_total",
            "Prefetched blocks that a demand read later used.",
            c.read_ahead_used,
        ),
        (
            "ferry_cache_read_ahead_refused_total",
            "Read-ahead jobs not issued because the chain's read-ahead was not paying off.",
            c.read_ahead_refused,
        ),
        (
            "ferry_cache_block_completions_total",
            "Misses that read the rest of a partly held block read at scattered places.",
            c.completions,
        ),
        (
            "ferry_cache_scan_evictions_total",
            "Blocks evicted because a scan went on past them unread by anyone else.",
            c.scan_evictions,
        ),
        (
            "ferry_cache_buffers_reused_total",
            "Group fills into a reused buffer rather than new memory.",
            c.buffers_reused,
        ),
        (
            "ferry_cache_scan_copies_total",
            "Scan-filled groups read again before the scan window passed them, copied out to stay.",
            c.scan_copies,
        ),
    ];
    for (name, help, v) in counters {
        single(out, name, "counter", help, v);
    }
    let gauges: [(&'static str, &str, u64); 5] = [
        (
            "ferry_cache_bytes",
            "Bytes charged to the cache budget.",
            c.cached_bytes,
        ),
        ("ferry_cache_blocks", "Blocks cached.", c.cached_blocks),
        (
            "ferry_cache_budget_bytes",
            "The cache budget.",
            c.budget_bytes,
        ),
        (
            "ferry_cache_resident_bytes",
            "Bytes of block buffers alive, cached or in flight.",
            c.resident_bytes,
        ),
        (
            "ferry_cache_block_bytes",
            "The cache granule.",
            c.block_bytes,
        ),
    ];
    for (name, help, v) in gauges {
        single(out, name, "gauge", help, v);
    }
}

fn render_registry(out: &mut String, r: &RegistryStats) {
    let mut fam = Family::new(out, "ferry_exports", "gauge", "Exports open now, by mode.");
    for (mode, n) in MODE_LABELS.iter().zip(r.open) {
        fam.sample("", &[("mode", mode)], n);
    }
    let mut fam = Family::new(
        out,
        "ferry_export_opens_total",
        "counter",
        "Export opens, by outcome.",
    );
    let outcomes = [
        ("ok", r.opens_total),
        ("busy", r.busy_total),
        ("not_found", r.not_found_total),
        ("error", r.open_errors_total),
    ];
    for (outcome, n) in outcomes {
        fam.sample("", &[("outcome", outcome)], n);
    }
    let files = r.write_cache_files;
    single(
        out,
        "ferry_write_cache_files",
        "gauge",
        "Write-cache files open now.",
        files,
    );
    let bytes = r.write_cache_bytes;
    single(
        out,
        "ferry_write_cache_bytes",
        "gauge",
        "Bytes on disk of open write caches.",
        bytes,
    );
    let mut fam = Family::new(
        out,
        "ferry_write_cache_written_bytes_total",
        "counter",
        "Bytes written by devices, by export mode.",
    );
    for (mode, n) in MODE_LABELS.iter().zip(r.written_bytes_total).skip(1) {
        fam.sample("", &[("mode", mode)], n);
    }
    single(
        out,
        "ferry_store_scans_total",
        "counter",
        "Store directory scans.",
        r.store_scans,
    );
    single(
        out,
        "ferry_store_vdisks",
        "gauge",
        "vDisks found by the last scan.",
        r.vdisks,
    );
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A sample line: metric name, labels, value.
    type Sample = (String, Vec<(String, String)>, f64);

    fn is_name(s: &str) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    fn parse_value(s: &str) -> Option<f64> {
        match s {
            "+Inf" => Some(f64::INFINITY),
            "-Inf" => Some(f64::NEG_INFINITY),
            "NaN" => Some(f64::NAN),
            _ => s.parse().ok(),
        }
    }

    /// Parses `k="v",k2="v2"` with escapes; `None` when malformed.
    fn parse_labels(mut s: &str) -> Option<Vec<(String, String)>> {
        let mut out = Vec::new();
        while !s.is_empty() {
            let (k, rest) = s.split_once("=\"")?;
            if !is_name(k) || k.contains(':') {
                return None;
            }
            let mut v = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next()? {
                    (_, '\\') => match chars.next()?.1 {
                        '\\' => v.push('\\'),
                        '"' => v.push('"'),
                        'n' => v.push('\n'),
                        _ => return None,
                    },
                    (i, '"') => break i,
                    (_, c) => v.push(c),
                }
            };
            out.push((k.to_string(), v));
            s = &rest[end + 1..];
            s = match s.strip_prefix(',') {
                Some(r) => r,
                None if s.is_empty() => s,
                None => return None,
            };
        }
        Some(out)
    }

    /// Parses the exposition text strictly: every line is HELP, TYPE or a sample of a
    /// family whose TYPE came first. Panics with the line at fault.
    fn parse(text: &str) -> (HashMap<String, String>, Vec<Sample>) {
        let mut types = HashMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect(line);
                assert!(is_name(name) && !help.is_empty(), "{line}");
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect(line);
                assert!(is_name(name), "{line}");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert!(
                    types.insert(name.to_string(), kind.to_string()).is_none(),
                    "{line}"
                );
            } else {
                let (series, value) = line.rsplit_once(' ').expect(line);
                let value = parse_value(value).expect(line);
                let (name, labels) = match series.split_once('{') {
                    Some((n, l)) => (
                        n,
                        parse_labels(l.strip_suffix('}').expect(line)).expect(line),
                    ),
                    None => (series, Vec::new()),
                };
                assert!(is_name(name), "{line}");
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| {
                        name.strip_suffix(s)
                            .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                    })
                    .unwrap_or(name);
                assert!(types.contains_key(family), "sample before its TYPE: {line}");
                samples.push((name.to_string(), labels, value));
            }
        }
        (types, samples)
    }

    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
            .2
    }

    /// Metrics after one connection, two reads (1 ms and 20 ms) and a protocol error.
    fn rendered() -> String {
        let m = Metrics::new();
        m.connection_opened();
        m.request("read", 4096, Duration::from_millis(1), true);
        m.request("read", 8192, Duration::from_millis(20), true);
        m.request("bogus", 1, Duration::from_secs(60), false);
        m.protocol_error("bad \"magic\"\n");
        let cache = BlockCacheStats {
            hits: 7,
            misses: 3,
            store_read_bytes: 196_608,
            ..BlockCacheStats::default()
        };
        let registry = RegistryStats {
            open: [2, 1, 0, 0],
            write_cache_bytes: 4 << 20,
            ..RegistryStats::default()
        };
        m.render(&cache, &registry)
    }

    #[test]
    fn rendered_text_is_valid_exposition_format() {
        let (types, samples) = parse(&rendered());
        assert!(types.len() > 20 && samples.len() > 100);
    }

    #[test]
    fn rendered_values_match_what_was_recorded() {
        let (_, s) = parse(&rendered());
        let got = [
            value(&s, "ferry_nbd_connections", &[]),
            value(&s, "ferry_nbd_requests_total", &[("type", "read")]),
            value(&s, "ferry_nbd_bytes_total", &[("type", "read")]),
            value(&s, "ferry_nbd_requests_total", &[("type", "other")]),
            value(&s, "ferry_cache_hits_total", &[]),
            value(&s, "ferry_cache_misses_total", &[]),
            value(&s, "ferry_store_read_bytes_total", &[]),
            value(&s, "ferry_write_cache_bytes", &[]),
            value(&s, "ferry_exports", &[("mode", "read_only")]),
        ];
        assert_eq!(
            got,
            [
                1.0,
                2.0,
                12288.0,
                1.0,
                7.0,
                3.0,
                196_608.0,
                4_194_304.0,
                2.0
            ]
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() {
        let (_, s) = parse(&rendered());
        let read = |le: &str| {
            value(
                &s,
                "ferry_nbd_request_seconds_bucket",
                &[("type", "read"), ("le", le)],
            )
        };
        let got = [
            read("0.0005"),
            read("0.001"),
            read("0.01"),
            read("0.025"),
            read("+Inf"),
        ];
        assert_eq!(got, [0.0, 1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn request_slower_than_every_bound_is_only_in_inf() {
        let (_, s) = parse(&rendered());
        let other = |le: &str| {
            value(
                &s,
                "ferry_nbd_request_seconds_bucket",
                &[("type", "other"), ("le", le)],
            )
        };
        assert_eq!((other("5"), other("+Inf")), (0.0, 1.0));
    }

    #[test]
    fn protocol_error_label_is_escaped_and_round_trips() {
        let (_, s) = parse(&rendered());
        let v = value(
            &s,
            "ferry_nbd_protocol_errors_total",
            &[("what", "bad \"magic\"\n")],
        );
        assert_eq!(v, 1.0);
    }

    #[test]
    fn protocol_error_kinds_are_capped() {
        let m = Metrics::new();
        let kinds: Vec<&'static str> = (0..100)
            .map(|i| &*Box::leak(format!("kind{i}").into_boxed_str()))
            .collect();
        kinds.iter().for_each(|k| m.protocol_error(k));
        assert_eq!(
            m.protocol_errors.lock().unwrap().len(),
            PROTOCOL_ERROR_KINDS_MAX
        );
    }

    #[test]
    fn close_without_open_does_not_wrap() {
        let m = Metrics::new();
        m.connection_closed();
        assert_eq!(m.connections_open.load(Ordering::Relaxed), 0);
    }
}
