//! The metrics endpoint over loopback TCP, spoken to with raw HTTP/1.x: what a scraper and a
//! stray client get back (status line, content type, body) and that every answer closes the
//! connection, as the hand-written endpoint before it did.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use server::http::{Render, serve_metrics};

/// How long a test waits for an answer; a connection left open fails the read.
const WAIT: Duration = Duration::from_secs(15);
/// What the stand-in render returns.
const BODY: &str = "ferry_test_metric 1\n";

/// The endpoint on 127.0.0.1:0 in its own runtime; dropping it stops the endpoint.
struct Endpoint {
    port: u16,
    _stop: tokio::sync::oneshot::Sender<()>,
    _rt: tokio::runtime::Runtime,
}

impl Endpoint {
    fn start() -> Endpoint {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let render: Render = Arc::new(|| BODY.to_string());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(serve_metrics(listener, render, stopped));
        Endpoint {
            port,
            _stop: stop,
            _rt: rt,
        }
    }

    /// Sends `request` (shutting down the write side after it if `half_close`) and returns
    /// everything read until the server closes.
    fn send(&self, request: &[u8], half_close: bool) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("read timeout");
        s.write_all(request).expect("write request");
        if half_close {
            s.shutdown(Shutdown::Write).expect("shutdown write");
        }
        let mut response = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
                // A server closing with request bytes unread resets the connection: closed
                // all the same (a timeout is not, and fails here).
                Err(e) if e.kind() == ErrorKind::ConnectionReset && !response.is_empty() => break,
                Err(e) => panic!("the server answers and closes: {e}"),
            }
        }
        String::from_utf8(response).expect("a UTF-8 response")
    }

    /// The status line and the body of the answer to `request`.
    fn status_and_body(&self, request: &[u8]) -> (String, String) {
        let response = self.send(request, false);
        let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
        let status = head.lines().next().unwrap_or_default().to_string();
        (status, body.to_string())
    }
}

#[test]
fn get_metrics_answers_the_exposition_with_its_content_type() {
    let ep = Endpoint::start();
    let response = ep.send(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n", false);
    let expected = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    assert_eq!(response, expected);
}

#[test]
fn query_string_is_ignored() {
    let ep = Endpoint::start();
    let got = ep.status_and_body(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n");
    assert_eq!(got, ("HTTP/1.1 200 OK".into(), BODY.into()));
}

#[test]
fn head_metrics_answers_the_length_without_a_body() {
    let ep = Endpoint::start();
    let response = ep.send(b"HEAD /metrics HTTP/1.1\r\n\r\n", false);
    let length = format!("Content-Length: {}\r\n", BODY.len());
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains(&length), "{response}");
    assert!(response.ends_with("\r\n\r\n"), "{response}");
}

#[test]
fn a_client_that_half_closes_after_its_request_still_gets_the_answer() {
    let ep = Endpoint::start();
    let response = ep.send(b"GET /metrics HTTP/1.1\r\n\r\n", true);
    assert!(response.ends_with(BODY), "{response}");
}

#[test]
fn other_path_is_not_found() {
    let ep = Endpoint::start();
    let got = ep.status_and_body(b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(
        got,
        ("HTTP/1.1 404 Not Found".into(), "try /metrics\n".into())
    );
}

#[test]
fn post_is_not_allowed_on_any_path() {
    let ep = Endpoint::start();
    let metrics = ep.status_and_body(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    let other = ep.status_and_body(b"POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    let expected = (
        "HTTP/1.1 405 Method Not Allowed".to_string(),
        "GET only\n".to_string(),
    );
    assert_eq!((metrics, other), (expected.clone(), expected));
}

#[test]
fn garbage_is_a_bad_request() {
    let ep = Endpoint::start();
    let (status, _) = ep.status_and_body(b"\x16\x03\x01\x00garbage\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 400 Bad Request");
}

#[test]
fn a_request_head_over_the_limit_is_refused() {
    let ep = Endpoint::start();
    let filler = "a".repeat(server::http::REQUEST_HEAD_BYTES_MAX);
    let request = format!("GET /metrics HTTP/1.1\r\nX-Filler: {filler}\r\n\r\n");
    let (status, _) = ep.status_and_body(request.as_bytes());
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
}
