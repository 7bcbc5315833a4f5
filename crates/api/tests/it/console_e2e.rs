//! The web console end to end: the API (with the console) over HTTPS on a loopback port,
//! its certificate issued by a test farm CA, over a temporary SQLite farm with a demo vDisk, a device logged in through the real device-login
//! API (HMAC of the challenge under the farm key) whose counters are reported while the test
//! runs, and Debian's headless Chromium driven by playwright-core (web/e2e/console.e2e.mjs):
//! log in with a token, create a version, promote it twice, see the device connected with its
//! server, version, cache mode and growing byte counters, and the throughput chart.
//! Chromium trusts exactly the server's key (`--ignore-certificate-errors-spki-list` with
//! the SHA-256 of its SubjectPublicKeyInfo), not every certificate.
//!
//! Needs /usr/bin/chromium (or FERRY_CHROMIUM), node, and web/e2e/node_modules (scripts/test.sh
//! runs `npm ci` there). A missing one skips the test with a printed reason on a developer's
//! machine and FAILS it under CI=true (STYLE.md §6). Screenshots of every screen go to
//! target/console-e2e/ (failure.png when a check fails).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use api::AppState;
use base64::Engine as _;
use farm::{Farm, FarmConfig};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

const MAC: &str = "52:54:00:12:34:56";
const VDISK: &str = "golden";
const SERVER: &str = "pvs-1";
/// A server that registered two minutes ago and is silent since: the console offers to
/// remove it (issue 31).
const GONE_SERVER: &str = "pvs-gone";
/// Where `SERVER` is registered: the NBD address login hands the device, which a target
/// reports as the server it streams from.
const SERVER_ADDRESS: &str = "127.0.0.1:10809";
const SITE: &str = "hq";
const COLLECTION: &str = "lab";
/// The name of the token the browser uses: versions it makes name it as their author.
const TOKEN_NAME: &str = "console-e2e";
/// The whole browser run, launch included.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(180);

fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Chromium's path, or `None` (skip) when a tool is missing off CI.
fn tools() -> Option<PathBuf> {
    let chromium = std::env::var_os("FERRY_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    let node = Command::new("node").arg("--version").output();
    let playwright = repo_root().join("web/e2e/node_modules/playwright-core/package.json");
    let missing = if !chromium.exists() {
        Some(format!("{} (apt-get install chromium)", chromium.display()))
    } else if !node.is_ok_and(|o| o.status.success()) {
        Some("node (apt-get install nodejs)".to_string())
    } else if !playwright.exists() {
        Some("playwright-core (npm ci --prefix web/e2e)".to_string())
    } else {
        None
    };
    match missing {
        None => Some(chromium),
        Some(m) if on_ci() => panic!("{m} is required under CI=true (scripts/test.sh installs it)"),
        Some(m) => {
            eprintln!("SKIPPED: {m} is missing");
            None
        }
    }
}

/// Chromium's `--ignore-certificate-errors-spki-list` entry for a certificate: the base64
/// SHA-256 of its SubjectPublicKeyInfo.
fn spki_sha256_base64(cert_pem: &str) -> String {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    let spki = cert.tbs_certificate.subject_pki.raw;
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(spki))
}

/// A client that trusts only the farm's CA.
fn https_client(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap()
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap()
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.send(reqwest::Method::GET, path, None).await
    }
}

/// The farm's clock in this test: the system's, moved back while the gone server registers.
#[derive(Debug, Default)]
struct Shifted(std::sync::atomic::AtomicI64);

impl farm::Clock for Shifted {
    fn now_ms(&self) -> i64 {
        farm::SystemClock.now_ms() + self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The farm the browser sees: a site with a heartbeating server and a gone one, a store with
/// the demo vDisk, a collection with one production device. Returns the vDisk's id.
async fn populate(c: &Client, clock: &Shifted) -> i64 {
    let site = c.post("/sites", json!({"name": SITE})).await;
    clock.0.store(-120_000, std::sync::atomic::Ordering::SeqCst);
    c.post(
        "/servers",
        json!({"site_id": site["id"], "name": GONE_SERVER, "address": "127.0.0.1:9"}),
    )
    .await;
    clock.0.store(0, std::sync::atomic::Ordering::SeqCst);
    let server = c
        .post(
            "/servers",
            json!({"site_id": site["id"], "name": SERVER, "address": SERVER_ADDRESS}),
        )
        .await;
    c.post(&format!("/servers/{}/heartbeat", server["id"]), json!({}))
        .await;
    let store = c
        .post("/stores", json!({"name": "main", "path": "main"}))
        .await;
    let vdisk = c
        .post(
            "/vdisks",
            json!({"store_id": store["id"], "name": VDISK, "size_bytes": 64 << 20}),
        )
        .await;
    let coll = c
        .post(
            "/collections",
            json!({"site_id": site["id"], "name": COLLECTION}),
        )
        .await;
    c.post(
        "/devices",
        json!({"collection_id": coll["id"], "mac": MAC, "name": "desk-01",
               "device_type": "production", "vdisk_id": vdisk["id"]}),
    )
    .await;
    vdisk["id"].as_i64().unwrap()
}

/// Device login through the API: the device's key from an administrator's reset, the
/// challenge, the HMAC proof, login. Returns the session's export name.
async fn device_login(c: &Client) -> String {
    let devices = c.get("/devices").await;
    let id = devices["items"][0]["id"].as_i64().expect("the device");
    let cred = c
        .post(&format!("/devices/{id}/credential"), json!({}))
        .await;
    let key = cred["device_secret"].as_str().unwrap().to_string();
    let ch = c.post("/login/challenge", json!({"mac": MAC})).await;
    let nonce = ch["nonce"].as_str().unwrap();
    let hmac = farm::login::proof(&key, nonce, MAC).unwrap();
    let grant = c
        .post("/login", json!({"mac": MAC, "nonce": nonce, "hmac": hmac}))
        .await;
    assert_eq!(grant["version"], 0, "the production device boots version 0");
    grant["export_name"].as_str().unwrap().to_string()
}

/// Reports growing counters for the session every 500 ms, as `ferry target` does: with the
/// address of the server it streams from, not an id (the page must still name the server).
fn report_counters(c: Arc<Client>, export_name: String) {
    tokio::spawn(async move {
        for i in 0u64.. {
            let body = json!({"export_name": export_name, "server_address": SERVER_ADDRESS,
                "bytes_read": (3 << 20) + i * (1 << 20), "bytes_written": i * (256 << 10),
                "retries": i / 4, "cache_used_bytes": i * (256 << 10),
                "host_cache_hit_bytes": 5 << 20, "host_cache_server_bytes": 2 << 20});
            c.post("/status/report", body).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium_logs_in_promotes_a_new_version_and_shows_a_connected_device() {
    let Some(chromium) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = FarmConfig {
        data_dir: dir.path().join("data"),
        db_url: None,
        store_root: None,
    };
    let clock = Arc::new(Shifted::default());
    let farm = Farm::open_with_clock(&config, clock.clone())
        .await
        .expect("open farm");
    let secrets = farm.init("e2e").await.expect("init farm");
    let state = AppState {
        farm: Arc::new(farm),
        server_id: None,
    };
    let now = SystemTime::now();
    let ca = pki::Authority::create("e2e", now).unwrap();
    let cert = ca
        .issue_server("console", &["127.0.0.1".to_string()], now)
        .unwrap();
    let tls = pki::server_config(ca.cert_pem(), &cert.cert_pem, &cert.key_pem).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(api::serve_tls(listener, state, tls, async {
        let _ = stopped.await;
    }));

    let admin = Client {
        http: https_client(ca.cert_pem()),
        base: base.clone(),
        token: secrets.admin_token.clone(),
    };
    let made = admin
        .post("/tokens", json!({"name": TOKEN_NAME, "role": "operator"}))
        .await;
    let vdisk_id = populate(&admin, &clock).await;
    let export_name = device_login(&admin).await;
    report_counters(Arc::new(admin), export_name);

    let out = repo_root().join("target/console-e2e");
    let script = repo_root().join("web/e2e/console.e2e.mjs");
    let mut cmd = Command::new("node");
    cmd.arg(&script)
        .env("FERRY_URL", &base)
        .env("FERRY_TOKEN", made["secret"].as_str().unwrap())
        .env("FERRY_VDISK", VDISK)
        .env("FERRY_DEVICE_MAC", MAC)
        .env("FERRY_SERVER", SERVER)
        .env("FERRY_GONE_SERVER", GONE_SERVER)
        .env("FERRY_SITE", SITE)
        .env("FERRY_COLLECTION", COLLECTION)
        .env("FERRY_OUT", &out)
        .env("FERRY_SPKI", spki_sha256_base64(&cert.cert_pem))
        .env("FERRY_CHROMIUM", &chromium);
    let run = tokio::task::spawn_blocking(move || cmd.output());
    let output = tokio::time::timeout(BROWSER_TIMEOUT, run)
        .await
        .expect("the browser run finished in time")
        .unwrap()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "console e2e failed (screenshots in {}):\n{stderr}",
        out.display()
    );
    assert!(stdout.contains("all checks passed"));

    // What the browser did landed in the farm, made by the browser's token.
    let check = Client {
        http: https_client(ca.cert_pem()),
        base,
        token: secrets.admin_token.clone(),
    };
    let versions = check.get(&format!("/vdisks/{vdisk_id}/versions")).await;
    let v1 = &versions["items"][1];
    assert_eq!(v1["number"], 1);
    assert_eq!(v1["access"], "production");
    assert_eq!(v1["created_by"], TOKEN_NAME);
    assert_eq!(v1["changed_by"], TOKEN_NAME);
    assert_eq!(
        versions["items"].as_array().unwrap().len(),
        2,
        "the refused merge made none"
    );

    // The reporting task keeps a connection open; stop the server without waiting for it.
    let _ = stop.send(());
    server.abort();
}
