//! The REST API through its router (no sockets) for the API's integration tests: a farm on
//! one backend, calls with the admin token or any other, and the fixtures most tests need.
#![allow(dead_code)]

use api::AppState;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use crate::common::TestFarm;

pub struct Api {
    pub t: TestFarm,
    router: axum::Router,
}

impl Api {
    pub fn new(t: TestFarm) -> Api {
        let state = AppState {
            farm: t.farm.clone(),
            server_id: None,
        };
        Api {
            router: api::router(state),
            t,
        }
    }

    pub fn admin(&self) -> String {
        self.t.secrets.admin_token.clone()
    }

    pub async fn raw(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
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
        let resp = self
            .router
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (status, v)
    }

    /// A request whose answer is returned as bytes (not JSON), with its content type.
    pub async fn bytes(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Option<String>, Vec<u8>) {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        let resp = self
            .router
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let ctype = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = axum::body::to_bytes(resp.into_body(), 32 << 20)
            .await
            .unwrap();
        (status, ctype, bytes.to_vec())
    }

    pub async fn call(
        &self,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let token = self.admin();
        let body = body.map(|b| b.to_string());
        self.raw(method, uri, Some(&token), body.as_deref()).await
    }

    pub async fn ok(&self, method: Method, uri: &str, body: Option<Value>) -> Value {
        let (s, v) = self.call(method.clone(), uri, body).await;
        assert!(s.is_success(), "{method} {uri}: {s} {v}");
        v
    }

    pub async fn audit_total(&self) -> i64 {
        self.ok(Method::GET, "/api/v1/audit?limit=1", None).await["total"]
            .as_i64()
            .unwrap()
    }

    /// Asserts an error answer: status, a message containing `needle`, and no new audit
    /// entry (nothing changed).
    pub async fn refused(
        &self,
        method: Method,
        uri: &str,
        body: Option<Value>,
        status: StatusCode,
        needle: &str,
    ) {
        let before = self.audit_total().await;
        let (s, v) = self.call(method.clone(), uri, body).await;
        assert_eq!(s, status, "{method} {uri}: {v}");
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error message: {v}"));
        assert!(
            msg.contains(needle),
            "{method} {uri}: {msg:?} lacks {needle:?}"
        );
        assert_eq!(
            self.audit_total().await,
            before,
            "{method} {uri} changed something"
        );
    }

    /// A site, a store, vDisk "golden" (64 MiB), a collection; returns (vdisk id, collection id).
    pub async fn fixture(&self) -> (i64, i64) {
        let site = self
            .ok(Method::POST, "/api/v1/sites", Some(json!({"name": "hq"})))
            .await;
        let store = self
            .ok(
                Method::POST,
                "/api/v1/stores",
                Some(json!({"name": "main", "path": "main"})),
            )
            .await;
        let body = json!({"store_id": store["id"], "name": "golden", "size_bytes": 64 << 20});
        let vdisk = self.ok(Method::POST, "/api/v1/vdisks", Some(body)).await;
        let body = json!({"site_id": site["id"], "name": "lab"});
        let coll = self
            .ok(Method::POST, "/api/v1/collections", Some(body))
            .await;
        (vdisk["id"].as_i64().unwrap(), coll["id"].as_i64().unwrap())
    }

    pub async fn device(&self, coll: i64, vdisk: i64, mac: &str, ty: &str) -> i64 {
        let body = json!({"collection_id": coll, "mac": mac, "name": mac.replace(':', ""), "device_type": ty, "vdisk_id": vdisk});
        self.ok(Method::POST, "/api/v1/devices", Some(body)).await["id"]
            .as_i64()
            .unwrap()
    }

    pub async fn login(&self, mac: &str) -> (StatusCode, Value) {
        let how = self.t.credential(mac).await;
        let nonce = match how {
            crate::common::Credential::Key(_) => {
                let (s, c) = self
                    .raw(
                        Method::POST,
                        "/api/v1/login/challenge",
                        None,
                        Some(&json!({"mac": mac}).to_string()),
                    )
                    .await;
                assert_eq!(s, StatusCode::OK, "{c}");
                c["nonce"].as_str().unwrap().to_string()
            }
            crate::common::Credential::Ticket(_) => String::new(),
        };
        let body = serde_json::to_string(&TestFarm::request(mac, &how, &nonce)).unwrap();
        let (s, g) = self
            .raw(Method::POST, "/api/v1/login", None, Some(&body))
            .await;
        self.t.keep_secret(mac, g["device_secret"].as_str());
        (s, g)
    }
}
