//! The network boot routes through their router (no sockets), on SQLite and PostgreSQL,
//! over a real vDisk: an ext4 filesystem made by `mkfs.ext4 -d` with `/boot/vmlinuz-*` and
//! its initramfs, captured into the store's VHDX by Ferry. The chain script, a device's
//! script (its kernel command line), the kernel and initramfs bytes (GET and HEAD), the
//! on-disk cache (modes, re-read when the version file changes), one boot file search per
//! version file state, refusals, and what an outsider cannot get: nothing of the API, no
//! other file.
//!
//! `mkfs.ext4` follows the tool rule (docs/testing.md): missing outside CI, a test prints
//! why and returns; under `CI=true` it fails.

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use api::boot::{BootConfig, BootState};
use api::boot_source::BootfilesSource;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::TestFarm;
use farm::input::{NewCollection, NewDevice, NewSite, NewStore, NewVDisk};
use tower::ServiceExt as _;

const ADMIN: &str = "admin";
const MAC: &str = "52:54:00:12:34:56";
const API_URL: &str = "https://10.0.2.2:8443";
const KVER: &str = "6.1.0-13-amd64";
/// Where `MAC`'s script loads its boot files from.
const FILES: &str = "/boot/files/52-54-00-12-34-56";

fn have_mkfs() -> bool {
    let ok = Command::new("mkfs.ext4")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "mkfs.ext4 is required under CI"
        );
        eprintln!("mkfs.ext4 not found: skipping");
    }
    ok
}

/// Bytes that differ per name.
fn fake(name: &str, len: usize) -> Vec<u8> {
    let mut x: u32 = name.bytes().fold(2_166_136_261, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16_777_619)
    });
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// What the hostile image holds beside its real kernel: the image's own secrets, and
/// links to them where a kernel is looked for.
const SHADOW: &[u8] = b"root:$6$secret:19000:0:99999:7:::\n";
const HOSTILE_LINKS: [(&str, &str); 3] = [
    ("vmlinuz", "etc/shadow"),
    ("initrd.img", "/etc/shadow"),
    ("boot/vmlinuz-9.9.9-evil", "../etc/shadow"),
];

/// A root filesystem on the whole disk, captured into `vhdx`; `hostile`: with `/etc/shadow`
/// and [`HOSTILE_LINKS`] to it.
fn root_image(work: &Path, vhdx: &Path, hostile: bool) {
    let tree = work.join("tree");
    for d in ["etc/kernel", "sbin", "usr", "boot"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    if hostile {
        std::fs::write(tree.join("etc/shadow"), SHADOW).unwrap();
        for (link, to) in HOSTILE_LINKS {
            std::os::unix::fs::symlink(to, tree.join(link)).unwrap();
        }
    }
    std::fs::write(
        tree.join(format!("boot/vmlinuz-{KVER}")),
        fake("kernel", 3 << 20),
    )
    .unwrap();
    std::fs::write(
        tree.join(format!("boot/initrd.img-{KVER}")),
        fake("initrd", 5 << 20),
    )
    .unwrap();
    std::fs::write(
        tree.join("etc/kernel/cmdline"),
        "root=UUID=2f4c1e8a-6b1d-4c77-9a1e-0d3b5f6a7c01 ro quiet\n",
    )
    .unwrap();
    let raw = work.join("root.raw");
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&tree)
        .arg(&raw)
        .arg("32M")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    disk::ops::capture::capture(
        &raw,
        vhdx,
        &disk::ops::capture::CaptureOptions::default(),
        &disk::ops::NoProgress,
    )
    .unwrap();
}

struct Boot {
    t: TestFarm,
    router: axum::Router,
    state: BootState,
    vdisk: i64,
    collection: i64,
    cache: std::path::PathBuf,
    version_file: std::path::PathBuf,
}

/// A farm with vDisk "golden" (the root image), a collection that adds no device, and the
/// diskless device `MAC` on the vDisk; the boot router over it.
async fn setup(t: TestFarm) -> Boot {
    setup_image(t, false).await
}

/// [`setup`], the image [`root_image`]'s `hostile` one when asked.
async fn setup_image(t: TestFarm, hostile: bool) -> Boot {
    let f = &t.farm;
    let site = f
        .create_site(
            &NewSite {
                name: "hq".into(),
                description: String::new(),
            },
            ADMIN,
        )
        .await
        .unwrap();
    let store = NewStore {
        name: "main".into(),
        path: "main".into(),
        bucket: String::new(),
    };
    let store = f.create_store(&store, ADMIN).await.unwrap();
    let dir = f.store_dir(store.id, None).await.unwrap();
    let version_file = dir.join("golden.vhdx");
    root_image(t.dir.path(), &version_file, hostile);
    let n = NewVDisk {
        store_id: store.id,
        name: "golden".into(),
        size_bytes: None,
        cache_mode: None,
        ram_bytes: None,
        description: String::new(),
    };
    let vdisk = f.create_vdisk(&n, ADMIN).await.unwrap().id;
    let c = NewCollection {
        site_id: site.id,
        name: "lab".into(),
        auto_add: false,
        default_vdisk_id: None,
        auto_add_max: None,
        auto_add_per_minute: None,
    };
    let collection = f.create_collection(&c, ADMIN).await.unwrap().id;
    let d = NewDevice {
        collection_id: collection,
        mac: MAC.into(),
        name: "vm1".into(),
        device_type: None,
        vdisk_id: Some(vdisk),
        cache_mode: None,
        ram_bytes: None,
        pinned_version: None,
        diskless: true,
    };
    f.create_device(&d, ADMIN).await.unwrap();
    let p = farm::input::VDiskPatch {
        boot_cmdline: Some("console=ttyS0,115200".into()),
        ..Default::default()
    };
    f.update_vdisk(vdisk, &p, ADMIN).await.unwrap();
    let cache = t.dir.path().join("data").join("boot-cache");
    let state = BootState::new(
        Arc::clone(&t.farm),
        None,
        BootConfig {
            api_urls: vec![API_URL.into()],
            site_apis: true,
            cache_dir: cache.clone(),
            source: Arc::new(BootfilesSource),
        },
    );
    Boot {
        router: api::boot::router(state.clone()),
        state,
        t,
        vdisk,
        collection,
        cache,
        version_file,
    }
}

impl Boot {
    async fn get(&self, method: Method, uri: &str) -> (StatusCode, Option<u64>, Vec<u8>) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let len = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let body = axum::body::to_bytes(resp.into_body(), 64 << 20)
            .await
            .unwrap();
        (status, len, body.to_vec())
    }

    /// Adds the diskless device `mac` of `device_type` on the vDisk, in the collection.
    async fn device(&self, mac: &str, device_type: farm::model::DeviceType) {
        let d = NewDevice {
            collection_id: self.collection,
            mac: mac.into(),
            name: mac.replace(':', ""),
            device_type: Some(device_type),
            vdisk_id: Some(self.vdisk),
            cache_mode: None,
            ram_bytes: None,
            pinned_version: None,
            diskless: true,
        };
        self.t.farm.create_device(&d, ADMIN).await.unwrap();
    }

    async fn text(&self, uri: &str) -> String {
        let (s, _, b) = self.get(Method::GET, uri).await;
        assert_eq!(s, StatusCode::OK, "{uri}");
        String::from_utf8(b).unwrap()
    }
}

async fn a_device_gets_its_script_and_its_version_s_kernel_and_initrd(t: TestFarm) {
    if !have_mkfs() {
        return;
    }
    let b = setup(t).await;
    let chain = b.text("/boot/ipxe").await;
    assert!(chain.starts_with("#!ipxe\n"), "{chain}");
    assert!(chain.contains("chain --autofree /boot/ipxe/${netX/mac:hexhyp}"));
    let script = b.text("/boot/ipxe/52-54-00-12-34-56").await;
    let id = b.vdisk;
    let want = format!(
        "kernel /boot/files/52-54-00-12-34-56/{id}/0/kernel initrd=initrd boot=ferry \
         ip=${{netX/ip}}::${{netX/gateway}}:${{netX/netmask}}:::off:${{netX/dns}} \
         BOOTIF=01-${{netX/mac:hexhyp}} ferry.api={API_URL} ferry.mac={MAC} ferry.vdisk=golden ferry.version=0 \
         TICKET root=/dev/nbd0 panic=30 ro quiet console=ttyS0,115200 || goto failed\n"
    );
    // The diskless device's one-time login ticket of this boot.
    let ticket = ticket_of(&script).expect("a diskless device's script carries a ticket");
    let shown = script.replace(&format!("ferry.ticket={ticket}"), "TICKET");
    assert!(shown.contains(&want), "{script}");
    assert!(script.contains(&format!(
        "initrd --name initrd /boot/files/52-54-00-12-34-56/{id}/0/initrd"
    )));
    assert!(script.contains("echo Ferry: device vm1 (52:54:00:12:34:56) boots vDisk golden"));
    let (s, len, kernel) = b.get(Method::GET, &format!("{FILES}/{id}/0/kernel")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(kernel, fake("kernel", 3 << 20));
    assert_eq!(len, Some(3 << 20));
    let (s, len, body) = b.get(Method::HEAD, &format!("{FILES}/{id}/0/initrd")).await;
    assert_eq!((s, len, body.len()), (StatusCode::OK, Some(5 << 20), 0));
    let (_, _, initrd) = b.get(Method::GET, &format!("{FILES}/{id}/0/initrd")).await;
    assert_eq!(initrd, fake("initrd", 5 << 20));
    // Cached: owner-only, filled once per file.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&b.cache), 0o700);
    let files: Vec<_> = std::fs::read_dir(&b.cache).unwrap().flatten().collect();
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        assert_eq!(mode(&f.path()), 0o600);
    }
    let c = b.state.counters();
    assert_eq!(c.fills.load(Ordering::Relaxed), 2);
    b.get(Method::GET, &format!("{FILES}/{id}/0/kernel")).await;
    assert_eq!(c.fills.load(Ordering::Relaxed), 2);
    assert_eq!(c.scripts.load(Ordering::Relaxed), 1);
    // The script, the kernel and the initramfs (two fills) shared one search of the
    // version's chain; a second boot's script searches nothing.
    assert_eq!(c.searches.load(Ordering::Relaxed), 1);
    b.text("/boot/ipxe/52-54-00-12-34-56").await;
    assert_eq!(c.searches.load(Ordering::Relaxed), 1);
    // The version file changes (a maintenance version written): read again, old entry gone.
    let f = std::fs::File::options()
        .write(true)
        .open(&b.version_file)
        .unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    f.set_modified(later).unwrap();
    let (_, _, again) = b.get(Method::GET, &format!("{FILES}/{id}/0/kernel")).await;
    assert_eq!(again, kernel);
    assert_eq!(c.fills.load(Ordering::Relaxed), 3);
    assert_eq!(
        c.searches.load(Ordering::Relaxed),
        2,
        "a changed version file"
    );
    assert_eq!(std::fs::read_dir(&b.cache).unwrap().count(), 2);

    // Issue 31: the script names the APIs the site's other live servers registered after
    // its own, so the device logs in and reports through another when this one goes away;
    // a server of another site is not named.
    let site = b.t.farm.collection(b.collection).await.unwrap().site_id;
    let other_site =
        b.t.farm
            .create_site(
                &NewSite {
                    name: "branch".into(),
                    description: String::new(),
                },
                ADMIN,
            )
            .await
            .unwrap()
            .id;
    for (site_id, name, n) in [(site, "pvs-2", 2), (other_site, "pvs-9", 9)] {
        let s = farm::input::NewServer {
            site_id,
            name: name.into(),
            address: format!("10.0.0.{n}:10809"),
            uid: None,
            api_url: Some(format!("https://10.0.0.{n}:8443")),
        };
        b.t.farm.register_server(&s, ADMIN).await.unwrap();
    }
    let script = b.text("/boot/ipxe/52-54-00-12-34-56").await;
    assert!(
        script.contains(&format!("ferry.api={API_URL},https://10.0.0.2:8443 ")),
        "{script}"
    );
    drop(b.t);
}

/// The `ferry.ticket=` of a boot script.
fn ticket_of(script: &str) -> Option<String> {
    let at = script.find("ferry.ticket=")? + "ferry.ticket=".len();
    let rest = &script[at..];
    Some(rest[..rest.find(' ').unwrap_or(rest.len())].to_string())
}

/// Every run of at least 16 hex digits in `bytes` (with an `ft_` prefix kept), as text.
fn hex_runs(bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, b) in bytes.iter().chain(std::iter::once(&b' ')).enumerate() {
        match (b.is_ascii_hexdigit(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if i - s >= 16 {
                    let prefixed = s >= 3 && &bytes[s - 3..s] == b"ft_";
                    let run = String::from_utf8_lossy(&bytes[s..i]).into_owned();
                    out.push(if prefixed { format!("ft_{run}") } else { run });
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Issue 30 (H4): everything the boot port serves, fetched as an outsider would (the chain
/// script, the boot script of one MAC, the version's kernel and initramfs; the image's
/// initramfs holds what `ferry target install-initramfs` puts there), gives nothing that
/// logs in as another device: no farm key, no device key, no ticket of another MAC.
async fn nothing_the_boot_port_serves_logs_in_as_another_device(t: TestFarm) {
    if !have_mkfs() {
        return;
    }
    let b = setup(t).await;
    let f = Arc::clone(&b.t.farm);
    let coll = f.list_collections(None, None).await.unwrap().items[0].id;
    // Another diskless device, and one with a disk and a key of its own.
    let (other, disk) = ("52:54:00:12:34:57", "52:54:00:12:34:58");
    let mut disk_id = 0;
    for (mac, diskless) in [(other, true), (disk, false)] {
        let d = NewDevice {
            collection_id: coll,
            mac: mac.into(),
            name: format!("vm-{}", &mac[15..]),
            device_type: None,
            vdisk_id: Some(b.vdisk),
            cache_mode: None,
            ram_bytes: None,
            pinned_version: None,
            diskless,
        };
        disk_id = f.create_device(&d, ADMIN).await.unwrap().id;
    }
    f.reset_device_credential(disk_id, ADMIN).await.unwrap();
    let id = b.vdisk;
    let mut served = Vec::new();
    for uri in [
        "/boot/ipxe".to_string(),
        "/boot/ipxe/52-54-00-12-34-56".to_string(),
        format!("{FILES}/{id}/0/kernel"),
        format!("{FILES}/{id}/0/initrd"),
    ] {
        let (s, _, body) = b.get(Method::GET, &uri).await;
        assert_eq!(s, StatusCode::OK, "{uri}");
        served.extend_from_slice(&body);
        served.push(b'\n');
    }
    let farm_key = b.t.secrets.farm_key_hex.clone();
    let text = String::from_utf8_lossy(&served);
    assert!(!text.contains(&farm_key), "the farm key is served");
    let mut candidates = hex_runs(&served);
    candidates.push(farm_key);
    assert!(
        candidates.iter().any(|c| c.starts_with("ft_")),
        "the script's ticket"
    );
    for mac in [other, disk] {
        for c in &candidates {
            let r = if c.starts_with("ft_") {
                farm::login::LoginRequest {
                    mac: mac.into(),
                    nonce: String::new(),
                    hmac: String::new(),
                    diskless: true,
                    ticket: Some(c.clone()),
                }
            } else {
                let ch = farm::login::ChallengeRequest { mac: mac.into() };
                let nonce = f.challenge(&ch, None).await.unwrap().nonce;
                let Ok(hmac) = farm::login::proof(c, &nonce, mac) else {
                    continue;
                };
                farm::login::LoginRequest {
                    mac: mac.into(),
                    nonce,
                    hmac,
                    diskless: true,
                    ticket: None,
                }
            };
            let e = f.login(&r, None).await.unwrap_err();
            assert_eq!(e.kind(), farm::Kind::Unauthenticated, "{mac} with {c}");
        }
    }
    assert_eq!(f.list_sessions(None, None).await.unwrap().total, 0);
    // The script's ticket is its own MAC's, once.
    let script = b.text("/boot/ipxe/52-54-00-12-34-56").await;
    let ticket = ticket_of(&script).unwrap();
    let r = farm::login::LoginRequest {
        mac: MAC.into(),
        nonce: String::new(),
        hmac: String::new(),
        diskless: true,
        ticket: Some(ticket),
    };
    f.login(&r, None).await.unwrap();
    assert_eq!(
        f.login(&r, None).await.unwrap_err().kind(),
        farm::Kind::Unauthenticated
    );
}

async fn refusals_are_scripts_that_say_why_and_power_off(t: TestFarm) {
    if !have_mkfs() {
        return;
    }
    let b = setup(t).await;
    for (mac, why) in [
        ("52-54-00-00-00-99", "ferry device add 52:54:00:00:00:99"),
        ("zz", "is not a MAC address"),
        ("52-54-00-00-00-99%0Akernel", "is not a MAC address"),
    ] {
        let s = b.text(&format!("/boot/ipxe/{mac}")).await;
        assert!(s.starts_with("#!ipxe\n"), "{s}");
        assert!(s.contains("echo Ferry: this machine cannot boot: "), "{s}");
        assert!(s.contains(why), "{mac}: {s}");
        assert!(
            s.ends_with(&format!("echo {}\nexit 0\n", api::boot_script::HANDED_BACK)),
            "{s}"
        );
        assert!(!s.lines().any(|l| l.starts_with("kernel")), "{s}");
    }
    // Issue 30: a MAC of 10,000 characters is shown bounded (not five times 400 of it).
    let long = "a".repeat(10_000);
    let s = b.text(&format!("/boot/ipxe/{long}")).await;
    assert!(s.contains("is not a MAC address"), "{s}");
    assert!(
        !s.contains(&"a".repeat(api::boot_script::MAC_SHOWN_CHARS_MAX + 1)),
        "{s}"
    );
    assert!(s.len() < 1024, "{} bytes: {s}", s.len());
    // The version's file gone: refused with its name.
    std::fs::remove_file(&b.version_file).unwrap();
    let s = b.text("/boot/ipxe/52-54-00-12-34-56").await;
    assert!(s.contains("golden.vhdx"), "{s}");
    assert!(b.state.counters().refusals.load(Ordering::Relaxed) >= 4);
}

async fn an_outsider_gets_nothing_but_boot_files(t: TestFarm) {
    if !have_mkfs() {
        return;
    }
    let b = setup(t).await;
    let id = b.vdisk;
    let admin = b.t.secrets.admin_token.clone();
    for uri in [
        "/api/v1/farm".to_string(),
        "/api/v1/openapi.json".to_string(),
        format!("/api/v1/devices?token={admin}"),
        "/".to_string(),
        "/boot/".to_string(),
        format!("{FILES}/{id}/0/cmdline"),
        format!("{FILES}/{id}/0/..%2F..%2Fetc%2Fpasswd"),
        format!("{FILES}/{id}/0/../../../etc/passwd"),
        format!("{FILES}/{id}/0/kernel/../../golden.vhdx"),
        format!("{FILES}/{id}/7/kernel"),
        format!("{FILES}/999/0/kernel"),
        format!("{FILES}/1/x/kernel"),
        format!("{FILES}/-1/0/kernel"),
        format!("/boot/files/{id}/0/kernel"),
        format!("/boot/files/52-54-00-00-00-99/{id}/0/kernel"),
        format!("/boot/files/zz/{id}/0/kernel"),
    ] {
        let (s, _, body) = b.get(Method::GET, &uri).await;
        assert!(
            s == StatusCode::NOT_FOUND || s == StatusCode::BAD_REQUEST,
            "{uri}: {s}"
        );
        let body = String::from_utf8_lossy(&body);
        assert!(
            !body.contains("farm_key") && !body.contains(&admin),
            "{uri}"
        );
    }
    for m in [Method::POST, Method::PUT, Method::DELETE] {
        let (s, _, _) = b.get(m.clone(), "/boot/ipxe").await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{m}");
    }
    // Nothing was created or read for those.
    assert_eq!(b.state.counters().fills.load(Ordering::Relaxed), 0);
    assert!(
        b.t.farm
            .device_by_mac("52:54:00:00:00:99")
            .await
            .unwrap()
            .is_none()
    );
}

/// Issue 30: a version's files go only to a MAC whose boot decision names that version. A
/// maintenance version goes to the maintenance device, not to a production device, an
/// unknown MAC, or the URL without a MAC that served any version to anyone before.
async fn a_maintenance_version_s_files_go_to_the_maintenance_device_only(t: TestFarm) {
    if !have_mkfs() {
        return;
    }
    let b = setup(t).await;
    let id = b.vdisk;
    let v = b.t.farm.new_version(id, ADMIN).await.unwrap();
    assert_eq!(v.access, farm::model::AccessMode::Maintenance);
    let n = v.number;
    let maint = "52:54:00:00:00:0d";
    b.device(maint, farm::model::DeviceType::Maintenance).await;
    let production = b.text("/boot/ipxe/52-54-00-12-34-56").await;
    assert!(
        production.contains(&format!("{FILES}/{id}/0/kernel")),
        "{production}"
    );
    for uri in [
        format!("{FILES}/{id}/{n}/kernel"),
        format!("{FILES}/{id}/{n}/initrd"),
        format!("/boot/files/{id}/{n}/kernel"),
        format!("/boot/files/{id}/{n}/initrd"),
        format!("/boot/files/52-54-00-00-00-99/{id}/{n}/kernel"),
        format!("/boot/files/52-54-00-00-00-0d/{id}/0/kernel"),
    ] {
        let (s, _, body) = b.get(Method::GET, &uri).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{uri}");
        assert!(body.len() < 1024, "{uri}");
    }
    assert_eq!(b.state.counters().fills.load(Ordering::Relaxed), 0);
    let script = b.text("/boot/ipxe/52-54-00-00-00-0d").await;
    let url = format!("/boot/files/52-54-00-00-00-0d/{id}/{n}/kernel");
    assert!(script.contains(&format!("kernel {url} ")), "{script}");
    let (s, _, kernel) = b.get(Method::GET, &url).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(kernel, fake("kernel", 3 << 20));
}

/// Issue 30: links in the image that lead out of `/boot` (`/vmlinuz` to `/etc/shadow`, a
/// `vmlinuz-9.9.9` that sorts first) are not served: the kernel in `/boot` is; an override
/// under `/boot` that is such a link is refused when read, not served.
async fn links_out_of_boot_are_never_served(t: TestFarm) {
    if !have_mkfs() {
        return;
    }
    let b = setup_image(t, true).await;
    let id = b.vdisk;
    b.text("/boot/ipxe/52-54-00-12-34-56").await;
    let (s, _, kernel) = b.get(Method::GET, &format!("{FILES}/{id}/0/kernel")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(kernel, fake("kernel", 3 << 20));
    let (_, _, initrd) = b.get(Method::GET, &format!("{FILES}/{id}/0/initrd")).await;
    assert_eq!(initrd, fake("initrd", 5 << 20));
    let p = farm::input::VDiskPatch {
        boot_kernel: Some(Some("/boot/vmlinuz-9.9.9-evil".into())),
        ..Default::default()
    };
    b.t.farm.update_vdisk(id, &p, ADMIN).await.unwrap();
    let (s, _, body) = b.get(Method::GET, &format!("{FILES}/{id}/0/kernel")).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(String::from_utf8_lossy(&body).contains("leads out of /boot"));
    assert!(!body.windows(SHADOW.len()).any(|w| w == SHADOW));
}

dual_tests!(
    nothing_the_boot_port_serves_logs_in_as_another_device,
    a_device_gets_its_script_and_its_version_s_kernel_and_initrd,
    refusals_are_scripts_that_say_why_and_power_off,
    an_outsider_gets_nothing_but_boot_files,
    a_maintenance_version_s_files_go_to_the_maintenance_device_only,
    links_out_of_boot_are_never_served,
);
