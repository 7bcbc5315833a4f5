//! The diskless boot tests' checks of what a machine and the farm show (split from
//! `netboot.rs`, which keeps the steps): the farm's status, the console, the boot set, a
//! maintained version's file system.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::{BOOT_WAIT, Farm};
use crate::common::{ferry, path_str};

/// Waits (a hang guard of 60 s) until the farm's status through `api` shows counters of the
/// device `mac` (running as `vm`) that satisfy `ok`; returns them.
pub(crate) fn farm_counters(
    farm: &Farm,
    api: &str,
    mac: &str,
    step: &str,
    vm: &guest::Running,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let ca = std::fs::read(farm.ca()).unwrap();
    let client = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let v: Value = client
            .get(format!("{api}/api/v1/status"))
            .bearer_auth(&farm.token)
            .send()
            .and_then(|r| r.json())
            .unwrap_or(Value::Null);
        let c = v["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["mac"] == mac)
            .map(|d| d["counters"].clone())
            .unwrap_or(Value::Null);
        if ok(&c) {
            println!("{step}: the farm's status through {api}: {c}");
            return c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{step}: the farm's status through {api} shows no such counters of {mac}: {c}\n\
             the machine's console:\n{}",
            vm.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A machine refused inside the initramfs reboots (initramfs-tools' `panic` with `panic=N`),
/// so its firmware tries again (the next boot gets a new ticket); it is then killed.
pub(crate) fn reboots(vm: &mut guest::Running, step: &str) {
    expect_message(
        vm,
        step,
        "Rebooting automatically due to panic= boot argument",
    );
    expect_message(vm, step, "reboot: Restarting system");
    vm.kill();
}

/// The agent's status the guest's test script printed (`STATUS=` JSON).
pub(crate) fn agent_status(out: &guest::TestOutput, step: &str) -> Value {
    out.text
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_else(|| panic!("{step}: no agent status: {}", out.text))
}

/// The farm's boot set of `target` (NAME@V), once a server has recorded one.
pub(crate) fn wait_boot_set(farm: &Farm, target: &str) -> Value {
    let start = std::time::Instant::now();
    loop {
        let out = ferry()
            .args(["version", "boot-set", target])
            .args(["--api", &farm.api, "--token", &farm.token, "--json"])
            .args(["--farm-ca", path_str(&farm.ca())])
            .output()
            .unwrap();
        if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            if v["boots"].as_u64().unwrap_or(0) >= 1 {
                return v;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "{target}: no boot set in the farm: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub(crate) fn expect_message(vm: &mut guest::Running, step: &str, text: &str) {
    if let Err(e) = vm.wait_for(text, BOOT_WAIT) {
        panic!("{step}: no {text:?} on the console: {e}");
    }
    println!("{step}: {text:?} on the console after {:?}", vm.elapsed());
}

/// The NBD port the agent streams from: the first server of its "… from A,B" line.
pub(crate) fn serving_port(log: &str) -> u16 {
    let line = log
        .lines()
        .find(|l| l.contains("ferry-boot: /dev/nbd0 is"))
        .expect("the agent's line");
    let from = line.split(" from ").nth(1).expect("servers in the line");
    let first = from.split([',', ' ']).next().unwrap_or_default();
    first
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"))
}

/// Checks that the version file `file` holds a clean ext4 file system at `offset`
/// (`fs_bytes` long), once the server has let it go (the machine's connection ended with
/// its power: the server closes the private export): read through Ferry's image library
/// read-only, `e2fsck -n -f` finds nothing, and no journal waits to be replayed.
pub(crate) fn version_clean(farm: &Farm, file: &Path, offset: u64, fs_bytes: u64, dir: &Path) {
    let log = farm.dir.join("s1.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("private image closed: the maintenance writes are in the version")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the server kept the maintenance session's export: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let fs = dir.join("maintained-fs.raw");
    {
        use std::io::Write as _;
        let chain = interop::open_ro(file);
        let mut out = std::fs::File::create(&fs).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < fs_bytes {
            let n = usize::try_from((fs_bytes - at).min(buf.len() as u64)).unwrap();
            chain.top().read_at(&mut buf[..n], offset + at).unwrap();
            out.write_all(&buf[..n]).unwrap();
            at += n as u64;
        }
    }
    let fsck = std::process::Command::new("e2fsck")
        .args(["-n", "-f"])
        .arg(&fs)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert!(
        fsck.status.success(),
        "e2fsck -n -f of the maintained version: {said}"
    );
    let header = interop::run_ok(std::process::Command::new("dumpe2fs").arg("-h").arg(&fs));
    assert!(
        !header.contains("needs_recovery"),
        "the maintained version's journal waits to be replayed: {header}"
    );
    println!("maintenance: the version is clean: {}", said.trim());
    std::fs::remove_file(&fs).unwrap();
}
