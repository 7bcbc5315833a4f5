//! Counters shared between the farm's API processes (issue 31): a device reports to one
//! API, the status through another shows its counters, at most
//! `farm::counters::SHARE_EVERY_MS` older than the newest (at once when its server
//! changed), on a simulated clock. A device ends its own session at a clean shutdown, and
//! nobody else can.

use axum::http::StatusCode;
use farm::SimClock;
use farm::counters::SHARE_EVERY_MS;
use serde_json::Value;

use crate::common::TestFarm;
use crate::console_routes::Api;

async fn counters_reported_to_one_api_show_through_another(t: TestFarm, clock: SimClock) {
    let a = Api::new(t);
    let server_id = a.fixture().await;
    let b = a.beside();
    let export = a.login().await;
    assert_eq!(a.device_status_via(&b).await["counters"], Value::Null);

    let (s, v) = a.report(&export, Some(server_id), 1 << 20).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let c = &a.device_status_via(&b).await["counters"];
    assert_eq!(
        c["bytes_read"],
        1 << 20,
        "the first report is shared at once: {c}"
    );
    assert_eq!(c["server_name"], "pvs-1", "{c}");

    // Within the sharing interval the other API shows the shared report, this one its own.
    clock.advance(std::time::Duration::from_millis(2_000));
    a.report(&export, Some(server_id), 2 << 20).await;
    assert_eq!(
        a.device_status_via(&b).await["counters"]["bytes_read"],
        1 << 20
    );

    // Past it, the next report is shared.
    let past = u64::try_from(SHARE_EVERY_MS).unwrap();
    clock.advance(std::time::Duration::from_millis(past));
    a.report(&export, Some(server_id), 3 << 20).await;
    let c = &a.device_status_via(&b).await["counters"];
    assert_eq!(c["bytes_read"], 3 << 20, "{c}");

    // A report through the other API is newer there, and the first shows it as well once
    // shared; a new login's session shows nothing of the old one's.
    clock.advance(std::time::Duration::from_millis(1_000));
    let (s, _) = crate::console_routes::report_via(&a, &b, &export, server_id, 4 << 20).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        a.device_status_via(&b).await["counters"]["bytes_read"],
        4 << 20
    );
    assert_eq!(
        a.device_status().await["counters"]["bytes_read"],
        4 << 20,
        "newer than its own"
    );
    a.login().await;
    assert_eq!(a.device_status_via(&b).await["counters"], Value::Null);
}

/// A machine that shuts down cleanly ends its own session (`POST /device/session/end`, its
/// export name the credential): anything else is refused alike (401), and the ended session
/// is audited as the device's.
async fn a_device_ends_its_own_session_and_nobody_else_does(t: TestFarm, _c: SimClock) {
    use axum::http::Method;
    let a = Api::new(t);
    a.fixture().await;
    let export = a.login().await;
    let router = a.beside();
    let end = |name: &str| serde_json::json!({ "export_name": name });
    for bad in [
        end("not-an-export"),
        end("ferry-s-00112233445566778899aabbccddeeff"),
        end("golden"),
        serde_json::json!({ "export_name": export, "extra": 1 }),
    ] {
        let (s, _, _) = a
            .raw_via(
                &router,
                Method::POST,
                "/api/v1/device/session/end",
                None,
                Some(bad.clone()),
            )
            .await;
        assert!(
            s == StatusCode::UNAUTHORIZED || s == StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}: {s}"
        );
    }
    let (s, _, body) = a
        .raw_via(
            &router,
            Method::POST,
            "/api/v1/device/session/end",
            None,
            Some(end(&export)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["version"], 0, "{v}");
    let audit = a.t.farm.list_audit(None, None).await.unwrap();
    assert!(
        audit
            .items
            .iter()
            .any(|e| e.action == "session.end" && e.actor.starts_with("device:")),
        "{audit:?}"
    );
}

sim_tests!(
    counters_reported_to_one_api_show_through_another,
    a_device_ends_its_own_session_and_nobody_else_does,
);
