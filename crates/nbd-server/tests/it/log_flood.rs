//! A flood of refused options and unopenable export names with 4,000-byte names writes a
//! bounded number of short log lines (it once wrote 25.6 MB in 0.2 s), and 20,000 refused
//! options from one client (issue 30, finding M: 12.7 MB in 0.9 s) write a bounded number of
//! bytes, formatted as the server's log would be. One test: it installs the process-wide
//! subscriber that counts the server's log lines and bytes.

use crate::common;

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use common::{Client, Server, Source, tcp};
use contract::refusal_log::{INTERVAL_DEFAULT, LINES_PER_CLIENT_DEFAULT, SUMMARY_CLIENTS_MAX};
use nbd_proto::option::OptionReply;
use nbd_proto::{ClientOption, InfoRequest, NBD_REP_ERR_UNKNOWN};
use nbd_server::{CLIENT_STRING_LOG_MAX, LOG_LINES_PER_WINDOW, LOG_WINDOW, ServerConfig};
use tracing_subscriber::layer::SubscriberExt;

/// Counts the events of the `nbd_server` crate, at every level, and their longest line.
#[derive(Default)]
struct Count {
    lines: AtomicU64,
    longest: AtomicU64,
}

struct CountLayer(Arc<Count>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountLayer {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if !event.metadata().target().starts_with("nbd_server") {
            return;
        }
        let mut f = Fields(String::new());
        event.record(&mut f);
        self.0.lines.fetch_add(1, Ordering::SeqCst);
        self.0.longest.fetch_max(f.0.len() as u64, Ordering::SeqCst);
    }
}

/// Counts the bytes written to it (the formatted log).
#[derive(Clone, Default)]
struct Bytes(Arc<AtomicU64>);

impl std::io::Write for Bytes {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.fetch_add(buf.len() as u64, Ordering::SeqCst);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Refused options from one client, as in finding M.
const REFUSED_OPTIONS: usize = 20_000;
/// Connections they come over (each below `MAX_OPTIONS_PER_HANDSHAKE`).
const CONNECTIONS: usize = 20;
/// A generous length of one formatted log line.
const LINE_BYTES_MAX: u64 = 1024;

/// `n` GOs for a missing export and `n` unknown options, pipelined on one connection.
fn refused_options(srv: &Server, n: usize) {
    let mut c = Client::greet(tcp(srv.addr));
    for _ in 0..n / 2 {
        c.option(&ClientOption::Go(InfoRequest {
            name: "missing".into(),
            requests: vec![],
        }));
        c.option(&ClientOption::Unknown(0x7fff));
    }
    for _ in 0..n / 2 * 2 {
        let last = c.option_replies().pop();
        assert!(matches!(last, Some(OptionReply::Error { .. })), "{last:?}");
    }
}

#[test]
fn a_flood_of_bad_export_names_logs_a_bounded_number_of_short_lines() {
    let count = Arc::new(Count::default());
    let bytes = Bytes::default();
    let writer = bytes.clone();
    let subscriber = tracing_subscriber::registry()
        .with(CountLayer(Arc::clone(&count)))
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || writer.clone()),
        );
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let srv = Server::start(Source::new(), ServerConfig::default());
    let name = "x".repeat(4000);
    let start = Instant::now();
    // 2,000 refused GOs over 10 connections.
    for _ in 0..10 {
        let mut c = Client::greet(tcp(srv.addr));
        for _ in 0..200 {
            let go = ClientOption::Go(InfoRequest {
                name: name.clone(),
                requests: vec![],
            });
            assert_eq!(c.ask(&go), Err(NBD_REP_ERR_UNKNOWN));
        }
    }
    // 200 connections closed over an unopenable NBD_OPT_EXPORT_NAME.
    for _ in 0..200 {
        let mut c = Client::greet(tcp(srv.addr));
        c.option(&ClientOption::ExportName(name.clone()));
        assert!(c.closed());
    }
    let elapsed = start.elapsed();
    let mut srv = srv;
    srv.stop();
    // Per kind, at most the window's budget plus one "suppressed" line per window.
    let windows = (elapsed.as_secs_f64() / LOG_WINDOW.as_secs_f64()).ceil() as u64 + 1;
    let kinds = 3;
    let bound = windows * kinds * (u64::from(LOG_LINES_PER_WINDOW) + 1);
    let lines = count.lines.load(Ordering::SeqCst);
    // The refusals are logged (a budget's worth), so the counter does see the server's lines.
    assert!(lines >= u64::from(LOG_LINES_PER_WINDOW), "{lines} lines");
    assert!(
        lines <= bound,
        "{lines} lines in {elapsed:?} (bound {bound})"
    );
    let longest = count.longest.load(Ordering::SeqCst);
    assert!(
        longest < 3 * CLIENT_STRING_LOG_MAX as u64 + 200,
        "a line of {longest} bytes"
    );
    // Finding M: 20,000 refused options from one client, on a fresh server.
    let srv = Server::start(Source::new(), ServerConfig::default());
    let bytes_before = bytes.0.load(Ordering::SeqCst);
    let start = Instant::now();
    for _ in 0..CONNECTIONS {
        refused_options(&srv, REFUSED_OPTIONS / CONNECTIONS);
    }
    let elapsed = start.elapsed();
    let logged = bytes.0.load(Ordering::SeqCst) - bytes_before;
    eprintln!("{REFUSED_OPTIONS} refused options in {elapsed:?}: {logged} bytes of log");
    // Per interval the client's lines and the summaries; per connection a line or two.
    let intervals = elapsed
        .as_secs_f64()
        .div_euclid(INTERVAL_DEFAULT.as_secs_f64()) as u64
        + 2;
    let per_interval = u64::from(LINES_PER_CLIENT_DEFAULT) + SUMMARY_CLIENTS_MAX as u64 + 1;
    let bound = (intervals * per_interval + 2 * CONNECTIONS as u64) * LINE_BYTES_MAX;
    assert!(logged <= bound, "{logged} bytes of log (bound {bound})");
    assert!(nbd_server::refusal_totals().refused >= REFUSED_OPTIONS as u64);
}
