//! The console's routes through the router (no sockets), on SQLite and PostgreSQL: the
//! embedded files at `/` and `/console/...`, `GET /api/v1/status` (a device's session,
//! version, access mode and reported counters) and `POST /api/v1/status/report` with its
//! refusals.

use crate::common;

use api::AppState;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::TestFarm;
use serde_json::{Value, json};
use tower::ServiceExt as _;

const MAC: &str = "aa:bb:cc:00:09:01";

pub(crate) struct Api {
    pub(crate) t: TestFarm,
    router: axum::Router,
}

impl Api {
    pub(crate) fn new(t: TestFarm) -> Api {
        let state = AppState {
            farm: t.farm.clone(),
            server_id: None,
        };
        Api {
            router: api::router(state),
            t,
        }
    }

    /// Another API process of the same farm: its own router and status board.
    pub(crate) fn beside(&self) -> axum::Router {
        api::router(AppState {
            farm: self.t.farm.clone(),
            server_id: None,
        })
    }

    async fn raw(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
        self.raw_via(&self.router, method, uri, token, body).await
    }

    pub(crate) async fn raw_via(
        &self,
        router: &axum::Router,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let body = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Body::from(b.to_string())
            }
            None => Body::empty(),
        };
        let resp = router
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, headers, bytes.to_vec())
    }

    async fn json(&self, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let token = self.t.secrets.admin_token.clone();
        let (s, _, b) = self.raw(method, uri, Some(&token), body).await;
        let v = if b.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&b).unwrap()
        };
        (s, v)
    }

    async fn ok(&self, method: Method, uri: &str, body: Option<Value>) -> Value {
        let (s, v) = self.json(method.clone(), uri, body).await;
        assert!(s.is_success(), "{method} {uri}: {s} {v}");
        v
    }

    /// A site with server "pvs-1", vDisk "golden", one production device; returns the
    /// server's id.
    pub(crate) async fn fixture(&self) -> i64 {
        let site = self
            .ok(Method::POST, "/api/v1/sites", Some(json!({"name": "hq"})))
            .await;
        let server = json!({"site_id": site["id"], "name": "pvs-1", "address": "10.0.0.1:10809"});
        let server = self.ok(Method::POST, "/api/v1/servers", Some(server)).await;
        let store = json!({"name": "main", "path": "main"});
        let store = self.ok(Method::POST, "/api/v1/stores", Some(store)).await;
        let body = json!({"store_id": store["id"], "name": "golden", "size_bytes": 64 << 20});
        let vdisk = self.ok(Method::POST, "/api/v1/vdisks", Some(body)).await;
        let body = json!({"site_id": site["id"], "name": "lab"});
        let coll = self
            .ok(Method::POST, "/api/v1/collections", Some(body))
            .await;
        let body = json!({"collection_id": coll["id"], "mac": MAC, "name": "desk",
                          "device_type": "production", "vdisk_id": vdisk["id"],
                          "cache_mode": "ram"});
        self.ok(Method::POST, "/api/v1/devices", Some(body)).await;
        server["id"].as_i64().unwrap()
    }

    /// Device login; returns the export name.
    pub(crate) async fn login(&self) -> String {
        let c = self
            .ok(
                Method::POST,
                "/api/v1/login/challenge",
                Some(json!({"mac": MAC})),
            )
            .await;
        let nonce = c["nonce"].as_str().unwrap();
        let crate::common::Credential::Key(key) = self.t.credential(MAC).await else {
            panic!("an administrator's device proves with a key");
        };
        let hmac = farm::login::proof(&key, nonce, MAC).unwrap();
        let body = json!({"mac": MAC, "nonce": nonce, "hmac": hmac});
        let g = self.ok(Method::POST, "/api/v1/login", Some(body)).await;
        self.t.keep_secret(MAC, g["device_secret"].as_str());
        g["export_name"].as_str().unwrap().to_string()
    }

    pub(crate) async fn report(
        &self,
        export: &str,
        server_id: Option<i64>,
        read: i64,
    ) -> (StatusCode, Value) {
        let body = json!({"export_name": export, "server_id": server_id, "bytes_read": read,
                          "bytes_written": 7, "retries": 2, "cache_used_bytes": 4096,
                          "host_cache_hit_bytes": 3 << 20, "host_cache_server_bytes": 1 << 20});
        self.post_report(body).await
    }

    /// A report as `ferry target` sends it: the address of the NBD server it streams from,
    /// no server id (login hands out addresses only).
    async fn report_from(&self, export: &str, server_address: &str) -> (StatusCode, Value) {
        let body = json!({"export_name": export, "server_address": server_address,
                          "bytes_read": 1 << 20, "bytes_written": 0, "retries": 0,
                          "cache_used_bytes": 0});
        self.post_report(body).await
    }

    async fn post_report(&self, body: Value) -> (StatusCode, Value) {
        let (s, _, b) = self
            .raw(Method::POST, "/api/v1/status/report", None, Some(body))
            .await;
        let v = if b.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&b).unwrap()
        };
        (s, v)
    }

    pub(crate) async fn device_status(&self) -> Value {
        self.device_status_via(&self.router).await
    }

    /// The device's status through `router` (this API, or one [`Api::beside`] it).
    pub(crate) async fn device_status_via(&self, router: &axum::Router) -> Value {
        let token = self.t.secrets.admin_token.clone();
        let (s, _, b) = self
            .raw_via(router, Method::GET, "/api/v1/status", Some(&token), None)
            .await;
        assert!(s.is_success(), "GET /api/v1/status: {s}");
        let st: Value = serde_json::from_slice(&b).unwrap();
        st["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["mac"] == MAC)
            .cloned()
            .expect("the device is listed")
    }
}

/// A report (as [`Api::report`]) through `router`: another API process of the farm.
pub(crate) async fn report_via(
    a: &Api,
    router: &axum::Router,
    export: &str,
    server_id: i64,
    read: i64,
) -> (StatusCode, Vec<u8>) {
    let body = json!({"export_name": export, "server_id": server_id, "bytes_read": read,
                      "bytes_written": 0, "retries": 0, "cache_used_bytes": 0});
    let (s, _, b) = a
        .raw_via(
            router,
            Method::POST,
            "/api/v1/status/report",
            None,
            Some(body),
        )
        .await;
    (s, b)
}

async fn console_files_are_served_with_their_types(t: TestFarm) {
    let a = Api::new(t);
    let (s, h, body) = a.raw(Method::GET, "/", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
    assert!(
        String::from_utf8(body)
            .unwrap()
            .contains("/console/js/main.js")
    );
    assert!(
        h[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    let (s, h, _) = a.raw(Method::GET, "/console/js/main.js", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
    let (s, h, _) = a.raw(Method::GET, "/console", None, None).await;
    assert_eq!(s, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(h[header::LOCATION], "/console/");
    let (s, _, _) = a
        .raw(Method::GET, "/console/e2e/package.json", None, None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // The API's own answers are unchanged beside the console.
    let (s, v) = a.json(Method::GET, "/api/v1/nope", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["error"], "no such route");
}

async fn status_shows_session_version_and_reported_counters(t: TestFarm) {
    let a = Api::new(t);
    let server_id = a.fixture().await;
    let offline = a.device_status().await;
    assert_eq!(offline["session"], Value::Null);
    assert_eq!(offline["cache_mode"], "ram");

    let export = a.login().await;
    let online = a.device_status().await;
    assert_eq!(online["session"]["version"], 0);
    assert_eq!(online["session"]["access"], "production");
    assert_eq!(online["counters"], Value::Null, "nothing reported yet");

    let (s, v) = a.report(&export, Some(server_id), 5 << 20).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let d = a.device_status().await;
    assert_eq!(d["counters"]["bytes_read"], 5 << 20);
    assert_eq!(d["counters"]["retries"], 2);
    assert_eq!(d["counters"]["host_cache_hit_bytes"], 3 << 20);
    assert_eq!(d["counters"]["host_cache_server_bytes"], 1 << 20);
    assert_eq!(d["counters"]["server_name"], "pvs-1");
    let st = a.ok(Method::GET, "/api/v1/status", None).await;
    assert_eq!(st["connected"], 1);
    assert_eq!(st["total"], 1);
    assert_eq!(st["servers"][0]["name"], "pvs-1");

    // A new login is a new session: the old session's counters are not shown.
    a.login().await;
    assert_eq!(a.device_status().await["counters"], Value::Null);
}

/// Issue 17: a connected device showed no server, because a target reports the address of
/// its server, never an id. The status names the server registered at that address, and
/// shows the address itself when no registered server has it.
async fn connected_device_names_the_server_at_its_reported_address(t: TestFarm) {
    let a = Api::new(t);
    let server_id = a.fixture().await;
    let export = a.login().await;

    let (s, v) = a.report_from(&export, "10.0.0.1:10809").await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let c = &a.device_status().await["counters"];
    assert_eq!(c["server_name"], "pvs-1", "{c}");
    assert_eq!(c["server_id"], server_id, "{c}");
    assert_eq!(c["server_address"], "10.0.0.1:10809", "{c}");

    // After a failover to a server the farm does not know at that address.
    let (s, v) = a.report_from(&export, "10.0.0.9:10809").await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let c = &a.device_status().await["counters"];
    assert_eq!(c["server_name"], Value::Null, "{c}");
    assert_eq!(c["server_address"], "10.0.0.9:10809", "{c}");
}

async fn bad_reports_and_status_calls_are_refused(t: TestFarm) {
    let a = Api::new(t);
    a.fixture().await;
    let export = a.login().await;
    let (s, v) = a.report("ferry-s-00000000", None, 1).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(v["error"], "no live session of that name");
    let (s, v) = a.report(&export, Some(999), 1).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"], "no server 999");
    let (s, _) = a.report(&export, None, -1).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let long = format!(
        "{}:10809",
        "h".repeat(api::status::SERVER_ADDRESS_BYTES_MAX)
    );
    let (s, v) = a.report_from(&export, &long).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, _, _) = a
        .raw(
            Method::POST,
            "/api/v1/status/report",
            None,
            Some(
                json!({"export_name": export, "bytes_read": 1, "bytes_written": 1,
                        "retries": 0, "cache_used_bytes": 0, "extra": 1}),
            ),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown fields are refused"
    );
    assert_eq!(a.device_status().await["counters"], Value::Null);
    let (s, _, _) = a.raw(Method::GET, "/api/v1/status", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, v) = a.json(Method::GET, "/api/v1/status?limit=0", None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

async fn openapi_document_lists_the_status_routes(t: TestFarm) {
    let a = Api::new(t);
    let doc = a.ok(Method::GET, "/api/v1/openapi.json", None).await;
    assert!(doc["paths"]["/api/v1/status"]["get"].is_object());
    assert!(doc["paths"]["/api/v1/status/report"]["post"].is_object());
}

dual_tests!(
    console_files_are_served_with_their_types,
    status_shows_session_version_and_reported_counters,
    connected_device_names_the_server_at_its_reported_address,
    bad_reports_and_status_calls_are_refused,
    openapi_document_lists_the_status_routes,
);
