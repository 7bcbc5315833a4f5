//! A PostgreSQL cluster of a test's own (Debian's `initdb` and `pg_ctl`, run as the
//! `postgres` user when the test runs as root), on a free loopback port: a test may stop
//! and start it without touching the suite's shared server.

use std::path::PathBuf;
use std::process::Command;

use super::{free_port, path_str};

pub struct PgCluster {
    _dir: tempfile::TempDir,
    data: PathBuf,
    bin: PathBuf,
    pub port: u16,
    log: PathBuf,
}

/// Debian's newest PostgreSQL binaries directory (`/usr/lib/postgresql/N/bin`).
fn bin_dir() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop()
}

fn as_root() -> bool {
    rustix::process::geteuid().is_root()
}

impl PgCluster {
    /// `None` when PostgreSQL's server binaries are not installed.
    pub fn create() -> Option<PgCluster> {
        let bin = bin_dir()?;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("pg");
        std::fs::create_dir(&data).unwrap();
        let log = dir.path().join("pg.log");
        std::fs::write(&log, "").unwrap();
        if as_root() {
            // The postgres user reaches its files through the temporary directory.
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            for p in [&data, &log] {
                let ok = Command::new("chown")
                    .args(["postgres:postgres", path_str(p)])
                    .status()
                    .unwrap();
                assert!(ok.success(), "chown {}", p.display());
            }
        }
        let c = PgCluster {
            _dir: dir,
            data,
            bin,
            port: free_port(),
            log,
        };
        c.run(
            "initdb",
            &[
                "-D",
                path_str(&c.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        Some(c)
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let exe = self.bin.join(tool);
        let mut cmd = if as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = cmd.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts it and waits until it accepts connections.
    pub fn start(&self) {
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off",
            self.port,
            path_str(&self.data)
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data),
                "-l",
                path_str(&self.log),
                "-o",
                &opts,
                "-w",
                "start",
            ],
        );
    }

    /// Stops it (fast: open connections are cut, as a crash or a maintenance stop does).
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &["-D", path_str(&self.data), "-m", "fast", "-w", "stop"],
        );
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let _ = std::panic::catch_unwind(|| self.stop());
        }
    }
}
