//! Counters shared between the farm's API processes (issue 31): a device reports to one
//! API, the status through another shows its counters, at most
//! `farm::counters::SHARE_EVERY_MS` older than the newest (at once when its server
//! changed), on a simulated clock.

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

sim_tests!(counters_reported_to_one_api_show_through_another);
