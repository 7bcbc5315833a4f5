//! A simulated farm for the member runtime's tests: the real `farm::Farm` on SQLite in a
//! temporary directory, on a [`SimClock`]; servers that are [`member::Runtime`]s ticked by the
//! test, each with its own farm handle (its own session table, as a process has); and
//! devices that log in, stream from a server ([`SimServed`] holds their sessions), fail over
//! when a server closes their connections, report where they stream and refresh their
//! server lists, as `ferry target` does. Randomness comes from one printed seed
//! (`SIM_SEED=n` replays).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farm::balance::SessionServer;
use farm::input::{NewCollection, NewDevice, NewServer, NewSite, NewStore, NewVDisk, ServerPatch};
use farm::login::{ChallengeRequest, LoginGrant, LoginRequest, proof};
use farm::model::{CacheMode, DeviceType};
use farm::{Farm, FarmConfig, InitSecrets, SimClock};
use member::{Runtime, Served, Ticked, Timing};
use rand::Rng as _;
use testkit::SimRng;

pub const ADMIN: &str = "admin";
/// Where the farm's files go when the system has it (a RAM file system).
const SHM: &str = "/dev/shm";
/// Where simulated time starts (Unix ms): any fixed point, so that runs replay.
pub const T0_MS: i64 = 1_700_000_000_000;
/// How often a simulated device refreshes its server list (`ferry target`: every
/// `agent::report::SERVERS_REFRESH_REPORTS` reports of `agent::report::REPORT_EVERY`).
pub const LIST_REFRESH: Duration = Duration::from_secs(10);

/// The sessions a simulated server serves, and what the runtime did to them.
#[derive(Debug, Default)]
pub struct SimServed {
    /// Open session export names, with the connections of each.
    open: Mutex<BTreeMap<String, usize>>,
    /// Every move, in order.
    pub moves: Mutex<Vec<String>>,
    /// Every revoke, in order.
    pub revokes: Mutex<Vec<String>>,
    /// Every prefetch asked, in order.
    pub prefetches: Mutex<Vec<(String, u32)>>,
}

impl SimServed {
    pub fn connect(&self, export: &str) {
        *self
            .open
            .lock()
            .unwrap()
            .entry(export.to_string())
            .or_default() += 1;
    }

    pub fn is_open(&self, export: &str) -> bool {
        self.open.lock().unwrap().contains_key(export)
    }

    /// Closes a session's connections as a vanished machine's close (nothing recorded).
    pub fn drop_connections(&self, export: &str) {
        self.open.lock().unwrap().remove(export);
    }

    pub fn open_count(&self) -> usize {
        self.open.lock().unwrap().len()
    }
}

impl Served for SimServed {
    fn open_session_names(&self) -> Vec<String> {
        self.open.lock().unwrap().keys().cloned().collect()
    }

    fn move_session(&self, name: &str) -> usize {
        self.moves.lock().unwrap().push(name.to_string());
        self.open.lock().unwrap().remove(name).unwrap_or(0)
    }

    fn revoke_session(&self, name: &str) -> usize {
        self.revokes.lock().unwrap().push(name.to_string());
        self.open.lock().unwrap().remove(name).unwrap_or(0)
    }

    fn prefetch_boot_set(&self, vdisk: &str, version: u32) -> Result<bool, String> {
        self.prefetches
            .lock()
            .unwrap()
            .push((vdisk.to_string(), version));
        Ok(true)
    }
}

/// One `ferry server --farm`: its registration, its own farm handle and its runtime.
pub struct Node {
    pub id: i64,
    pub name: String,
    pub farm: Arc<Farm>,
    pub served: Arc<SimServed>,
    pub rt: Runtime,
    /// False once the test stopped it (it no longer ticks: no heartbeat, no checks).
    pub up: bool,
}

/// One diskless device, logged in once.
#[derive(Debug, Clone)]
pub struct Device {
    pub mac: String,
    pub id: i64,
    pub session_id: String,
    pub export: String,
    /// Its server list, names in the order it was last told.
    pub list: Vec<String>,
    /// The server it streams from.
    pub on: String,
    /// When it next refreshes its list (Unix ms).
    pub refresh_at_ms: i64,
}

/// A farm in simulated time.
pub struct Sim {
    pub dir: tempfile::TempDir,
    pub clock: SimClock,
    pub farm: Arc<Farm>,
    pub secrets: InitSecrets,
    pub site: i64,
    pub store: i64,
    pub vdisk: i64,
    pub collection: i64,
    pub rng: SimRng,
    pub timing: Timing,
    devices_made: u32,
}

impl Sim {
    /// A farm with a site, a store, vDisk `golden` (version 0 in production) and collection
    /// `lab`; randomness from `seed`.
    pub async fn new(seed: u64, timing: Timing) -> Sim {
        // SQLite's syncs cost nothing in RAM: the simulation's time is not the disk's.
        let dir = if std::path::Path::new(SHM).is_dir() {
            tempfile::tempdir_in(SHM).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let clock = SimClock::new(T0_MS);
        let farm = Arc::new(open(dir.path(), &clock).await);
        let secrets = farm.init("sim").await.unwrap();
        let site = NewSite {
            name: "hq".into(),
            description: String::new(),
        };
        let site = farm.create_site(&site, ADMIN).await.unwrap().id;
        let store = NewStore {
            name: "main".into(),
            path: "main".into(),
            bucket: String::new(),
        };
        let store = farm.create_store(&store, ADMIN).await.unwrap().id;
        let vdisk = NewVDisk {
            store_id: store,
            name: "golden".into(),
            size_bytes: Some(16 << 20),
            cache_mode: Some(CacheMode::Ram),
            ram_bytes: None,
            description: String::new(),
        };
        let vdisk = farm.create_vdisk(&vdisk, ADMIN).await.unwrap().id;
        let c = NewCollection {
            site_id: site,
            name: "lab".into(),
            auto_add: false,
            default_vdisk_id: None,
            auto_add_max: None,
            auto_add_per_minute: None,
        };
        let collection = farm.create_collection(&c, ADMIN).await.unwrap().id;
        Sim {
            dir,
            clock,
            farm,
            secrets,
            site,
            store,
            vdisk,
            collection,
            rng: testkit::sim_rng(seed),
            timing,
            devices_made: 0,
        }
    }

    pub fn now(&self) -> i64 {
        farm::Clock::now_ms(&self.clock)
    }

    /// Another handle on the farm's database, as another process has.
    pub async fn handle(&self) -> Arc<Farm> {
        Arc::new(open(self.dir.path(), &self.clock).await)
    }

    /// A server that registers now, with its runtime (its RNG seeded from the sim's).
    pub async fn server(&mut self, name: &str) -> Node {
        let farm = self.handle().await;
        let s = NewServer {
            site_id: self.site,
            name: name.into(),
            address: format!("{name}.example:10809"),
            uid: None,
            api_url: None,
        };
        let id = farm.register_server(&s, ADMIN).await.unwrap().id;
        let served = Arc::new(SimServed::default());
        let dynamic: Arc<dyn Served> = served.clone();
        let rt = Runtime::new(
            Arc::clone(&farm),
            id,
            dynamic,
            self.timing,
            self.rng.r#gen(),
            self.now(),
        );
        Node {
            id,
            name: name.into(),
            farm,
            served,
            rt,
            up: true,
        }
    }

    /// A new diskless production device (not logged in): its MAC and id.
    pub async fn add_device(&mut self) -> (String, i64) {
        self.devices_made += 1;
        let n = self.devices_made;
        let mac = format!("52:54:00:00:{:02x}:{:02x}", n >> 8, n & 0xff);
        let d = NewDevice {
            collection_id: self.collection,
            mac: mac.clone(),
            name: format!("pc-{n}"),
            device_type: Some(DeviceType::Production),
            vdisk_id: Some(self.vdisk),
            cache_mode: None,
            ram_bytes: None,
            pinned_version: None,
            diskless: true,
        };
        let id = self.farm.create_device(&d, ADMIN).await.unwrap().id;
        (mac, id)
    }

    /// A new diskless production device, logged in through `via` (`None`: the admin's
    /// handle), streaming from the first server its login names, which it reports.
    pub async fn device(&mut self, nodes: &[Node], via: Option<&Node>) -> Device {
        let (mac, id) = self.add_device().await;
        let g = self.login(&mac, via).await;
        let list: Vec<String> = g.servers.iter().map(|s| s.name.clone()).collect();
        let on = list[0].clone();
        node(nodes, &on).served.connect(&g.export_name);
        let phase = self.rng.gen_range(0..ms(LIST_REFRESH));
        Device {
            mac,
            id,
            session_id: g.session_id,
            export: g.export_name,
            list,
            on,
            refresh_at_ms: self.now() + phase,
        }
    }

    /// Logs `mac` in through `via`'s handle (its server id) or the admin's.
    pub async fn login(&self, mac: &str, via: Option<&Node>) -> LoginGrant {
        let (farm, server) = match via {
            Some(n) => (&n.farm, Some(n.id)),
            None => (&self.farm, None),
        };
        let c = farm
            .challenge(&ChallengeRequest { mac: mac.into() }, None)
            .await
            .unwrap();
        // The device's own key, as an administrator's reset gives it.
        let d = self
            .farm
            .device_by_mac(mac)
            .await
            .unwrap()
            .expect("a device");
        let key = self
            .farm
            .reset_device_credential(d.id, ADMIN)
            .await
            .unwrap()
            .device_secret;
        let hmac = proof(&key, &c.nonce, mac).unwrap();
        let r = LoginRequest {
            mac: mac.into(),
            nonce: c.nonce,
            hmac,
            diskless: true,
            ticket: None,
        };
        farm.login(&r, server).await.unwrap()
    }

    /// Sets server `id` draining or not.
    pub async fn set_draining(&self, id: i64, draining: bool) {
        let p = ServerPatch {
            rating: None,
            draining: Some(draining),
        };
        self.farm.set_server(id, &p, ADMIN).await.unwrap();
    }

    /// Moves time `by` and ticks every server that is up; returns each one's tick, in
    /// `nodes`' order (`None` for a server that is down).
    pub async fn step(&self, nodes: &mut [Node], by: Duration) -> Vec<Option<Ticked>> {
        let now = self.clock.advance(by);
        let mut out = Vec::new();
        for n in nodes.iter_mut() {
            out.push(if n.up {
                Some(n.rt.tick(now).await)
            } else {
                None
            });
        }
        out
    }

    /// What the devices do between two steps: a device whose server closed its connection
    /// fails over to the first other live server of its list (or comes back when it has
    /// none) and reports it; a device whose refresh is due asks the farm for its list.
    /// Returns the devices that moved, as (index, from, to).
    pub async fn devices(
        &self,
        nodes: &[Node],
        devices: &mut [Device],
    ) -> Vec<(usize, String, String)> {
        let now = self.now();
        let mut moved = Vec::new();
        for (i, d) in devices.iter_mut().enumerate() {
            if now >= d.refresh_at_ms {
                d.refresh_at_ms = now + ms(LIST_REFRESH);
                let list = self.farm.session_servers(&d.session_id).await.unwrap();
                d.list = list
                    .into_iter()
                    .filter(|s| s.alive)
                    .map(|s| s.name)
                    .collect();
            }
            if node(nodes, &d.on).served.is_open(&d.export) {
                continue;
            }
            let to = d
                .list
                .iter()
                .find(|s| **s != d.on && node(nodes, s).up)
                .unwrap_or(&d.on)
                .clone();
            node(nodes, &to).served.connect(&d.export);
            if to != d.on {
                let id = node(nodes, &to).id;
                self.farm
                    .note_session_server(&d.session_id, SessionServer::Id(id))
                    .await
                    .unwrap();
                moved.push((i, d.on.clone(), to.clone()));
                d.on = to;
            }
        }
        moved
    }
}

/// The node named `name`.
pub fn node<'a>(nodes: &'a [Node], name: &str) -> &'a Node {
    nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no server {name}"))
}

/// How many of `devices` stream from `name`.
pub fn on(devices: &[Device], name: &str) -> usize {
    devices.iter().filter(|d| d.on == name).count()
}

pub fn ms(d: Duration) -> i64 {
    member::ms(d)
}

async fn open(dir: &std::path::Path, clock: &SimClock) -> Farm {
    let config = FarmConfig {
        data_dir: dir.join("data"),
        db_url: None,
        store_root: None,
    };
    Farm::open_with_clock(&config, Arc::new(clock.clone()))
        .await
        .unwrap()
}
