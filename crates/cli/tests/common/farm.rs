//! A farm for end-to-end tests: `ferry farm init` in a temporary directory with a store
//! holding `golden.vhdx` (0x21 at 0, 0x22 at 32 MiB), `ferry server --farm` processes, the
//! farm's objects made through the CLI, and `ferry target` devices logged in through it.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use interop::{MIB, create_vhdx, dynamic, run_ok, session};
use serde_json::Value;

use super::{Proc, ferry, free_port, path_str};

/// The virtual size of `golden.vhdx`.
pub const SIZE: u64 = 64 * MIB;

pub struct Farm {
    pub dir: tempfile::TempDir,
    pub token: String,
}

impl Farm {
    /// `ferry farm init` with a store holding `golden.vhdx` (0x21 at 0, 0x22 at 32 MiB).
    pub fn init() -> Farm {
        Farm::init_with(&[])
    }

    /// As [`Farm::init`], on the PostgreSQL database `db` (its servers need `--db` too).
    pub fn init_with_db(db: &str) -> Farm {
        Farm::init_with(&["--db", db])
    }

    fn init_with(extra: &[&str]) -> Farm {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let printed = run_ok(
            ferry()
                .args(["farm", "init", "--data", path_str(&data), "--json"])
                .args(extra),
        );
        let init: Value = serde_json::from_str(&printed).unwrap();
        // The farm key stays in its 0600 file: `init` names the file, never prints the key.
        let key_file = init["farm_key_file"]
            .as_str()
            .expect("the key's file named");
        let key = std::fs::read_to_string(key_file).unwrap();
        assert!(
            key.trim().len() >= 32 && !printed.contains(key.trim()),
            "{printed}"
        );
        let f = Farm {
            token: init["admin_token"].as_str().unwrap().to_string(),
            dir,
        };
        std::fs::create_dir_all(f.store()).unwrap();
        let base = f.store().join("golden.vhdx");
        create_vhdx(&base, &dynamic(SIZE, 2 * MIB as u32));
        session(&base, |d| {
            d.write_at(&vec![0x21; MIB as usize], 0).unwrap();
            d.write_at(&vec![0x22; MIB as usize], 32 * MIB).unwrap();
        });
        f
    }

    /// The store, the vDisk, collection `lab` and one device per `(mac, name)`.
    pub fn objects(&self, api: &str, devices: &[(&str, &str)]) {
        self.objects_in(api, &["--path", "main"], devices);
    }

    /// As [`Farm::objects`], with store `main` added with `store_args`.
    pub fn objects_in(&self, api: &str, store_args: &[&str], devices: &[(&str, &str)]) {
        let mut add = vec!["store", "add", "main"];
        add.extend_from_slice(store_args);
        self.json(api, &add);
        self.json(api, &["farm", "vdisk", "add", "golden", "--store", "1"]);
        self.json(
            api,
            &[
                "collection",
                "add",
                "lab",
                "--site",
                "1",
                "--vdisk",
                "golden",
            ],
        );
        for (mac, name) in devices {
            self.json(
                api,
                &[
                    "device",
                    "add",
                    mac,
                    "--name",
                    name,
                    "--collection",
                    "1",
                    "--vdisk",
                    "golden",
                ],
            );
        }
    }

    /// A file holding `mac`'s device secret for a target whose state directory is `state`:
    /// a new one from `ferry device credential` unless `state` holds one already (whose
    /// file it is then).
    pub fn device_secret(&self, api: &str, mac: &str, state: &std::path::Path) -> PathBuf {
        let kept = state.join(format!(
            "device-{}.secret",
            mac.to_lowercase().replace(':', "-")
        ));
        if kept.exists() {
            return kept;
        }
        let v = self.json(api, &["device", "credential", mac]);
        let file = self
            .dir
            .path()
            .join(format!("{}.secret", mac.replace(':', "-")));
        std::fs::write(&file, v["device_secret"].as_str().unwrap()).unwrap();
        file
    }

    /// `ferry target` of device `mac` logged in through `api`, exporting `NAME.sock`.
    pub fn target(&self, api: &str, mac: &str, name: &str) -> (Proc, PathBuf) {
        self.target_with(api, mac, name, &[])
    }

    /// As [`Farm::target`], with `extra` flags.
    pub fn target_with(&self, api: &str, mac: &str, name: &str, extra: &[&str]) -> (Proc, PathBuf) {
        let socket = self.dir.path().join(format!("{name}.sock"));
        let overflow = self.dir.path().join(format!("overflow-{name}"));
        std::fs::create_dir_all(&overflow).unwrap();
        let state = self.dir.path().join(format!("state-{name}"));
        let secret = self.device_secret(api, mac, &state);
        let mut cmd = ferry();
        cmd.args(["target", "--server", api, "--device", mac])
            .args(["--device-secret", path_str(&secret)])
            .args(["--state-dir", path_str(&state)])
            .arg(format!("--export=unix:{}", path_str(&socket)))
            .args(["--overflow", path_str(&overflow)])
            .args(extra);
        let mut target = Proc::spawn(&mut cmd, self.dir.path().join(format!("{name}.log")));
        let ctl = PathBuf::from(format!("{}.ctl", path_str(&socket)));
        target.wait_until("exporting", || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok() && ctl.exists()
        });
        (target, socket)
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn store(&self) -> PathBuf {
        self.data().join("stores").join("main")
    }

    /// `ferry server --farm` named `name`; returns it with its API URL and NBD address.
    pub fn server(&self, name: &str) -> (Proc, String, String) {
        self.server_with(name, |c| {
            c.args(["--store", path_str(&self.store())]);
        })
    }

    /// As [`Farm::server`] without `--store` (the farm's first store is served), with
    /// `extra` applied to the command.
    pub fn server_with(
        &self,
        name: &str,
        extra: impl FnOnce(&mut Command),
    ) -> (Proc, String, String) {
        let (api, nbd) = (free_port(), free_port());
        let mut cmd = ferry();
        cmd.args(["server", "--farm", path_str(&self.data())]);
        extra(&mut cmd);
        // Metrics off unless `extra` asked for them.
        let metrics = cmd
            .get_args()
            .any(|a| a.to_string_lossy().starts_with("--metrics-listen"));
        if !metrics {
            cmd.arg("--metrics-listen=");
        }
        cmd.arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
            .arg(format!("--api-listen=127.0.0.1:{api}"))
            .args(["--server-name", name]);
        let mut p = Proc::spawn(&mut cmd, self.dir.path().join(format!("{name}.log")));
        p.wait_until("serving the API and NBD", || {
            TcpStream::connect(("127.0.0.1", api)).is_ok()
                && TcpStream::connect(("127.0.0.1", nbd)).is_ok()
        });
        (
            p,
            format!("http://127.0.0.1:{api}"),
            format!("127.0.0.1:{nbd}"),
        )
    }

    /// `ferry ARGS --api API --token .. --json`, which must succeed.
    pub fn json(&self, api: &str, args: &[&str]) -> Value {
        let out = ferry()
            .args(args)
            .args(["--api", api, "--token", &self.token, "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ferry {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }
}

pub fn status(socket: &Path) -> Value {
    let export = format!("--export=unix:{}", path_str(socket));
    serde_json::from_str(&run_ok(
        ferry().args(["target", "status", "--json", &export]),
    ))
    .unwrap()
}

/// qemu-io reads of the golden pattern through the target's export; asserts they verify.
pub fn reads_verify(socket: &Path) {
    let out = Command::new("qemu-io")
        .stdin(Stdio::null())
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 0x21 0 1M",
            "-c",
            "read -P 0x22 32M 1M",
        ])
        .arg(format!("nbd+unix:///?socket={}", path_str(socket)))
        .output()
        .unwrap();
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "qemu-io: {t}");
    assert!(!t.contains("failed"), "qemu-io: {t}");
}
