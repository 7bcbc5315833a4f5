//! A tiny HTTP/1.1 endpoint for Prometheus: `GET /metrics` answers with the text exposition
//! format, anything else with 404/405/400, and every response closes the connection.
//!
//! What it is not: a general HTTP server. It reads one request head of at most
//! [`REQUEST_HEAD_BYTES_MAX`] bytes within [`REQUEST_TIMEOUT`], ignores headers and bodies,
//! and serves at most [`CONNECTIONS_MAX`] clients at once. That is all a scraper needs, and
//! it keeps a web framework (and its dependency tree) out of the server. The request line is
//! parsed by the pure [`parse_request_head`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// The longest request head read (request line and headers).
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 << 10;
/// How long a client may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long writing a response may take.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most metrics clients served at once; further ones wait in the accept queue.
pub const CONNECTIONS_MAX: usize = 16;
/// The Prometheus text exposition content type.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (or `HEAD`, answered without a body).
    Metrics {
        /// True for `HEAD`.
        head: bool,
    },
    /// A known method on another path.
    NotFound,
    /// A method other than GET or HEAD.
    MethodNotAllowed,
    /// Not an HTTP/1.x request line.
    BadRequest,
}

/// Routes a request from its head (the bytes up to the first `\r\n` suffice). Pure.
pub fn parse_request_head(head: &[u8]) -> Route {
    let line_end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Route::BadRequest;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Route::BadRequest;
    }
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Route::MethodNotAllowed,
    };
    let path = target.split('?').next().unwrap_or(target);
    if path == "/metrics" {
        Route::Metrics { head }
    } else {
        Route::NotFound
    }
}

/// Renders the metrics text; called on the blocking pool for each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` on `listener` until `shutdown` completes. Requests in progress are
/// abandoned at shutdown (a scrape is idempotent).
pub async fn serve_metrics(listener: TcpListener, render: Render, shutdown: impl Future) {
    let limit = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let accept = async {
        loop {
            let Ok(permit) = Arc::clone(&limit).acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let render = Arc::clone(&render);
                    tokio::spawn(async move {
                        if let Err(e) = handle(stream, render).await {
                            tracing::debug!(%peer, error = %e, "metrics client failed");
                        }
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    };
    tokio::select! {
        () = accept => {}
        _ = shutdown => tracing::debug!("metrics endpoint shutting down"),
    }
}

/// Reads the request head until its blank line, the size cap, or the client's EOF.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while head.len() < REQUEST_HEAD_BYTES_MAX && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    head.truncate(REQUEST_HEAD_BYTES_MAX);
    Ok(head)
}

async fn handle(mut stream: TcpStream, render: Render) -> std::io::Result<()> {
    let head = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head"))??;
    let (status, content_type, body, send_body) = match parse_request_head(&head) {
        Route::Metrics { head } => {
            let text = tokio::task::spawn_blocking(move || render())
                .await
                .map_err(std::io::Error::other)?;
            ("200 OK", METRICS_CONTENT_TYPE, text, !head)
        }
        Route::NotFound => ("404 Not Found", "text/plain", "try /metrics\n".into(), true),
        Route::MethodNotAllowed => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".into(),
            true,
        ),
        Route::BadRequest => (
            "400 Bad Request",
            "text/plain",
            "bad request\n".into(),
            true,
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if send_body {
        response.extend_from_slice(body.as_bytes());
    }
    let write = async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(RESPONSE_TIMEOUT, write)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "response"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_metrics_routes_to_metrics() {
        let r = parse_request_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r, Route::Metrics { head: false });
    }

    #[test]
    fn head_metrics_routes_to_metrics_without_body() {
        let r = parse_request_head(b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert_eq!(r, Route::Metrics { head: true });
    }

    #[test]
    fn query_string_is_ignored() {
        let r = parse_request_head(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n");
        assert_eq!(r, Route::Metrics { head: false });
    }

    #[test]
    fn other_path_is_not_found() {
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\r\n\r\n"),
            Route::NotFound
        );
    }

    #[test]
    fn post_is_not_allowed() {
        let r = parse_request_head(b"POST /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(r, Route::MethodNotAllowed);
    }

    #[test]
    fn garbage_is_bad_request() {
        assert_eq!(parse_request_head(b"\x16\x03\x01\x00"), Route::BadRequest);
    }

    #[test]
    fn truncated_line_is_bad_request() {
        assert_eq!(parse_request_head(b"GET /metrics"), Route::BadRequest);
    }
}
