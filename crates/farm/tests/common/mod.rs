//! Farms for tests, on both backends: SQLite in a temporary directory, and PostgreSQL on
//! the server that scripts/test.sh starts on loopback (a fresh database per test, made from
//! FERRY_TEST_PG_URL, default [`PG_URL_DEFAULT`]). A missing PostgreSQL skips the test with a
//! printed reason on a developer's machine and FAILS it under CI=true (STYLE.md §6).
#![allow(dead_code)]

use std::sync::Arc;

use farm::{Farm, FarmConfig, InitSecrets};

/// The PostgreSQL database the tests connect to first (the role needs CREATEDB).
pub const PG_URL_DEFAULT: &str = "postgres://ferry:ferry@127.0.0.1:5432/ferry_test";

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
    /// The key `mac` proves its login with (hex): its device secret once enrolled (kept by
    /// [`TestFarm::keep_secret`]), else the farm key.
    pub fn login_key(&self, mac: &str) -> String {
        let mac = farm::validate::mac(mac)
            .map(|m| m.to_string())
            .unwrap_or_default();
        let secrets = self.device_secrets.lock().unwrap();
        secrets
            .get(&mac)
            .cloned()
            .unwrap_or_else(|| self.secrets.farm_key_hex.clone())
    }

    /// Keeps the device secret of an enrolling grant (`device_secret`, if any) for `mac`.
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
    let dir = tempfile::tempdir().unwrap();
    let db_url = match which {
        Which::Sqlite => None,
        Which::Postgres => Some(fresh_pg_database().await?),
    };
    let config = config_of(dir.path(), db_url.clone());
    let farm = Farm::open(&config).await.expect("open farm");
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
