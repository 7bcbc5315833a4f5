//! The API over HTTPS on a real socket: a client trusting the farm's CA gets answers, one
//! trusting another CA does not, a stalled TLS handshake holds up no one else, graceful
//! shutdown still ends the server, and plain HTTP is refused on a non-loopback address.

use std::sync::Arc;
use std::time::SystemTime;

use api::AppState;
use farm::{Farm, FarmConfig};
use pki::Authority;

/// A farm on a temporary SQLite database and its admin token.
async fn farm(dir: &std::path::Path) -> (AppState, String) {
    let config = FarmConfig {
        data_dir: dir.join("data"),
        db_url: None,
        store_root: None,
    };
    let farm = Farm::open(&config).await.expect("open farm");
    let secrets = farm.init("https").await.expect("init farm");
    let state = AppState {
        farm: Arc::new(farm),
        server_id: None,
    };
    (state, secrets.admin_token)
}

/// The CA and a server configuration for 127.0.0.1.
fn tls() -> (Authority, Arc<rustls::ServerConfig>) {
    let now = SystemTime::now();
    let ca = Authority::create("https-test", now).unwrap();
    let srv = ca
        .issue_server("api", &["127.0.0.1".to_string()], now)
        .unwrap();
    let config = pki::server_config(ca.cert_pem(), &srv.cert_pem, &srv.key_pem).unwrap();
    (ca, config)
}

/// A client that trusts only `ca_pem`.
fn client(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap()
}

/// The API over HTTPS on 127.0.0.1; returns its base URL, the stop sender and the task.
async fn start(
    state: AppState,
    config: Arc<rustls::ServerConfig>,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(api::serve_tls(listener, state, config, async {
        let _ = stopped.await;
    }));
    (base, stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_farm_ca_gets_answers_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let (state, token) = farm(dir.path()).await;
    let (ca, config) = tls();
    let (base, stop, task) = start(state, config).await;
    let resp = client(ca.cert_pem())
        .get(format!("{base}/api/v1/farm"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let farm: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(farm["name"], "https", "{farm}");
    // The console is served over the same listener.
    let page = client(ca.cert_pem())
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    // Graceful shutdown ends the server.
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (state, _) = farm(dir.path()).await;
    let (_, config) = tls();
    let (base, _stop, _task) = start(state, config).await;
    let other = Authority::create("other", SystemTime::now()).unwrap();
    let e = client(other.cert_pem())
        .get(format!("{base}/api/v1/openapi.json"))
        .send()
        .await
        .unwrap_err();
    assert!(e.is_connect(), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_holds_up_no_other_client() {
    let dir = tempfile::tempdir().unwrap();
    let (state, _) = farm(dir.path()).await;
    let (ca, config) = tls();
    let (base, _stop, _task) = start(state, config).await;
    // Connected, and silent: its handshake never starts.
    let _silent = tokio::net::TcpStream::connect(base.trim_start_matches("https://"))
        .await
        .unwrap();
    let resp = client(ca.cert_pem())
        .get(format!("{base}/api/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_is_refused_on_a_non_loopback_address() {
    let dir = tempfile::tempdir().unwrap();
    let (state, _) = farm(dir.path()).await;
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let e = api::serve(listener, state, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("not a loopback address"), "{e}");
    assert!(api::tls::check_plain_listen("127.0.0.1:8080".parse().unwrap()).is_ok());
    assert!(api::tls::check_plain_listen("[::1]:8080".parse().unwrap()).is_ok());
    assert!(api::tls::check_plain_listen("10.0.0.5:8080".parse().unwrap()).is_err());
}
