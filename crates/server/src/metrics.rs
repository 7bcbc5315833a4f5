//! Server metrics: the [`NbdMetrics`] sink (atomic counters and fixed-bucket latency
//! histograms per request type) and the Prometheus text exposition of everything, including
//! the block cache's and the registry's counters.
//!
//! Request types are a fixed set ([`REQUEST_TYPES`]; anything else counts as `other`), so
//! recording is lock-free and the number of series is bounded whatever a client sends.
//! Protocol-error kinds are `&'static str`s chosen by the server's code, kept in a small
//! table capped at [`PROTOCOL_ERROR_KINDS_MAX`].
//!
//! # Design notes
//!
//! The exposition is written by the `prometheus-client` crate in the Prometheus text format
//! 0.0.4 ([`prometheus_text`]), the format (and so the content type) the endpoint has always
//! served: counters keep their `_total` in `# TYPE`, and there is no OpenMetrics `# EOF`.
//! The crate adds `_total` to a counter's name and a full stop to its help, so counters are
//! registered without the one and every help text without the other.
//!
//! ```text
//!   NBD task ── request(kind, ..) ──► [Counter; 8] requests, bytes: an atomic add each
//!                                     ([Counter; 8] errors too, for a failed request)
//!                                     [LatencyHistogram; 8]: a bucket add and a sum add
//!   scrape ── render(cache, registry) ──► live Registry (those handles, registered once)
//!                                         + a per-scrape Registry of the two snapshots
//! ```
//!
//! `request()` runs once per NBD request, so it never looks anything up: every series it
//! touches is resolved when [`Metrics`] is built and kept in arrays indexed by
//! `RequestType`. The crate's `Family` is not used for the fixed label sets: it is a
//! `HashMap` behind a lock (a lookup per request otherwise, and a random series order per
//! process at scrape). `Labeled` holds the series of one family in the order they were
//! always exposed. The crate's `Histogram` takes a write lock per observation, so the latency
//! histogram is `LatencyHistogram`: per-bucket atomics, encoded through the crate's
//! histogram encoder. The block cache and the registry keep their own counters; each scrape
//! passes a snapshot, exposed as constant metrics.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use block_cache::BlockCacheStats;
use nbd_server::NbdMetrics;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

use crate::exports::{MODE_LABELS, RegistryStats};

/// The request types with their own series (the `type` label's values); the last one takes
/// every other kind.
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

/// A request type with its own series, in [`REQUEST_TYPES`] order: the index of the
/// hot path's arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestType {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    BlockStatus,
    Cache,
    Other,
}

impl RequestType {
    /// The type of an [`NbdMetrics::request`] kind; unknown kinds are [`RequestType::Other`].
    fn from_kind(kind: &str) -> RequestType {
        match kind {
            "read" => RequestType::Read,
            "write" => RequestType::Write,
            "flush" => RequestType::Flush,
            "trim" => RequestType::Trim,
            "write_zeroes" => RequestType::WriteZeroes,
            "block_status" => RequestType::BlockStatus,
            "cache" => RequestType::Cache,
            _ => RequestType::Other,
        }
    }
}

/// The bucket of `latency`: the first bound it does not exceed, or the overflow slot
/// (`LATENCY_BUCKETS_SECONDS.len()`) when it is slower than every bound.
fn bucket_index(latency: Duration) -> usize {
    let s = latency.as_secs_f64();
    LATENCY_BUCKETS_SECONDS
        .iter()
        .position(|&b| s <= b)
        .unwrap_or(LATENCY_BUCKETS_SECONDS.len())
}

/// A latency histogram over [`LATENCY_BUCKETS_SECONDS`] recorded with relaxed atomic adds.
/// Clones share the counts (the registry holds one clone, [`Metrics`] another).
#[derive(Debug, Clone, Default)]
struct LatencyHistogram(Arc<LatencyCounts>);

#[derive(Debug, Default)]
struct LatencyCounts {
    /// Per-bucket (not cumulative) counts; the last slot counts requests slower than every
    /// bound, so the sum of all slots is the histogram's count.
    buckets: [AtomicU64; LATENCY_BUCKETS_SECONDS.len() + 1],
    /// Nanoseconds, for `_sum` (in seconds).
    sum_ns: AtomicU64,
}

impl LatencyHistogram {
    fn observe(&self, latency: Duration) {
        self.0.buckets[bucket_index(latency)].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.0.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut buckets = [(0.0, 0); LATENCY_BUCKETS_SECONDS.len()];
        for ((slot, bound), n) in buckets
            .iter_mut()
            .zip(LATENCY_BUCKETS_SECONDS)
            .zip(&self.0.buckets)
        {
            *slot = (bound, load(n));
        }
        let count = self.0.buckets.iter().map(load).sum();
        // The encoder makes the counts cumulative and adds `+Inf` with `count`.
        let sum = load(&self.0.sum_ns) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// One family whose label values are fixed: one label, its values, and the series of each,
/// encoded in that order.
#[derive(Debug)]
struct Labeled<M> {
    label: &'static str,
    series: Vec<(&'static str, M)>,
}

impl<M> Labeled<M> {
    fn new(label: &'static str, series: impl IntoIterator<Item = (&'static str, M)>) -> Self {
        Labeled {
            label,
            series: series.into_iter().collect(),
        }
    }
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Labeled<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (value, metric) in &self.series {
            let labels = [(self.label, *value)];
            metric.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// Protocol errors by what the client did: first-seen order, at most
/// [`PROTOCOL_ERROR_KINDS_MAX`] kinds (the last one `other`). Only a misbehaving client
/// records here, so a lock is fine. Clones share the table.
#[derive(Debug, Clone, Default)]
struct ProtocolErrors(Arc<Mutex<Vec<(&'static str, u64)>>>);

impl ProtocolErrors {
    fn record(&self, what: &'static str) {
        let mut t = self.0.lock().unwrap_or_else(PoisonError::into_inner);
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

    fn snapshot(&self) -> Vec<(&'static str, u64)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl TypedMetric for ProtocolErrors {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for ProtocolErrors {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let series = self
            .snapshot()
            .into_iter()
            .map(|(what, n)| (what, ConstCounter::new(n)));
        Labeled::new("what", series).encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// `connection_closed` decrements it saturating, through the atomic itself.
    connections_open: Gauge<u64, AtomicU64>,
    connections_total: Counter,
    /// The request metrics by [`RequestType`]: handles shared with `registry`.
    requests: [Counter; REQUEST_TYPES.len()],
    request_errors: [Counter; REQUEST_TYPES.len()],
    bytes: [Counter; REQUEST_TYPES.len()],
    latency: [LatencyHistogram; REQUEST_TYPES.len()],
    protocol_errors: ProtocolErrors,
    /// Everything above, registered once in exposition order; each scrape encodes it.
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Registers one metric per request type under `name` and returns the handles.
fn per_type<M: Metric + TypedMetric + Clone + Default>(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> [M; REQUEST_TYPES.len()] {
    let handles: [M; REQUEST_TYPES.len()] = std::array::from_fn(|_| M::default());
    let series = REQUEST_TYPES.into_iter().zip(handles.iter().cloned());
    registry.register(name, help, Labeled::new("type", series));
    handles
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let connections_open = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "ferry_nbd_connections",
            "NBD connections open now",
            connections_open.clone(),
        );
        let connections_total = Counter::default();
        registry.register(
            "ferry_nbd_connections",
            "NBD connections accepted",
            connections_total.clone(),
        );
        let requests = per_type(
            &mut registry,
            "ferry_nbd_requests",
            "NBD requests completed, by type",
        );
        let request_errors = per_type(
            &mut registry,
            "ferry_nbd_request_errors",
            "NBD requests that failed, by type",
        );
        let bytes = per_type(
            &mut registry,
            "ferry_nbd_bytes",
            "NBD payload bytes, by request type",
        );
        let latency = per_type(
            &mut registry,
            "ferry_nbd_request_seconds",
            "NBD request latency from receipt to reply, by type",
        );
        let protocol_errors = ProtocolErrors::default();
        registry.register(
            "ferry_nbd_protocol_errors",
            "NBD clients that broke the protocol, by what they did",
            protocol_errors.clone(),
        );
        Metrics {
            connections_open,
            connections_total,
            requests,
            request_errors,
            bytes,
            latency,
            protocol_errors,
            registry,
        }
    }

    /// Everything in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self, cache: &BlockCacheStats, registry: &RegistryStats) -> String {
        let mut out = String::with_capacity(16 << 10);
        let snapshot = snapshot_registry(cache, registry);
        let encoded = prometheus_text::encode(&mut out, &self.registry)
            .and_then(|()| prometheus_text::encode(&mut out, &snapshot));
        if encoded.is_err() {
            // Writing to a `String` cannot fail and the metrics here only forward to the
            // crate's encoders, so this is a bug; a scrape must not take the server down.
            tracing::error!("metrics encoding failed");
        }
        out
    }
}

impl NbdMetrics for Metrics {
    fn connection_opened(&self) {
        self.connections_open.inc();
        self.connections_total.inc();
    }

    fn connection_closed(&self) {
        // Saturating: a close without an open must not wrap the gauge to 2^64.
        let _ =
            self.connections_open
                .inner()
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(1))
                });
    }

    fn request(&self, kind: &'static str, bytes: u64, latency: Duration, ok: bool) {
        let t = RequestType::from_kind(kind) as usize;
        self.requests[t].inc();
        if !ok {
            self.request_errors[t].inc();
        }
        self.bytes[t].inc_by(bytes);
        self.latency[t].observe(latency);
    }

    fn protocol_error(&self, what: &'static str) {
        self.protocol_errors.record(what);
    }
}

/// The block cache's and the registry's counters as constant metrics, in exposition order.
fn snapshot_registry(c: &BlockCacheStats, r: &RegistryStats) -> Registry {
    let mut reg = Registry::default();
    let counters: [(&str, &str, u64); 16] = [
        (
            "ferry_cache_probes",
            "Reads looked up in the cache without waiting (one per request tried in memory)",
            c.probes,
        ),
        (
            "ferry_cache_hits",
            "Block lookups served from the cache",
            c.hits,
        ),
        (
            "ferry_cache_misses",
            "Blocks a reader filled from the store",
            c.misses,
        ),
        (
            "ferry_cache_inflight_waits",
            "Block lookups that waited for another reader's fill",
            c.inflight_waits,
        ),
        (
            "ferry_store_reads",
            "Reads issued to the store",
            c.store_reads,
        ),
        (
            "ferry_store_read_bytes",
            "Bytes read from the store",
            c.store_read_bytes,
        ),
        (
            "ferry_cache_evictions",
            "Blocks evicted to stay in budget",
            c.evictions,
        ),
        (
            "ferry_cache_read_ahead_blocks",
            "Blocks filled by read-ahead",
            c.read_ahead_blocks,
        ),
        (
            "ferry_cache_read_ahead_dropped",
            "Read-ahead jobs dropped on a full queue",
            c.read_ahead_dropped,
        ),
        (
            "ferry_cache_read_ahead_errors",
            "Read-ahead fills that failed",
            c.read_ahead_errors,
        ),
        (
            "ferry_cache_read_ahead_used",
            "Prefetched blocks that a demand read later used",
            c.read_ahead_used,
        ),
        (
            "ferry_cache_read_ahead_refused",
            "Read-ahead jobs not issued because the chain's read-ahead was not paying off",
            c.read_ahead_refused,
        ),
        (
            "ferry_cache_block_completions",
            "Misses that read the rest of a partly held block read at scattered places",
            c.completions,
        ),
        (
            "ferry_cache_scan_evictions",
            "Blocks evicted because a scan went on past them unread by anyone else",
            c.scan_evictions,
        ),
        (
            "ferry_cache_buffers_reused",
            "Group fills into a reused buffer rather than new memory",
            c.buffers_reused,
        ),
        (
            "ferry_cache_scan_copies",
            "Scan-filled groups read again before the scan window passed them, copied out to stay",
            c.scan_copies,
        ),
    ];
    for (name, help, v) in counters {
        reg.register(name, help, ConstCounter::new(v));
    }
    let gauges: [(&str, &str, u64); 5] = [
        (
            "ferry_cache_bytes",
            "Bytes charged to the cache budget",
            c.cached_bytes,
        ),
        ("ferry_cache_blocks", "Blocks cached", c.cached_blocks),
        (
            "ferry_cache_budget_bytes",
            "The cache budget",
            c.budget_bytes,
        ),
        (
            "ferry_cache_resident_bytes",
            "Bytes of block buffers alive, cached or in flight",
            c.resident_bytes,
        ),
        (
            "ferry_cache_block_bytes",
            "The cache granule",
            c.block_bytes,
        ),
    ];
    for (name, help, v) in gauges {
        reg.register(name, help, ConstGauge::new(v));
    }
    register_registry(&mut reg, r);
    reg
}

fn register_registry(reg: &mut Registry, r: &RegistryStats) {
    let open = MODE_LABELS.into_iter().zip(r.open.map(ConstGauge::new));
    reg.register(
        "ferry_exports",
        "Exports open now, by mode",
        Labeled::new("mode", open),
    );
    let outcomes = [
        ("ok", r.opens_total),
        ("busy", r.busy_total),
        ("not_found", r.not_found_total),
        ("error", r.open_errors_total),
    ];
    reg.register(
        "ferry_export_opens",
        "Export opens, by outcome",
        Labeled::new("outcome", outcomes.map(|(o, n)| (o, ConstCounter::new(n)))),
    );
    let refusals = nbd_server::refusal_totals();
    reg.register(
        "ferry_nbd_option_refusals",
        "NBD options refused (unknown, malformed, export refused, TLS first)",
        ConstCounter::new(refusals.refused),
    );
    reg.register(
        "ferry_nbd_refusal_logs_suppressed",
        "Log lines about refused NBD options left out by the per-client log limit",
        ConstCounter::new(refusals.suppressed),
    );
    reg.register(
        "ferry_write_cache_files",
        "Write-cache files open now",
        ConstGauge::new(r.write_cache_files),
    );
    reg.register(
        "ferry_write_cache_bytes",
        "Bytes on disk of open write caches",
        ConstGauge::new(r.write_cache_bytes),
    );
    // Read-only exports write nothing: no series for them.
    let written = MODE_LABELS
        .into_iter()
        .zip(r.written_bytes_total.map(ConstCounter::new))
        .skip(1);
    reg.register(
        "ferry_write_cache_written_bytes",
        "Bytes written by devices, by export mode",
        Labeled::new("mode", written),
    );
    reg.register(
        "ferry_store_scans",
        "Store directory scans",
        ConstCounter::new(r.store_scans),
    );
    reg.register(
        "ferry_store_vdisks",
        "vDisks found by the last scan",
        ConstGauge::new(r.vdisks),
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
        assert_eq!(m.protocol_errors.snapshot().len(), PROTOCOL_ERROR_KINDS_MAX);
    }

    #[test]
    fn each_request_type_label_maps_to_its_own_index() {
        let got: Vec<usize> = REQUEST_TYPES
            .iter()
            .map(|k| RequestType::from_kind(k) as usize)
            .collect();
        assert_eq!(got, (0..REQUEST_TYPES.len()).collect::<Vec<_>>());
    }

    #[test]
    fn close_without_open_does_not_wrap() {
        let m = Metrics::new();
        m.connection_closed();
        assert_eq!(m.connections_open.get(), 0);
    }
}
