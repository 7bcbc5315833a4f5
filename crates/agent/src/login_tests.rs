//! Unit tests of `login.rs` (device login, target side), kept apart so that file reads in
//! one sitting.

use super::*;

#[test]
fn macs_normalize_as_the_farm_does() {
    let mac = parse_mac("AA-BB-CC-00-00-01").unwrap();
    assert_eq!(mac.to_string(), "aa:bb:cc:00:00:01");
}

#[test]
fn malformed_macs_are_refused() {
    for bad in [
        "",
        "aa:bb:cc:00:00",
        "aa:bb:cc:00:00:0g",
        "aa:bb:cc:00:00:01:02",
        "aa:bbcc:00:00:01",
    ] {
        assert!(
            matches!(parse_mac(bad), Err(LoginError::BadMac(_))),
            "{bad}"
        );
    }
}

#[test]
fn secret_text_is_trimmed_hex() {
    assert_eq!(parse_secret("0aff\n").unwrap(), vec![0x0a, 0xff]);
    assert!(matches!(parse_secret(" \n"), Err(LoginError::BadKey(_))));
    assert!(matches!(parse_secret("xyz"), Err(LoginError::BadKey(_))));
}

#[test]
fn api_urls_are_http_with_a_trailing_slash() {
    assert_eq!(
        parse_api_url("http://10.0.0.1:8080").unwrap().as_str(),
        "http://10.0.0.1:8080/"
    );
    assert_eq!(
        parse_api_url("10.0.0.1:8080").unwrap().as_str(),
        "http://10.0.0.1:8080/"
    );
    assert_eq!(parse_api_url("farm").unwrap().as_str(), "http://farm:8080/");
    assert_eq!(
        parse_api_url("http://farm/ferry").unwrap().as_str(),
        "http://farm/ferry/"
    );
    assert_eq!(
        parse_api_url("https://farm:8443").unwrap().as_str(),
        "https://farm:8443/"
    );
    assert!(matches!(
        parse_api_url("ftp://farm"),
        Err(LoginError::BadUrl { .. })
    ));
    assert!(matches!(
        parse_api_url("http://"),
        Err(LoginError::BadUrl { .. })
    ));
}

#[test]
fn an_unreachable_api_is_named() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = login(
        &format!("http://127.0.0.1:{port}"),
        "aabbcc000001",
        &[1; 32],
        None,
    )
    .unwrap_err();
    assert!(matches!(e, LoginError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains("unreachable"), "{e}");
}

/// A one-shot HTTP server on loopback answering each request with the next of
/// `answers` (status, JSON body); returns its URL.
fn fake_api(answers: Vec<(u16, String)>) -> String {
    fake_api_seen(answers).0
}

/// [`fake_api`], also returning the request bodies it received, in order.
fn fake_api_seen(answers: Vec<(u16, String)>) -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let (seen, bodies) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for (status, body) in answers {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut len = 0;
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if line == "\r\n" || line.is_empty() {
                    break;
                }
            }
            let mut b = vec![0; len];
            r.read_exact(&mut b).unwrap();
            let _ = seen.send(String::from_utf8_lossy(&b).into_owned());
            let mut s = s;
            write!(
                s,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        }
    });
    (url, bodies)
}

fn challenge() -> (u16, String) {
    (200, r#"{"nonce":"ab12","expires_at_ms":1}"#.to_string())
}

#[test]
fn refusals_keep_the_api_message() {
    let cases: [(u16, &str); 4] = [
        (401, "bad or expired proof"),
        (403, "unknown device aa:bb:cc:00:00:01"),
        (
            409,
            "another maintenance device is booted from vdisk golden",
        ),
        (429, "too many logins"),
    ];
    for (status, message) in cases {
        let body = format!(r#"{{"error":"{message}"}}"#);
        let url = fake_api(vec![challenge(), (status, body)]);
        let e = login(&url, "aabbcc000001", &[7; 32], None).unwrap_err();
        let ok = match status {
            401 => matches!(e, LoginError::BadProof { .. }),
            403 => matches!(e, LoginError::UnknownDevice { .. }),
            409 => matches!(e, LoginError::Conflict { .. }),
            _ => matches!(e, LoginError::Refused { status: 429, .. }),
        };
        assert!(ok, "{status}: {e:?}");
        assert!(e.to_string().contains(message), "{e}");
    }
}

#[test]
fn a_grant_without_servers_falls_back_to_the_api_host() {
    let grant = r#"{"session_id":"s","session_token":"fs_1","export_name":"ferry-s-00",
        "expires_at_ms":5,"device":{"id":1,"name":"pc1","mac":"aa:bb:cc:00:00:01"},
        "servers":[],"vdisk_id":1,"vdisk_name":"golden","size_bytes":1048576,
        "version":2,"access":"production","cache_mode":"ram_overflow",
        "ram_bytes":65536,"writable":false}"#;
    let url = fake_api(vec![challenge(), (200, grant.to_string())]);
    let g = login(&url, "AA:BB:CC:00:00:01", &[7; 32], None).unwrap();
    assert_eq!(g.servers, vec!["127.0.0.1:10809".to_string()]);
    assert!(g.servers_defaulted);
    assert_eq!(g.cache_mode, CacheMode::RamOverflow);
    assert_eq!((g.vdisk.as_str(), g.version), ("golden", 2));
    assert_eq!(g.export_name.to_string(), "ferry-s-00");
    assert_eq!((g.ram_bytes, g.size_bytes), (65536, 1 << 20));
    assert_eq!(g.device_name, "pc1");
    assert_eq!(g.mac.to_string(), "aa:bb:cc:00:00:01");
}

#[test]
fn the_login_signs_the_challenge_s_nonce_with_the_normalized_mac() {
    let grant = r#"{"error":"stop here"}"#.to_string();
    let (url, bodies) = fake_api_seen(vec![challenge(), (401, grant)]);
    let key = [7; 32];
    let _ = login(&url, "AA-BB-CC-00-00-01", &key, None);
    let sent: Vec<serde_json::Value> = bodies
        .iter()
        .map(|b| serde_json::from_str(&b).unwrap())
        .collect();
    let mac: Mac = "aa:bb:cc:00:00:01".parse().unwrap();
    let want = serde_json::json!({
        "mac": "aa:bb:cc:00:00:01",
        "nonce": "ab12",
        "hmac": contract::login::proof(&key, "ab12", mac),
        "diskless": false,
    });
    assert_eq!(
        sent,
        [serde_json::json!({"mac": "aa:bb:cc:00:00:01"}), want]
    );
}

#[test]
fn a_diskless_login_says_so() {
    let grant = r#"{"error":"stop here"}"#.to_string();
    let (url, bodies) = fake_api_seen(vec![challenge(), (401, grant)]);
    let _ = login_as(&url, "aa:bb:cc:00:00:01", &[7; 32], None, true);
    let sent: Vec<serde_json::Value> = bodies
        .iter()
        .map(|b| serde_json::from_str(&b).unwrap())
        .collect();
    let sent = &sent[1];
    assert_eq!(sent["diskless"], true, "{sent}");
}

#[test]
fn plain_http_goes_to_loopback_only_and_https_needs_the_farm_ca() {
    for ok in [
        "http://127.0.0.1:8080",
        "http://localhost",
        "http://[::1]:80",
    ] {
        assert!(
            api_client(&parse_api_url(ok).unwrap(), None).is_ok(),
            "{ok}"
        );
    }
    let e = login("http://10.0.0.1:8080", "aabbcc000001", &[1; 32], None).unwrap_err();
    assert!(matches!(e, LoginError::FarmCa { .. }), "{e}");
    assert!(e.to_string().contains("loopback"), "{e}");
    let e = login("https://farm:8443", "aabbcc000001", &[1; 32], None).unwrap_err();
    assert!(e.to_string().contains("--farm-ca"), "{e}");
}

fn grant_json(secret: Option<&str>) -> String {
    let extra = secret
        .map(|s| format!(r#","device_secret":"{s}""#))
        .unwrap_or_default();
    format!(
        r#"{{"session_id":"s","session_token":"fs_1","export_name":"ferry-s-00",
        "expires_at_ms":5,"device":{{"id":1,"name":"pc1","mac":"aa:bb:cc:00:00:01"}},
        "servers":[],"vdisk_id":1,"vdisk_name":"golden","size_bytes":1048576,
        "version":2,"access":"production","cache_mode":"ram_overflow",
        "ram_bytes":65536,"writable":false{extra}}}"#
    )
}

#[test]
fn the_given_secret_is_stored_after_its_login_and_later_logins_prove_with_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let state = DeviceState::new(&dir.path().join("state"));
    let mac = parse_mac("aa:bb:cc:00:00:01").unwrap();
    let (url, bodies) = fake_api_seen(vec![
        challenge(),
        (401, r#"{"error":"bad or expired proof"}"#.to_string()),
        challenge(),
        (200, grant_json(None)),
        challenge(),
        (200, grant_json(None)),
    ]);
    // A wrong secret given is not kept.
    let e = login_device(&url, "aabbcc000001", Some(&[7; 32]), &state, None).unwrap_err();
    assert!(matches!(e, LoginError::BadProof { .. }), "{e}");
    assert_eq!(state.secret(mac).unwrap(), None);
    // The secret an administrator's `ferry device credential` printed.
    let given = [0x5a_u8; 32];
    let e = login_device(&url, "aabbcc000001", None, &state, None).unwrap_err();
    assert!(matches!(e, LoginError::NoCredential { .. }), "{e}");
    assert!(e.to_string().contains("ferry device credential"), "{e}");
    login_device(&url, "aabbcc000001", Some(&given), &state, None).unwrap();
    let file = state.secret_file(mac);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(state.path()), 0o700);
    assert_eq!(state.secret(mac).unwrap(), Some(given.to_vec()));
    // Later: the stored secret, with none given.
    login_device(&url, "aabbcc000001", None, &state, None).unwrap();
    let sent: Vec<serde_json::Value> = bodies
        .iter()
        .take(6)
        .map(|b| serde_json::from_str(&b).unwrap())
        .collect();
    assert_eq!(sent[3]["hmac"], contract::login::proof(&given, "ab12", mac));
    assert_eq!(sent[5]["hmac"], contract::login::proof(&given, "ab12", mac));
}

#[test]
fn a_ticket_login_sends_the_ticket_alone_and_keeps_the_new_secret() {
    let secret = "5a".repeat(32);
    let (url, bodies) = fake_api_seen(vec![(200, grant_json(Some(&secret)))]);
    let ticket = format!("ft_{}", "0b".repeat(32));
    let g = login_ticket(&url, "AA-BB-CC-00-00-01", &ticket, None).unwrap();
    assert_eq!(g.device_secret.as_deref(), Some(secret.as_str()));
    let sent: serde_json::Value = serde_json::from_str(&bodies.recv().unwrap()).unwrap();
    let want = serde_json::json!({
        "mac": "aa:bb:cc:00:00:01", "nonce": "", "hmac": "", "diskless": true,
        "ticket": ticket,
    });
    assert_eq!(sent, want);
    let e = login_ticket(&url, "aabbcc000001", "00ff", None).unwrap_err();
    assert!(matches!(e, LoginError::BadKey(_)), "{e}");
}
