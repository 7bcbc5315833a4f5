//! Issue 30 (H3) over real sockets, on SQLite and PostgreSQL: a flood of login challenges
//! from one loopback address (127.0.0.2) gets that address's few nonces and 429s after
//! them, while a device from another address (127.0.0.3) still gets its challenge and logs
//! in. The farm API is `api::serve` on 127.0.0.1 (plain HTTP, loopback), so each request
//! carries the client address the listener accepted (`ConnectInfo<SocketAddr>`, which the budgeted listeners give every request); the flood is bounded
//! (200 requests, one after another).

use crate::common;

use crate::support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use api::AppState;
use common::TestFarm;
use serde_json::{Value, json};
use support::Api;

const MAC: &str = "aa:bb:cc:00:60:01";
/// The flood's size: well past one address's bound.
const FLOOD: usize = 200;

fn client_from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::from(ip)))
        .build()
        .unwrap()
}

async fn post(c: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let r = c.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn a_challenge_flood_from_one_address_does_not_starve_another_s_login(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, coll) = a.fixture().await;
    let id = a.device(coll, vdisk, MAC, "production").await;
    let key =
        a.t.farm
            .reset_device_credential(id, "test")
            .await
            .unwrap()
            .device_secret;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/api/v1", listener.local_addr().unwrap());
    let state = AppState {
        farm: Arc::clone(&a.t.farm),
        server_id: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(api::serve(listener, state, async {
        let _ = stopped.await;
    }));

    let flooder = client_from([127, 0, 0, 2]);
    let mut refused = 0;
    for n in 0..FLOOD {
        let mac = format!("aa:bb:cc:00:61:{:02x}", n % 256);
        let (s, _) = post(
            &flooder,
            &format!("{base}/login/challenge"),
            json!({"mac": mac}),
        )
        .await;
        match s {
            200 => {}
            429 => refused += 1,
            other => panic!("challenge {n}: HTTP {other}"),
        }
    }
    assert_eq!(
        refused,
        FLOOD - farm::login::NONCES_PER_ADDRESS_MAX as usize,
        "one address gets its bound of nonces and no more"
    );

    let device = client_from([127, 0, 0, 3]);
    let (s, c) = post(
        &device,
        &format!("{base}/login/challenge"),
        json!({"mac": MAC}),
    )
    .await;
    assert_eq!(s, 200, "{c}");
    let nonce = c["nonce"].as_str().unwrap();
    let hmac = farm::login::proof(&key, nonce, MAC).unwrap();
    let body = json!({"mac": MAC, "nonce": nonce, "hmac": hmac});
    let (s, g) = post(&device, &format!("{base}/login"), body).await;
    assert_eq!(s, 200, "{g}");
    assert!(g["export_name"].as_str().unwrap().starts_with("ferry-s-"));

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

dual_tests!(a_challenge_flood_from_one_address_does_not_starve_another_s_login);
