//! Issue 30 (M): idle TCP connections to the HTTPS API hold no TLS handshake slot that a
//! device's request needs. The old listener ran at most 64 handshakes at once, each for up
//! to 10 s, and accepted no one while they were taken: 64 silent connections delayed every
//! login by 10 s, and a few hundred kept the API shut.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use api::AppState;
use farm::{Farm, FarmConfig};
use pki::Authority;

/// A bound that turns a hang into a failure; passing never depends on it.
const PATIENCE: Duration = Duration::from_secs(20);
/// Silent connections: over three rounds of the old listener's 64 handshakes of 10 s, and
/// fewer than the API's connection cap (`budget::files::API_CONNECTIONS_MAX`).
const SILENT: usize = 200;
/// The addresses they come from (127.0.0.10 and up), each under the API's per-address cap.
const SILENT_ADDRESSES: usize = 8;

async fn state(dir: &std::path::Path) -> AppState {
    let config = FarmConfig {
        data_dir: dir.join("data"),
        db_url: None,
        store_root: None,
    };
    let farm = Farm::open(&config).await.expect("open farm");
    farm.init("flood").await.expect("init farm");
    AppState {
        farm: Arc::new(farm),
        server_id: None,
    }
}

async fn silent(to: SocketAddr, i: usize) -> Option<tokio::net::TcpStream> {
    let ip = Ipv4Addr::new(127, 0, 0, 10 + u8::try_from(i % SILENT_ADDRESSES).ok()?);
    let s = tokio::net::TcpSocket::new_v4().ok()?;
    s.bind(SocketAddr::V4(SocketAddrV4::new(ip, 0))).ok()?;
    s.connect(to).await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_do_not_hold_up_a_request_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();
    let ca = Authority::create("flood", now).unwrap();
    let srv = ca
        .issue_server("api", &["127.0.0.1".to_string()], now)
        .unwrap();
    let tls = pki::server_config(ca.cert_pem(), &srv.cert_pem, &srv.key_pem).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    tokio::spawn(api::serve_tls(
        listener,
        state(dir.path()).await,
        tls,
        std::future::pending(),
    ));
    let mut held = Vec::new();
    for i in 0..SILENT {
        held.extend(silent(at, i).await);
    }
    assert_eq!(held.len(), SILENT);
    let client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.cert_pem().as_bytes()).unwrap())
        .local_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .timeout(PATIENCE)
        .build()
        .unwrap();
    for _ in 0..5 {
        let resp = tokio::time::timeout(
            PATIENCE,
            client
                .get(format!("https://{at}/api/v1/openapi.json"))
                .send(),
        )
        .await
        .expect("an answer while silent connections are open")
        .expect("an answer while silent connections are open");
        assert_eq!(resp.status(), 200);
    }
    drop(held);
}
