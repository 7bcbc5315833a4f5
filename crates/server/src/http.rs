//! The HTTP/1.1 endpoint for Prometheus: `GET /metrics` (or `HEAD`) answers with the text
//! exposition format, another path with 404 and another method with 405, and every response
//! closes the connection.
//!
//! hyper parses requests and writes responses; axum turns a request into a response through
//! the pure [`route`]. What is kept from a general HTTP server is bounded: a request head of
//! at most [`REQUEST_HEAD_BYTES_MAX`] bytes (hyper answers a larger one with 431), sent
//! within [`REQUEST_TIMEOUT`], one request per connection (no keep-alive), and at most
//! [`CONNECTIONS_MAX`] clients at once. A request hyper cannot parse gets 400.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};

/// The longest request head read (request line and headers); hyper's smallest read buffer.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 << 10;
/// How long a client may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long writing a response may take.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most metrics clients served at once; further ones are closed at once.
pub const CONNECTIONS_MAX: usize = budget::files::METRICS_CONNECTIONS_MAX;
/// The Prometheus text exposition content type (format version 0.0.4).
pub const METRICS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` or `HEAD /metrics` (hyper sends no body for `HEAD`).
    Metrics,
    /// GET or HEAD on another path.
    NotFound,
    /// A method other than GET or HEAD, on any path.
    MethodNotAllowed,
}

/// Routes a request from its method and path (the query is not part of the path). Pure.
pub fn route(method: &Method, path: &str) -> Route {
    if method != Method::GET && method != Method::HEAD {
        Route::MethodNotAllowed
    } else if path == "/metrics" {
        Route::Metrics
    } else {
        Route::NotFound
    }
}

/// Renders the metrics text; called on the blocking pool for each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The metrics endpoint's default gate: [`CONNECTIONS_MAX`] connections,
/// [`budget::METRICS_PER_ADDRESS_MAX`] from one address, loopback included.
pub fn default_gate() -> Arc<budget::Gate> {
    budget::Gate::new(budget::GateConfig {
        name: "metrics",
        connections_max: CONNECTIONS_MAX,
        per_address_max: budget::METRICS_PER_ADDRESS_MAX,
        loopback_exempt: false,
        evict_for_newcomers: true,
    })
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes, behind
/// [`default_gate`]. Requests in progress are abandoned at shutdown (a scrape is
/// idempotent).
pub async fn serve_metrics(listener: TcpListener, render: Render, shutdown: impl Future) {
    serve_metrics_in(listener, render, default_gate(), shutdown).await;
}

/// [`serve_metrics`] behind `gate`.
pub async fn serve_metrics_in(
    listener: TcpListener,
    render: Render,
    gate: Arc<budget::Gate>,
    shutdown: impl Future,
) {
    let app = Router::new().fallback(answer).with_state(render);
    let accept = async {
        loop {
            let (stream, peer, ticket) = budget::accept(&listener, &gate).await;
            let app = app.clone();
            tokio::spawn(async move {
                let r = tokio::select! {
                    r = serve_connection(stream, app) => r,
                    // Closed to admit an address holding fewer (the gate's eviction).
                    () = ticket.evicted() => Ok(()),
                };
                if let Err(e) = r {
                    if e.kind() == std::io::ErrorKind::TimedOut {
                        ticket.gate().note_timeout();
                    }
                    tracing::debug!(%peer, error = %e, "metrics client failed");
                }
                drop(ticket);
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = shutdown => tracing::debug!("metrics endpoint shutting down"),
    }
}

/// Serves one request on `stream`, then closes it.
async fn serve_connection(stream: TcpStream, app: Router) -> std::io::Result<()> {
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .max_buf_size(REQUEST_HEAD_BYTES_MAX)
        .keep_alive(false)
        // A client may shut down its side once the request is sent; it still gets its answer.
        .half_close(true)
        // The response head stays as it always was: no `Date`, header names in title case.
        .auto_date_header(false)
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    // The head has its own timeout; this bounds rendering plus writing the response.
    tokio::time::timeout(REQUEST_TIMEOUT + RESPONSE_TIMEOUT, conn)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "response"))?
        .map_err(std::io::Error::other)
}

async fn answer(State(render): State<Render>, method: Method, uri: Uri) -> Response {
    let text = |status, body: &'static str| {
        (status, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
    };
    match route(&method, uri.path()) {
        Route::Metrics => match tokio::task::spawn_blocking(move || render()).await {
            Ok(body) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response(),
            Err(e) => {
                tracing::error!(error = %e, "metrics render failed");
                text(StatusCode::INTERNAL_SERVER_ERROR, "render failed\n")
            }
        },
        Route::NotFound => text(StatusCode::NOT_FOUND, "try /metrics\n"),
        Route::MethodNotAllowed => text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_metrics_routes_to_metrics() {
        assert_eq!(route(&Method::GET, "/metrics"), Route::Metrics);
    }

    #[test]
    fn head_metrics_routes_to_metrics() {
        assert_eq!(route(&Method::HEAD, "/metrics"), Route::Metrics);
    }

    #[test]
    fn other_path_is_not_found() {
        assert_eq!(route(&Method::GET, "/"), Route::NotFound);
    }

    #[test]
    fn post_is_not_allowed() {
        assert_eq!(route(&Method::POST, "/metrics"), Route::MethodNotAllowed);
    }

    #[test]
    fn post_elsewhere_is_not_allowed_either() {
        assert_eq!(route(&Method::POST, "/x"), Route::MethodNotAllowed);
    }
}
