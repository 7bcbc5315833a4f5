//! Diskless network boot end to end (issue 19): QEMU machines (TCG) with no root disk power
//! on, get iPXE's boot script from `ferry server --farm --boot-listen`, boot the version's
//! own kernel and initramfs, and run Debian 12 from the vDisk with `ferry-boot` (the boot
//! agent, installed into the image by `ferry target install-initramfs`) keeping their
//! writes in RAM with overflow to a small local disk.
//!
//! Two tests, each with a farm and a golden image of its own, run beside each other; within
//! each the steps run in order, each naming itself when it fails. The first test:
//! 1. a production device boots version 1 to multi-user and writes a file (and 64 MiB, past
//!    its 16 MiB of RAM, into the overflow disk); it logs in with its boot's ticket and keeps
//!    its new key in its TPM (swtpm, QEMU's `tpm-tis`);
//! 2. after a power cycle the file is gone, the boot logged in with the TPM's key (its
//!    script carries no ticket any more), and the boot agent read the version's boot set
//!    ahead of the kernel (this and the boots after it start the test OS's small init,
//!    `guest::QUICK_INIT`, not systemd);
//! 3. a new version is made, changed and promoted: the next boot runs it;
//! 4. with two servers, the one serving is killed mid-boot and the boot completes; this
//!    machine has UEFI firmware (OVMF, QEMU's iPXE EFI ROM; the kernel starts as an EFI
//!    program).
//!
//! The second (its boots all start the small init):
//! 5. four machines boot at once, two of them with UEFI firmware; a UEFI one is power
//!    cycled and its writes are gone;
//! 6. bad paths end in one true reason on the console and the machine given back, not a
//!    hang: an unknown MAC and a deleted version (iPXE exits to the firmware at once), a
//!    login ticket not of this boot (forged, or used already) and a server unreachable (the
//!    initramfs reboots after `panic=`).
//!
//! The image holds no secret (issue 30): `install-initramfs` puts only the farm's CA into
//! it, and each diskless boot logs in with the one-time ticket of its own boot script.
//!
//! Needs root, qemu-system-x86_64 with iPXE ROMs, the guest root (scripts/guest-root.sh) and
//! the static boot agent (`FERRY_BOOT_AGENT`, or target/x86_64-unknown-linux-musl/
//! boot-agent/ferry-boot as scripts/test.sh builds it). Under CI=true a missing one fails.

#[path = "netboot_checks/mod.rs"]
mod checks;
mod common;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use checks::{
    agent_status, expect_message, farm_counters, reboots, serving_port, version_clean,
    wait_boot_set,
};
use common::boot::{boot_agent, capture, runnable, stripped_ferry};
use common::console::{one_reason, stops};
use common::{Proc, ferry, free_port, path_str};
use serde_json::Value;

/// A hang guard for one boot (TCG, 2 shared cores), not a measure.
const BOOT_WAIT: Duration = Duration::from_secs(600);
/// RAM of a test machine.
const GUEST_MIB: u32 = 768;
/// The write cache's RAM in the farm (so 64 MiB written in the guest overflows).
const CACHE_RAM_BYTES: &str = "16777216";
/// A login ticket the farm never issued (or one used already): a vDisk's boot_cmdline
/// `ferry.ticket=` after the script's own makes its machines log in with it.
const STALE_TICKET: &str = "ft_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// The life of a boot's login ticket in the test farms: a TCG machine on shared cores
/// takes far longer than a real one from its boot script to its login (the default is
/// 120 s).
const TICKET_SECS: &str = "600";
/// The guest's script: whether the file of an earlier boot is there, then a write.
const TEST_SCRIPT: &str = r#"#!/bin/sh
if [ -e /var/lib/ferry-test/maintained ]; then echo MAINTAINED-BEFORE=yes; fi
if grep -q ferrytest=maintain /proc/cmdline; then
    # The maintenance boot: a change made from inside, then a poweroff from inside (a
    # moment later, once this output is on the console).
    echo v2 >/etc/ferry-version
    mkdir -p /var/lib/ferry-test
    echo maintained >/var/lib/ferry-test/maintained
    echo MAINTAINED
    systemd-run --on-active=3s --timer-property=AccuracySec=100ms systemctl poweroff >/dev/null 2>&1
    exit 0
fi
if [ -e /var/lib/ferry-test/written ]; then echo WRITTEN-BEFORE=yes; else echo WRITTEN-BEFORE=no; fi
mkdir -p /var/lib/ferry-test
echo hello > /var/lib/ferry-test/written
dd if=/dev/urandom of=/var/lib/ferry-test/big bs=1M count=64 2>/dev/null && sync && echo BIG-WRITTEN
echo "AGENTS=$(ps -eo args | grep -c '^@ferry-boot')"
ferry target status --export unix:/run/ferry/agent.sock --json | tr -d '\n' | sed 's/^/STATUS=/'
echo
"#;

/// `ferry ARGS --api --token --json` against `farm`, which must succeed.
fn json(farm: &Farm, args: &[&str]) -> Value {
    let out = ferry()
        .args(args)
        .args(["--api", &farm.api, "--token", &farm.token, "--json"])
        .args(["--farm-ca", path_str(&farm.ca())])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ferry {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Value::Null;
    }
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A farm (`ferry farm init`) with its servers.
struct Farm {
    dir: PathBuf,
    api: String,
    token: String,
    /// Per server: its name, NBD port, boot port, API URL and process (None once killed).
    servers: Vec<(String, u16, u16, String, Option<Proc>)>,
}

impl Farm {
    fn init(dir: &Path) -> Farm {
        std::fs::create_dir_all(dir).unwrap();
        let data = dir.join("data");
        let out = ferry()
            .args(["farm", "init", "--data", path_str(&data), "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let init: Value = serde_json::from_slice(&out.stdout).unwrap();
        Farm {
            dir: dir.to_path_buf(),
            api: String::new(),
            token: init["admin_token"].as_str().unwrap().to_string(),
            servers: Vec::new(),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn ca(&self) -> PathBuf {
        self.data().join("secrets").join("ca-cert.pem")
    }

    fn store(&self) -> PathBuf {
        self.data().join("stores").join("main")
    }

    /// Starts server `name` (API, NBD and boot on free loopback ports; devices reach it as
    /// 10.0.2.2); the first one's API is the farm's API for the test's commands.
    fn start_server(&mut self, name: &str) {
        std::fs::create_dir_all(self.store()).unwrap();
        let (api, nbd, boot) = (free_port(), free_port(), free_port());
        let mut cmd = ferry();
        cmd.args(["server", "--farm", path_str(&self.data())])
            .args(["--store", path_str(&self.store())])
            .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
            .arg("--metrics-listen=")
            .arg(format!("--api-listen=127.0.0.1:{api}"))
            .arg(format!("--boot-listen=127.0.0.1:{boot}"))
            .args(["--advertise", "10.0.2.2"])
            .args(["--server-name", name]);
        let mut p = Proc::spawn(&mut cmd, self.dir.join(format!("{name}.log")));
        p.wait_until("serving the boot service", || {
            TcpStream::connect(("127.0.0.1", boot)).is_ok()
                && TcpStream::connect(("127.0.0.1", api)).is_ok()
                && TcpStream::connect(("127.0.0.1", nbd)).is_ok()
        });
        let url = format!("https://127.0.0.1:{api}");
        if self.servers.is_empty() {
            self.api = url.clone();
        }
        self.servers
            .push((name.to_string(), nbd, boot, url, Some(p)));
    }

    /// The boot URL of the first server still running.
    fn bootfile(&self) -> String {
        let (_, _, boot, _, _) = self
            .servers
            .iter()
            .find(|s| s.4.is_some())
            .expect("a server runs");
        format!("http://10.0.2.2:{boot}/boot/ipxe")
    }

    /// SIGKILL of the server whose NBD port is `nbd`; returns its name.
    fn kill_nbd(&mut self, nbd: u16) -> String {
        let s = self
            .servers
            .iter_mut()
            .find(|s| s.1 == nbd)
            .unwrap_or_else(|| panic!("no server on NBD port {nbd}"));
        s.4.take().expect("running").kill();
        let name = s.0.clone();
        // The test's commands go to a server still running.
        if let Some(alive) = self.servers.iter().find(|s| s.4.is_some()) {
            self.api = alive.3.clone();
        }
        name
    }
}

impl Drop for Farm {
    fn drop(&mut self) {
        for p in self.servers.iter_mut().filter_map(|s| s.4.take()) {
            p.kill();
        }
    }
}

/// One machine: a MAC, a blank overflow disk, its console log.
fn machine(dir: &Path, farm: &Farm, mac: &str, tag: &str) -> guest::Running {
    qemu(dir, farm, mac, tag)
        .spawn()
        .unwrap_or_else(|e| panic!("start machine {tag}: {e}"))
}

/// [`machine`] with UEFI firmware (OVMF; QEMU's iPXE EFI ROM on the NIC).
fn machine_uefi(dir: &Path, farm: &Farm, mac: &str, tag: &str) -> guest::Running {
    qemu(dir, farm, mac, tag)
        .uefi()
        .spawn()
        .unwrap_or_else(|e| panic!("start machine {tag}: {e}"))
}

/// The firmware of a machine.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Firmware {
    Bios,
    Uefi,
}

/// Checks that the kernel of `vm` started as the firmware says: as an EFI program under
/// UEFI (the EFI stub's `efi: EFI v…` line), not under BIOS.
fn started_as(vm: &guest::Running, step: &str, fw: Firmware) {
    let efi = vm.log().contains("efi: EFI v");
    assert_eq!(
        efi,
        fw == Firmware::Uefi,
        "{step}: the kernel did not start as {fw:?} says: {}",
        vm.log()
    );
}

/// [`machine`] with a TPM 2.0 (`tpm-tis`) whose chip state is `dir/tpm`, kept from boot to
/// boot as a machine's own TPM is. The TPM must be dropped after the machine is killed.
fn machine_with_tpm(
    dir: &Path,
    farm: &Farm,
    mac: &str,
    tag: &str,
    fw: Firmware,
) -> (guest::Running, guest::Swtpm) {
    let tpm = guest::Swtpm::start(&dir.join("tpm")).expect("start swtpm");
    let q = qemu(dir, farm, mac, tag);
    let q = if fw == Firmware::Uefi { q.uefi() } else { q };
    let vm = q
        .tpm(&tpm)
        .spawn()
        .unwrap_or_else(|e| panic!("start machine {tag}: {e}"));
    (vm, tpm)
}

/// The machine `tag` of `mac`: network boot from `farm`, a 256 MiB overflow disk.
fn qemu(dir: &Path, farm: &Farm, mac: &str, tag: &str) -> guest::Qemu {
    let overflow = dir.join(format!("overflow-{tag}.raw"));
    let f = std::fs::File::create(&overflow).unwrap();
    f.set_len(256 << 20).unwrap();
    guest::Qemu::new(dir.join(format!("console-{tag}.log")))
        .memory_mib(GUEST_MIB)
        .mac(mac)
        .bootfile(&farm.bootfile())
        .disk(&overflow)
        .network_boot()
}

fn booted(vm: &mut guest::Running, step: &str, version: &str) -> guest::TestOutput {
    let marker = format!("{} version={version}", guest::BOOT_MARKER);
    if let Err(e) = vm.wait_for(&marker, BOOT_WAIT) {
        panic!("{step}: no {marker:?} on the console: {e}");
    }
    let out = vm
        .test_output()
        .unwrap_or_else(|| panic!("{step}: no test output: {}", vm.log()));
    println!("{step}: booted in {:?}", vm.elapsed());
    out
}

/// Without a farm: a plain `ferry server` export of the image, booted with the image's
/// own kernel and initramfs and `ferry.server=` on the command line. The machine runs the
/// test OS's small init (systemd's part is the farm test's first boot) with the boot agent
/// serving its root after switch_root, and its writes stay in its RAM.
#[test]
fn a_machine_boots_a_plain_export_through_the_boot_agent() {
    if !runnable("a_machine_boots_a_plain_export_through_the_boot_agent") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let install = "ferry target install-initramfs --agent /root/ferry-boot --update \
                   && rm /root/ferry-boot";
    let image = guest::ImageBuilder::new(guest::guest_root())
        .copy(stripped_ferry(dir), "/usr/local/bin/ferry", 0o755)
        .copy(boot_agent(), "/root/ferry-boot", 0o755)
        .version("plain")
        .test_script(TEST_SCRIPT)
        .quick_init()
        .run_in_root(install)
        .build(&dir.join("image"))
        .expect("build the image");
    let store = dir.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let vhdx = store.join("debian.vhdx");
    capture(&image.disk, &vhdx);
    let nbd = free_port();
    let mut cmd = ferry();
    cmd.args(["server", "--store", path_str(&store)])
        .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
        .arg("--metrics-listen=");
    let mut server = Proc::spawn(&mut cmd, dir.join("server.log"));
    server.wait_until("serving NBD", || {
        TcpStream::connect(("127.0.0.1", nbd)).is_ok()
    });
    let append = format!(
        "boot=ferry ip=dhcp ferry.server=10.0.2.2:{nbd} ferry.export=debian ferry.cache=ram \
         root=/dev/nbd0p1 console=ttyS0 panic=30 init={}",
        guest::QUICK_INIT_PATH
    );
    let mut vm = guest::Qemu::new(dir.join("console.log"))
        .memory_mib(GUEST_MIB)
        .direct_boot(&image.kernel, &image.initrd, &append)
        .spawn()
        .expect("start the machine");
    let out = booted(&mut vm, "plain export", "plain");
    assert!(out.text.contains("WRITTEN-BEFORE=no"), "{}", out.text);
    assert!(
        out.text.contains("AGENTS=1"),
        "the agent runs after switch_root: {}",
        out.text
    );
    vm.kill();
    assert!(
        std::fs::read_to_string(dir.join("console.log"))
            .unwrap_or_default()
            .contains("ferry-boot: /dev/nbd0 is export debian"),
        "the agent said what it attached"
    );
    server.stop();
}

/// A farm with server s1, the golden image captured as vDisk `debian` (RAM with overflow,
/// its console on the serial port) in collection 1, and the image's raw disk.
fn golden_farm(dir: &Path) -> (Farm, guest::GuestImage) {
    let mut farm = Farm::init(&dir.join("farm"));
    farm.start_server("s1");
    json(
        &farm,
        &["farm", "settings", "--boot-ticket-secs", TICKET_SECS],
    );
    let image = common::boot::golden_image(dir, &farm.ca(), TEST_SCRIPT);
    capture(&image.disk, &farm.store().join("debian.vhdx"));
    if json(&farm, &["site", "list"])["total"] == 0 {
        json(&farm, &["site", "add", "hq"]);
    }
    json(&farm, &["store", "add", "main", "--path", "main"]);
    let vdisk = ["farm", "vdisk", "add", "debian", "--store", "1"];
    let cache = [
        "--cache-mode",
        "ram_overflow",
        "--ram-bytes",
        CACHE_RAM_BYTES,
    ];
    json(&farm, &[&vdisk[..], &cache[..]].concat());
    // The test OS has no /etc/kernel/cmdline: its console is the serial port.
    set_cmdline(&farm, "debian", "console=ttyS0");
    let lab = [
        "collection",
        "add",
        "lab",
        "--site",
        "1",
        "--vdisk",
        "debian",
    ];
    json(&farm, &lab);
    (farm, image)
}

fn set_cmdline(farm: &Farm, vdisk: &str, cmdline: &str) {
    json(
        farm,
        &["farm", "vdisk", "set", vdisk, "--boot-cmdline", cmdline],
    );
}

/// A diskless production device of collection 1.
fn add_device(farm: &Farm, mac: &str, name: &str, vdisk: &str) {
    add_device_of(farm, mac, name, vdisk, "production");
}

/// A diskless device of type `kind` (production, test, maintenance).
fn add_device_of(farm: &Farm, mac: &str, name: &str, vdisk: &str, kind: &str) {
    let kind = ["--type", kind, "--diskless"];
    let a = [
        "device",
        "add",
        mac,
        "--name",
        name,
        "--collection",
        "1",
        "--vdisk",
        vdisk,
    ];
    json(farm, &[&a[..], &kind[..]].concat());
}

/// Steps 1 to 4 of the module's list: a systemd boot, the boot set, a promoted version, a
/// server killed mid-boot.
#[test]
fn a_bare_machine_boots_a_farm_version_diskless() {
    if !runnable("a_bare_machine_boots_a_farm_version_diskless") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mut farm, image) = golden_farm(dir);
    let mac1 = "52:54:00:f0:00:01";
    add_device(&farm, mac1, "pc1", "debian");

    // 1. First boot: multi-user, a file written, 64 MiB past the RAM into the overflow.
    //    The machine has a TPM: its ticket login's new key goes into it, and the farm is
    //    told (so it issues this device no more tickets).
    let (mut vm, tpm) = machine_with_tpm(dir, &farm, mac1, "first", Firmware::Bios);
    let out = booted(&mut vm, "first boot", "v1");
    assert!(
        vm.log()
            .contains("the device key is kept in this machine's TPM now"),
        "first boot: the key went into the TPM: {}",
        vm.log()
    );
    assert!(
        vm.log().contains("ferry.ticket=ft_"),
        "first boot: the kernel's command line shows the script's ticket: {}",
        vm.log()
    );
    assert!(
        out.text.contains("WRITTEN-BEFORE=no"),
        "first boot: {}",
        out.text
    );
    assert!(out.text.contains("BIG-WRITTEN"), "first boot: {}", out.text);
    assert!(
        out.text.contains("AGENTS=1"),
        "the agent runs after switch_root: {}",
        out.text
    );
    let status = agent_status(&out, "first boot");
    assert!(
        status["overflow_bytes"].as_u64().unwrap_or(0) > 0,
        "64 MiB past 16 MiB of RAM reached the overflow disk: {status}"
    );
    // Status does not go dark at switch_root: the 64 MiB written after it show in the
    // farm's status (the boot agent reads its own status in-process, not through /run,
    // which the initramfs moved under the new root).
    farm_counters(&farm, &farm.api, mac1, "first boot", &vm, |c| {
        c["bytes_written"].as_u64().unwrap_or(0) >= 64 << 20
    });
    vm.kill();
    drop(tpm);

    // From here on the boots' subject is the boot path, not systemd (the first boot
    // reached multi-user): the test OS's small init runs the test script and prints the
    // marker once the root is mounted, saving each TCG boot systemd's start.
    set_cmdline(&farm, "debian", &quick_cmdline());

    // 2. Power cycle: the file is gone. The first boot's reads are the version's boot
    //    set in the farm, and the boot agent reads it ahead of this boot's kernel.
    //    Its boot script has no ticket now: the key in its TPM logs it in.
    let set = wait_boot_set(&farm, "debian@0");
    let (mut vm, tpm) = machine_with_tpm(dir, &farm, mac1, "second", Firmware::Bios);
    let out = booted(&mut vm, "second boot", "v1");
    assert!(
        vm.log()
            .contains("logged in with the key kept in this machine's TPM"),
        "second boot: the TPM's key logged it in: {}",
        vm.log()
    );
    assert!(
        !vm.log().contains("ferry.ticket="),
        "no ticket in a TPM-bound device's boot: {}",
        vm.log()
    );
    assert!(
        out.text.contains("WRITTEN-BEFORE=no"),
        "second boot kept a write: {}",
        out.text
    );
    let status = agent_status(&out, "second boot");
    let prefetch = &status["prefetch"];
    // The agent counts the set in its cache's blocks (64 KiB), the farm in 4 KiB pages.
    assert!(
        prefetch["set_bytes"].as_u64().unwrap_or(0) >= set["bytes"].as_u64().unwrap(),
        "the agent had the farm's set ({set}): {status}"
    );
    assert!(
        prefetch["fetched_bytes"].as_u64().unwrap_or(0) > 0,
        "the boot agent prefetched the set: {status}"
    );
    let cache = &status["host_cache"];
    assert_eq!(cache["path"], "private", "{status}");
    assert!(
        cache["hit_bytes"].as_u64().unwrap_or(0) > 0,
        "the kernel's reads found prefetched blocks: {status}"
    );
    println!("second boot: prefetch {prefetch}, cache {cache}");
    vm.kill();
    drop(tpm);

    // 3. Maintenance (issue 31): a new version, booted by a maintenance device to
    //    multi-user with systemd, changed from inside (its /etc/ferry-version says v2), and
    //    powered off from inside (`systemctl poweroff`). Every write reaches the version,
    //    which is left clean (e2fsck -n; no journal to replay at the next boot); the
    //    machine's session ends with its shutdown, so the version is promotable at once;
    //    the production device's next boot runs it, with the change.
    let v = json(&farm, &["version", "new", "--vdisk", "debian"]);
    let file = farm
        .store()
        .join(v["file_name"].as_str().expect("version file name"));
    let mac2 = "52:54:00:f0:00:02";
    add_device_of(&farm, mac2, "maint", "debian", "maintenance");
    set_cmdline(&farm, "debian", "console=ttyS0 ferrytest=maintain");
    let mut vm = machine(dir, &farm, mac2, "maintenance");
    expect_message(&mut vm, "maintenance", "MAINTAINED");
    if let Err(e) = vm.wait_exit(BOOT_WAIT) {
        panic!("maintenance: the machine did not power off: {e}");
    }
    let log = vm.log();
    println!("maintenance: powered off after {:?}", vm.elapsed());
    assert!(
        log.contains("ferry: session ended at the farm"),
        "maintenance: the clean shutdown ended the session: {log}"
    );
    for bad in [
        "shutting down sockets",
        "I/O error",
        "EXT4-fs error",
        "NBD_DO_IT",
    ] {
        assert!(
            !log.contains(bad),
            "maintenance: {bad:?} at the shutdown: {log}"
        );
    }
    // Promotable at once, with no `session end`; the promotion lets the version go.
    json(&farm, &["version", "promote", "1", "--vdisk", "debian"]);
    version_clean(&farm, &file, image.fs_offset, image.fs_bytes, dir);
    let p = json(&farm, &["version", "promote", "1", "--vdisk", "debian"]);
    assert_eq!(p["access"], "production", "{p}");
    set_cmdline(&farm, "debian", &quick_cmdline());
    // The device keeps its key in its TPM since the first boot: each boot has it.
    let (mut vm, tpm) = machine_with_tpm(dir, &farm, mac1, "promoted", Firmware::Bios);
    let out = booted(&mut vm, "after the promotion", "v2");
    assert!(
        out.text.contains("MAINTAINED-BEFORE=yes"),
        "the maintenance change is in the version: {}",
        out.text
    );
    for replay in ["recovery required", "recovery complete", "orphan"] {
        assert!(
            !vm.log().contains(replay),
            "after the promotion: the version's journal was replayed ({replay:?}): {}",
            vm.log()
        );
    }
    vm.kill();
    drop(tpm);

    // 4. Two servers; the one the machine streams from is killed once its root is
    //    attached, before the kernel mounts it: the boot (init, the test script, `ferry`
    //    read from the root) completes from the other. This machine has UEFI firmware
    //    (the same device and TPM): the agent's failover is the firmware's business no more.
    farm.start_server("s2");
    let (mut vm, tpm) = machine_with_tpm(dir, &farm, mac1, "failover", Firmware::Uefi);
    if let Err(e) = vm.wait_for("ferry-boot: /dev/nbd0 is", BOOT_WAIT) {
        panic!("failover: the agent never attached: {e}");
    }
    let serving = serving_port(&vm.log());
    let killed = farm.kill_nbd(serving);
    println!(
        "failover: killed {killed} (NBD port {serving}) after {:?}",
        vm.elapsed()
    );
    booted(&mut vm, "failover", "v2");
    started_as(&vm, "failover", Firmware::Uefi);
    // Its counters show through the API of the server it failed over to (the one the
    // test's commands use now) as through the first one's (shared in the database).
    let (_, _, _, api2, _) = farm.servers.iter().find(|s| s.4.is_some()).unwrap();
    farm_counters(&farm, api2, mac1, "failover", &vm, |c| {
        c["bytes_read"].as_u64().unwrap_or(0) > 0 && c["server_name"].as_str().is_some()
    });
    vm.kill();
    drop(tpm);
}

/// The small init of the test OS on the serial console.
fn quick_cmdline() -> String {
    format!("console=ttyS0 init={}", guest::QUICK_INIT_PATH)
}

/// Steps 5 and 6 of the module's list, on a farm of their own (so that they run beside
/// steps 1 to 4): four machines at once, the bad paths.
#[test]
fn four_machines_boot_at_once_and_bad_paths_end_in_a_message() {
    if !runnable("four_machines_boot_at_once_and_bad_paths_end_in_a_message") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (farm, _image) = golden_farm(dir);
    set_cmdline(&farm, "debian", &quick_cmdline());
    let macs = [
        "52:54:00:f0:00:01",
        "52:54:00:f0:00:02",
        "52:54:00:f0:00:03",
        "52:54:00:f0:00:04",
    ];
    for (i, mac) in macs.iter().enumerate() {
        add_device(&farm, mac, &format!("pc{}", i + 1), "debian");
    }

    // 5. Four machines at once, two with BIOS and two with UEFI firmware.
    let fw = |i: usize| {
        if i % 2 == 1 {
            Firmware::Uefi
        } else {
            Firmware::Bios
        }
    };
    let mut vms: Vec<_> = macs
        .iter()
        .enumerate()
        .map(|(i, mac)| match fw(i) {
            Firmware::Uefi => machine_uefi(dir, &farm, mac, &format!("four-{i}")),
            Firmware::Bios => machine(dir, &farm, mac, &format!("four-{i}")),
        })
        .collect();
    for (i, vm) in vms.iter_mut().enumerate() {
        let step = format!("four at once, machine {i} ({:?})", fw(i));
        let out = booted(vm, &step, "v1");
        assert!(
            out.text.contains("WRITTEN-BEFORE=no"),
            "{step}: {}",
            out.text
        );
        started_as(vm, &step, fw(i));
    }
    drop(vms);
    // A UEFI machine's writes are gone after a power cycle, as a BIOS one's (step 2).
    let mut vm = machine_uefi(dir, &farm, macs[1], "four-1-again");
    let out = booted(&mut vm, "UEFI power cycle", "v1");
    assert!(
        out.text.contains("WRITTEN-BEFORE=no"),
        "UEFI power cycle: the last boot's file is there: {}",
        out.text
    );
    started_as(&vm, "UEFI power cycle", Firmware::Uefi);
    drop(vm);

    // 6. Bad paths: a message on the console, never a hang.
    // An unknown MAC: iPXE says why, once, and gives the machine back to its firmware.
    let mut vm = machine(dir, &farm, "52:54:00:f0:00:99", "unknown");
    expect_message(&mut vm, "unknown MAC", "Ferry: this machine cannot boot");
    stops(&mut vm, "unknown MAC");
    one_reason(&vm, "unknown MAC", "ferry device add 52:54:00:f0:00:99");
    // A vDisk of its own, whose boot overrides change per step.
    std::fs::copy(
        farm.store().join("debian.vhdx"),
        farm.store().join("bad.vhdx"),
    )
    .unwrap();
    let vdisk = ["farm", "vdisk", "add", "bad", "--store", "1"];
    json(
        &farm,
        &[&vdisk[..], &["--ram-bytes", CACHE_RAM_BYTES][..]].concat(),
    );
    let bad_mac = "52:54:00:f0:00:05";
    add_device(&farm, bad_mac, "bad1", "bad");
    // A login ticket not of this boot (forged, or used already) after the script's own.
    // Refused inside the initramfs, the machine reboots after `panic=` (30 s by default; the
    // vDisk's own `panic=1` comes later on the command line and wins).
    set_cmdline(
        &farm,
        "bad",
        &format!("console=ttyS0 panic=1 ferry.ticket={STALE_TICKET}"),
    );
    let mut vm = machine(dir, &farm, bad_mac, "stale-ticket");
    expect_message(
        &mut vm,
        "stale ticket",
        "ferry-boot: cannot boot: device login",
    );
    expect_message(&mut vm, "stale ticket", "used or expired ticket");
    expect_message(&mut vm, "stale ticket", "Ferry: this machine cannot boot");
    reboots(&mut vm, "stale ticket");
    one_reason(&vm, "stale ticket", "used or expired ticket");
    // The farm's API unreachable.
    // A short login wait (ferry.login_wait=, 60 s by default) ends the attempt sooner.
    let unreachable = "console=ttyS0 panic=1 ferry.api=https://10.0.2.2:9 ferry.login_wait=5";
    set_cmdline(&farm, "bad", unreachable);
    let mut vm = machine(dir, &farm, bad_mac, "unreachable");
    expect_message(&mut vm, "unreachable", "(server unreachable)");
    reboots(&mut vm, "unreachable");
    one_reason(&vm, "unreachable", "(server unreachable)");
    // The version's file deleted from the store.
    std::fs::remove_file(farm.store().join("bad.vhdx")).unwrap();
    let mut vm = machine(dir, &farm, bad_mac, "deleted");
    expect_message(
        &mut vm,
        "deleted version",
        "Ferry: this machine cannot boot",
    );
    stops(&mut vm, "deleted version");
    one_reason(&vm, "deleted version", "bad.vhdx");
}
