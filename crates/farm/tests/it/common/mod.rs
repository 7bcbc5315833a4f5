//! Farms for tests, on both backends: SQLite in a temporary directory, and PostgreSQL on
//! the server that scripts/test.sh starts on loopback (a fresh database per test, made from
//! FERRY_TEST_PG_URL, default [`PG_URL_DEFAULT`]). A missing PostgreSQL skips the test with a
//! printed reason on a developer's machine and FAILS it under CI=true (STYLE.md §6).
#![allow(dead_code)]

use std::sync::Arc;

use farm::{Farm, FarmConfig, InitSecrets};

/// The PostgreSQL database the tests connect to first (the role needs CREATEDB).
pub const PG_URL_DEFAULT: &str = "postgres://ferry:ferry@127.0.0.1:5432/ferry_test";

/// How a test device logs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A device secret (hex).
    Key(String),
    /// A boot's login ticket.
    Ticket(String),
}

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Sqlite,
    Postgres,
}

/// A farm made for one test.
pub struct TestFarm {
    pub farm: Arc<Farm>,
    /// Device secrets (hex) by MAC, kept by the tests' login helpers after enrolment.
    pub device_secrets: std::sync::Mutex<std::collections::HashMap<String, String>>,
    pub secrets: InitSecrets,
    pub dir: tempfile::TempDir,
    pub which: Which,
    pub db_url: Option<String>,
}

fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The URL of a new, empty PostgreSQL database, or `None` (skip) when PostgreSQL is not
/// reachable off CI.
pub async fn fresh_pg_database() -> Option<String> {
    use sqlx::Connection as _;
    let base = std::env::var("FERRY_TEST_PG_URL").unwrap_or_else(|_| PG_URL_DEFAULT.to_string());
    let mut conn = match sqlx::PgConnection::connect(&base).await {
        Ok(c) => c,
        Err(e) => {
            if on_ci() {
                panic!(
                    "PostgreSQL at {base} is required under CI=true (scripts/test.sh starts it): {e}"
                );
            }
            eprintln!("SKIPPED: PostgreSQL at {base} is not reachable: {e}");
            return None;
        }
    };
    let name = format!("ferry_t_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create test database");
    let (prefix, _) = base.rsplit_once('/').expect("database url has a path");
    Some(format!("{prefix}/{name}"))
}

/// The configuration of a test farm in `dir` (data in `dir/data`).
pub fn config_of(dir: &std::path::Path, db_url: Option<String>) -> FarmConfig {
    FarmConfig {
        data_dir: dir.join("data"),
        db_url,
        store_root: None,
    }
}

impl TestFarm {
    /// How `mac` logs in: its device secret (kept by [`TestFarm::keep_secret`], else a new
    /// one an administrator's reset makes now), or, for a MAC the farm does not know, a
    /// boot ticket when the farm would add it (else a key of no device).
    pub async fn credential(&self, mac: &str) -> Credential {
        let Ok(norm) = farm::validate::mac(mac).map(|m| m.to_string()) else {
            return Credential::Key("00".repeat(32));
        };
        if let Some(k) = self.device_secrets.lock().unwrap().get(&norm).cloned() {
            return Credential::Key(k);
        }
        match self.farm.device_by_mac(&norm).await.unwrap() {
            Some(d) => {
                let c = self
                    .farm
                    .reset_device_credential(d.id, "test")
                    .await
                    .unwrap();
                self.keep_secret(mac, Some(&c.device_secret));
                Credential::Key(c.device_secret)
            }
            None => match self.farm.issue_boot_ticket(&norm).await.unwrap() {
                Some(t) => Credential::Ticket(t),
                None => Credential::Key("00".repeat(32)),
            },
        }
    }

    /// The login request of `mac` with `credential`, for the challenge's `nonce`.
    pub fn request(mac: &str, credential: &Credential, nonce: &str) -> farm::login::LoginRequest {
        match credential {
            Credential::Key(k) => farm::login::LoginRequest {
                mac: mac.into(),
                nonce: nonce.into(),
                hmac: farm::login::proof(k, nonce, mac).unwrap_or_default(),
                diskless: false,
                ticket: None,
            },
            Credential::Ticket(t) => farm::login::LoginRequest {
                mac: mac.into(),
                nonce: String::new(),
                hmac: String::new(),
                diskless: true,
                ticket: Some(t.clone()),
            },
        }
    }

    /// Keeps the device secret of a grant (`device_secret`, if any) for `mac`.
    pub fn keep_secret(&self, mac: &str, device_secret: Option<&str>) {
        if let (Ok(mac), Some(s)) = (farm::validate::mac(mac), device_secret) {
            let mut secrets = self.device_secrets.lock().unwrap();
            secrets.insert(mac.to_string(), s.to_string());
        }
    }

    /// This farm's configuration (to open it again).
    pub fn config(&self) -> FarmConfig {
        config_of(self.dir.path(), self.db_url.clone())
    }
}

/// A new initialized farm on `which`, or `None` when the test is skipped.
pub async fn open(which: Which) -> Option<TestFarm> {
    open_clocked(which, None).await
}

/// [`open`] on a simulated clock (at the system's now), which the test moves.
pub async fn open_sim(which: Which) -> Option<(TestFarm, farm::SimClock)> {
    use farm::Clock as _;
    let clock = farm::SimClock::new(farm::SystemClock.now_ms());
    let t = open_clocked(which, Some(clock.clone())).await?;
    Some((t, clock))
}

async fn open_clocked(which: Which, clock: Option<farm::SimClock>) -> Option<TestFarm> {
    let dir = tempfile::tempdir().unwrap();
    let db_url = match which {
        Which::Sqlite => None,
        Which::Postgres => Some(fresh_pg_database().await?),
    };
    let config = config_of(dir.path(), db_url.clone());
    let farm = match clock {
        Some(c) => Farm::open_with_clock(&config, Arc::new(c)).await,
        None => Farm::open(&config).await,
    }
    .expect("open farm");
    let secrets = farm.init("test").await.expect("init farm");
    Some(TestFarm {
        farm: Arc::new(farm),
        device_secrets: Default::default(),
        secrets,
        dir,
        which,
        db_url,
    })
}

/// Generates, for each named `async fn(TestFarm)`, one test per backend:
/// `sqlite::NAME` and `postgres::NAME`.
#[macro_export]
macro_rules! dual_tests {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(t) = $crate::common::open($crate::common::Which::Sqlite).await {
                        super::$name(t).await;
                    }
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(t) = $crate::common::open($crate::common::Which::Postgres).await {
                        super::$name(t).await;
                    }
                }
            )+
        }
    };
}

/// Generates, for each named `async fn(TestFarm, SimClock)`, one test per backend on a
/// simulated clock ([`open_sim`]): `sqlite::NAME` and `postgres::NAME`.
#[macro_export]
macro_rules! sim_tests {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some((t, c)) = $crate::common::open_sim($crate::common::Which::Sqlite).await {
                        super::$name(t, c).await;
                    }
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some((t, c)) = $crate::common::open_sim($crate::common::Which::Postgres).await {
                        super::$name(t, c).await;
                    }
                }
            )+
        }
    };
}
