//! A flood of refused options and unopenable export names with 4,000-byte names writes a
//! bounded number of short log lines (it once wrote 25.6 MB in 0.2 s). One test: it installs
//! the process-wide subscriber that counts the server's log lines.

mod common;

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use common::{Client, Server, Source, tcp};
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

#[test]
fn a_flood_of_bad_export_names_logs_a_bounded_number_of_short_lines() {
    let count = Arc::new(Count::default());
    let subscriber = tracing_subscriber::registry().with(CountLayer(Arc::clone(&count)));
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
}
