//! Live device status for the console: one read-only snapshot of every device (connected or
//! not, the version it boots, its effective cache mode, and the counters last reported for
//! its session) plus the servers, and the route a device or its server reports counters on.
//!
//! ```text
//!   target / server ── POST /api/v1/status/report {export_name, counters} ──► StatusBoard
//!   console (every 2 s) ── GET /api/v1/status ──► devices ⋈ sessions ⋈ versions ⋈ board
//! ```
//!
//! The board is in-process memory, shared through the database: each process writes a
//! session's newest counters there at most every [`farm::counters::SHARE_EVERY_MS`] (at once
//! when its server changed), and a snapshot shows, per session, the newer of its own board's
//! entry and the shared one, so the status through any API of the farm shows every device
//! (issue 31). Counters are cumulative for one session. A report names its session by
//! its export name, the unguessable session-scoped secret that login gave the device; it
//! needs no API token, like the login routes. Counters of an ended or replaced session are
//! not shown, because an entry is shown only while its session id is the device's live one.
//! The board holds at most [`BOARD_DEVICES_MAX`] devices.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use contract::ExportName;
use farm::model::{AccessMode, CacheMode, Device, DeviceType, Server, Session, VDisk};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::error::{ApiError, ApiResult, Errors};
use crate::extract::{ApiJson, ApiQuery, Reader};
use crate::routes::PageQuery;

/// The most devices whose counters the board keeps (as many as live sessions may exist).
pub const BOARD_DEVICES_MAX: usize = farm::sessions::SESSIONS_MAX;
/// Counters not reported for this long make room when the board is full.
pub const BOARD_STALE_MS: i64 = 10 * 60 * 1000;
/// The most live sessions one snapshot reads (pages of [`SESSION_PAGE`]).
pub const STATUS_SESSIONS_MAX: usize = farm::sessions::SESSIONS_MAX;
/// The page size used to read sessions and vDisks for a snapshot.
const SESSION_PAGE: i64 = 1000;
/// The longest server address a report may name, in bytes (a DNS name is at most 253, plus
/// `:port`).
pub const SERVER_ADDRESS_BYTES_MAX: usize = 260;

/// Counters of one device's session, cumulative since the session began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
pub struct Counters {
    /// Bytes the device read from its vDisk.
    pub bytes_read: u64,
    /// Bytes the device wrote (into its write cache, or the vDisk in private mode).
    pub bytes_written: u64,
    /// Requests retried (timeouts, lost datagrams, reconnects).
    pub retries: u64,
    /// Bytes its write cache holds now.
    pub cache_used_bytes: u64,
    /// Bytes of its reads answered by its host's shared read cache (or its prefetch)
    /// instead of the server.
    #[serde(default)]
    pub host_cache_hit_bytes: u64,
    /// Bytes it read from the server below that cache.
    #[serde(default)]
    pub host_cache_server_bytes: u64,
}

/// The answer to a report that asked for its servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReportAnswer {
    /// The servers of the device's site in the order a login would name them now.
    pub servers: Vec<contract::login::LoginServer>,
}

/// A counter report of a session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// The session's export name, as login gave it (the report's credential).
    pub export_name: String,
    /// The server the device streams from, when known.
    #[serde(default)]
    pub server_id: Option<i64>,
    /// The NBD address (`host:port`) the device streams from, as it reached it: what a
    /// target knows (login gives it the servers' addresses, not their ids). The status
    /// names the registered server of that address. At most
    /// [`SERVER_ADDRESS_BYTES_MAX`] bytes.
    #[serde(default)]
    pub server_address: Option<String>,
    /// Bytes the device read from its vDisk.
    pub bytes_read: u64,
    /// Bytes the device wrote.
    pub bytes_written: u64,
    /// Requests retried.
    pub retries: u64,
    /// Bytes its write cache holds now.
    pub cache_used_bytes: u64,
    /// Bytes of its reads answered by its host's shared read cache (or its prefetch).
    #[serde(default)]
    pub host_cache_hit_bytes: u64,
    /// Bytes it read from the server below that cache.
    #[serde(default)]
    pub host_cache_server_bytes: u64,
    /// True when the device wants its site's servers in the answer, in login order: how it
    /// learns servers that joined or returned since its login (the agent asks every fifth
    /// report, `agent::report::SERVERS_REFRESH_REPORTS`).
    #[serde(default)]
    pub servers_wanted: bool,
}

/// The counters last reported for a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Reported {
    /// The session they belong to.
    pub session_id: String,
    /// The server the device streams from: as reported, or the registered server whose
    /// address was reported.
    pub server_id: Option<i64>,
    /// That server's name.
    pub server_name: Option<String>,
    /// The NBD address the device reported streaming from (shown when no registered server
    /// has it).
    pub server_address: Option<String>,
    /// When they were reported (Unix ms).
    pub reported_at_ms: i64,
    /// The counters.
    #[serde(flatten)]
    pub counters: Counters,
}

/// The live session of a device as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionStatus {
    /// The session's id.
    pub id: String,
    /// The version the device boots.
    pub version: i64,
    /// That version's access mode now (`None` when the version is gone).
    pub access: Option<AccessMode>,
    /// When the device logged in.
    pub since_ms: i64,
    /// When the session ends unless renewed.
    pub expires_at_ms: i64,
}

/// One device's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeviceStatus {
    /// Id.
    pub id: i64,
    /// Name.
    pub name: String,
    /// MAC address.
    pub mac: String,
    /// Its collection.
    pub collection_id: i64,
    /// Its type.
    pub device_type: DeviceType,
    /// The vDisk assigned.
    pub vdisk_id: Option<i64>,
    /// That vDisk's name.
    pub vdisk_name: Option<String>,
    /// The cache mode it gets at login (override, vDisk default, private in maintenance).
    pub cache_mode: Option<CacheMode>,
    /// The RAM cache size it gets at login.
    pub ram_bytes: Option<i64>,
    /// Its live session: `None` when the device is not connected.
    pub session: Option<SessionStatus>,
    /// The counters of that session, when reported.
    pub counters: Option<Reported>,
}

/// A server's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServerStatus {
    /// Id.
    pub id: i64,
    /// Its site.
    pub site_id: i64,
    /// Name.
    pub name: String,
    /// NBD address.
    pub address: String,
    /// True when it heartbeat within [`farm::model::SERVER_ALIVE_MS`].
    pub alive: bool,
    /// Its last heartbeat.
    pub heartbeat_at_ms: i64,
}

/// The farm's live status: a page of devices and every server.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StatusSnapshot {
    /// When it was taken (the farm's clock, Unix ms).
    pub now_ms: i64,
    /// The servers.
    pub servers: Vec<ServerStatus>,
    /// The devices of this page.
    pub devices: Vec<DeviceStatus>,
    /// How many devices the farm holds.
    pub total: i64,
    /// Live sessions in the whole farm.
    pub connected: i64,
}

#[derive(Debug, Clone)]
struct Entry {
    session_id: String,
    server_id: Option<i64>,
    server_address: Option<String>,
    reported_at_ms: i64,
    counters: Counters,
    /// When this process last wrote them to the database (0: not yet).
    shared_at_ms: i64,
}

impl Entry {
    fn shared(&self) -> farm::counters::SharedCounters {
        let n = farm::counters::stored;
        farm::counters::SharedCounters {
            session_id: self.session_id.clone(),
            server_id: self.server_id,
            server_address: self.server_address.clone(),
            reported_at_ms: self.reported_at_ms,
            bytes_read: n(self.counters.bytes_read),
            bytes_written: n(self.counters.bytes_written),
            retries: n(self.counters.retries),
            cache_used_bytes: n(self.counters.cache_used_bytes),
            host_cache_hit_bytes: n(self.counters.host_cache_hit_bytes),
            host_cache_server_bytes: n(self.counters.host_cache_server_bytes),
        }
    }

    fn from_shared(c: &farm::counters::SharedCounters) -> Entry {
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Entry {
            session_id: c.session_id.clone(),
            server_id: c.server_id,
            server_address: c.server_address.clone(),
            reported_at_ms: c.reported_at_ms,
            counters: Counters {
                bytes_read: n(c.bytes_read),
                bytes_written: n(c.bytes_written),
                retries: n(c.retries),
                cache_used_bytes: n(c.cache_used_bytes),
                host_cache_hit_bytes: n(c.host_cache_hit_bytes),
                host_cache_server_bytes: n(c.host_cache_server_bytes),
            },
            shared_at_ms: c.reported_at_ms,
        }
    }
}

/// The counters reported per device (see the module documentation).
#[derive(Debug, Default)]
pub struct StatusBoard {
    entries: Mutex<HashMap<i64, Entry>>,
}

impl StatusBoard {
    /// An empty board.
    pub fn new() -> StatusBoard {
        StatusBoard::default()
    }

    /// Records the counters of `entry.session_id` for `device_id`, replacing what was there.
    /// When the board is full, entries not reported for [`BOARD_STALE_MS`] make room.
    ///
    /// # Errors
    /// `429` when [`BOARD_DEVICES_MAX`] devices are held and none of them is stale.
    fn record(&self, device_id: i64, entry: Entry) -> ApiResult<()> {
        let mut g = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if !g.contains_key(&device_id) && g.len() >= BOARD_DEVICES_MAX {
            let oldest = entry.reported_at_ms.saturating_sub(BOARD_STALE_MS);
            g.retain(|_, e| e.reported_at_ms > oldest);
            if g.len() >= BOARD_DEVICES_MAX {
                return Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("counters of more than {BOARD_DEVICES_MAX} devices"),
                ));
            }
        }
        g.insert(device_id, entry);
        Ok(())
    }

    fn get(&self, device_id: i64, session_id: &str) -> Option<Entry> {
        let g = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        g.get(&device_id)
            .filter(|e| e.session_id == session_id)
            .cloned()
    }

    /// Devices held.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// True when no device is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The status routes (relative to `/api/v1`) with a board of their own.
pub fn routes() -> Router<AppState> {
    routes_with(Arc::new(StatusBoard::new()))
}

/// The status routes over `board` (a server that records counters itself shares it).
pub fn routes_with(board: Arc<StatusBoard>) -> Router<AppState> {
    Router::new()
        .route("/status", get(status))
        .route("/status/report", post(report))
        .layer(Extension(board))
}

/// The live status of the farm: a page of devices (with session and counters) and servers.
#[utoipa::path(get, path = "/api/v1/status", tag = "status", params(PageQuery),
    responses((status = 200, body = StatusSnapshot), Errors))]
pub async fn status(
    _: Reader,
    State(s): State<AppState>,
    Extension(board): Extension<Arc<StatusBoard>>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<StatusSnapshot>> {
    let farm = &s.farm;
    let devices = farm.list_devices(None, q.limit, q.offset).await?;
    let sessions = live_sessions(farm).await?;
    let connected = i64::try_from(sessions.len()).unwrap_or(i64::MAX);
    let vdisks = all_vdisks(farm).await?;
    let servers = farm.list_servers(Some(SESSION_PAGE), Some(0)).await?.items;
    let now = farm.now_ms();
    let by_device: HashMap<i64, &Session> = sessions.iter().map(|x| (x.device_id, x)).collect();
    let mut access: HashMap<(i64, i64), AccessMode> = HashMap::new();
    for d in &devices.items {
        if let Some(x) = by_device.get(&d.id)
            && !access.contains_key(&(x.vdisk_id, x.version_number))
        {
            for v in farm.versions(x.vdisk_id).await? {
                access.insert((v.vdisk_id, v.number), v.access);
            }
        }
    }
    let shared: HashMap<String, farm::counters::SharedCounters> = farm
        .shared_counters()
        .await?
        .into_iter()
        .map(|c| (c.session_id.clone(), c))
        .collect();
    let ctx = Ctx {
        vdisks: &vdisks,
        servers: &servers,
        access: &access,
        board: &board,
        shared: &shared,
    };
    let items = devices
        .items
        .iter()
        .map(|d| ctx.device(d, by_device.get(&d.id).copied()))
        .collect();
    Ok(Json(StatusSnapshot {
        now_ms: now,
        servers: servers.iter().map(|x| server_status(x, now)).collect(),
        devices: items,
        total: devices.total,
        connected,
    }))
}

/// Reports the counters of a session: the body names it by its export name.
#[utoipa::path(post, path = "/api/v1/status/report", tag = "status", request_body = Report,
    security(()), responses((status = 204, description = "recorded"),
        (status = 200, description = "recorded; the servers asked for", body = ReportAnswer),
        Errors))]
pub async fn report(
    State(s): State<AppState>,
    Extension(board): Extension<Arc<StatusBoard>>,
    ApiJson(r): ApiJson<Report>,
) -> ApiResult<Response> {
    let unknown = || ApiError::new(StatusCode::UNAUTHORIZED, "no live session of that name");
    if !is_export_name(&r.export_name) {
        return Err(unknown());
    }
    let session = s
        .farm
        .session_by_export(&r.export_name)
        .await?
        .ok_or_else(unknown)?;
    if let Some(id) = r.server_id {
        match s.farm.server(id).await {
            Ok(_) => {}
            Err(e) if e.kind() == farm::Kind::NotFound => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("no server {id}"),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let server_address = r
        .server_address
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty());
    if server_address
        .as_ref()
        .is_some_and(|a| a.len() > SERVER_ADDRESS_BYTES_MAX)
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("server_address is longer than {SERVER_ADDRESS_BYTES_MAX} bytes"),
        ));
    }
    let now = s.farm.now_ms();
    let mut entry = Entry {
        session_id: session.id.clone(),
        server_id: r.server_id,
        server_address,
        reported_at_ms: now,
        shared_at_ms: 0,
        counters: Counters {
            bytes_read: r.bytes_read,
            bytes_written: r.bytes_written,
            retries: r.retries,
            cache_used_bytes: r.cache_used_bytes,
            host_cache_hit_bytes: r.host_cache_hit_bytes,
            host_cache_server_bytes: r.host_cache_server_bytes,
        },
    };
    let server = match (entry.server_id, entry.server_address.as_deref()) {
        (Some(id), _) => Some(farm::balance::SessionServer::Id(id)),
        (None, Some(a)) => Some(farm::balance::SessionServer::Address(a)),
        (None, None) => None,
    };
    // Load balancing counts the device on the server it streams from now; the database is
    // written only when that changed since this session's last report to this process.
    let previous = board.get(session.device_id, &session.id);
    let unchanged = previous.as_ref().is_some_and(|p| {
        (p.server_id, &p.server_address) == (entry.server_id, &entry.server_address)
    });
    if let (Some(server), false) = (server, unchanged) {
        s.farm.note_session_server(&session.id, server).await?;
    }
    // Shared with the farm's other APIs at most every SHARE_EVERY_MS, and at once when
    // the device's server changed (a failover shows everywhere).
    entry.shared_at_ms = previous.map_or(0, |p| p.shared_at_ms);
    if !unchanged || now.saturating_sub(entry.shared_at_ms) >= farm::counters::SHARE_EVERY_MS {
        s.farm.share_counters(&entry.shared()).await?;
        entry.shared_at_ms = now;
    }
    board.record(session.device_id, entry)?;
    if r.servers_wanted {
        let servers = s.farm.session_servers(&session.id).await?;
        return Ok(Json(ReportAnswer { servers }).into_response());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// True for text shaped like a session export name (`ferry-s-` and 1 to 56 hex digits, as
/// `contract::ExportName` parses it), so that nothing else (NUL bytes included, which
/// PostgreSQL refuses) reaches the database.
fn is_export_name(name: &str) -> bool {
    matches!(name.parse(), Ok(ExportName::Session(_)))
}

struct Ctx<'a> {
    vdisks: &'a HashMap<i64, VDisk>,
    servers: &'a [Server],
    access: &'a HashMap<(i64, i64), AccessMode>,
    board: &'a StatusBoard,
    /// The counters the farm's API processes shared, by session id.
    shared: &'a HashMap<String, farm::counters::SharedCounters>,
}

impl Ctx<'_> {
    fn device(&self, d: &Device, session: Option<&Session>) -> DeviceStatus {
        let vdisk = d.vdisk_id.and_then(|id| self.vdisks.get(&id));
        // This process's newest, or the shared ones when another API had newer.
        let counters = session.and_then(|x| {
            let local = self.board.get(d.id, &x.id);
            let shared = self.shared.get(&x.id).map(Entry::from_shared);
            match (local, shared) {
                (Some(l), Some(s)) if s.reported_at_ms > l.reported_at_ms => Some(s),
                (Some(l), _) => Some(l),
                (None, s) => s,
            }
        });
        let counters = counters.map(|e| {
            let server = reported_server(self.servers, e.server_id, e.server_address.as_deref());
            Reported {
                session_id: e.session_id,
                server_id: e.server_id.or(server.map(|s| s.id)),
                server_name: server.map(|s| s.name.clone()),
                server_address: e.server_address,
                reported_at_ms: e.reported_at_ms,
                counters: e.counters,
            }
        });
        DeviceStatus {
            id: d.id,
            name: d.name.clone(),
            mac: d.mac.clone(),
            collection_id: d.collection_id,
            device_type: d.device_type,
            vdisk_id: d.vdisk_id,
            vdisk_name: vdisk.map(|v| v.name.clone()),
            cache_mode: vdisk.map(|v| {
                farm::login::effective_cache_mode(d.device_type, d.cache_mode, v.cache_mode)
            }),
            ram_bytes: vdisk.map(|v| d.ram_bytes.unwrap_or(v.ram_bytes)),
            session: session.map(|x| SessionStatus {
                id: x.id.clone(),
                version: x.version_number,
                access: self.access.get(&(x.vdisk_id, x.version_number)).copied(),
                since_ms: x.created_at_ms,
                expires_at_ms: x.expires_at_ms,
            }),
            counters,
        }
    }
}

/// The registered server a report names: by id when it gave one, else the one registered at
/// the address the device streams from (the address as login handed it out).
fn reported_server<'a>(
    servers: &'a [Server],
    id: Option<i64>,
    address: Option<&str>,
) -> Option<&'a Server> {
    match (id, address) {
        (Some(id), _) => servers.iter().find(|s| s.id == id),
        (None, Some(a)) => servers.iter().find(|s| s.address.trim() == a),
        (None, None) => None,
    }
}

fn server_status(s: &Server, now_ms: i64) -> ServerStatus {
    ServerStatus {
        id: s.id,
        site_id: s.site_id,
        name: s.name.clone(),
        address: s.address.clone(),
        alive: now_ms.saturating_sub(s.heartbeat_at_ms) <= farm::model::SERVER_ALIVE_MS,
        heartbeat_at_ms: s.heartbeat_at_ms,
    }
}

// TODO(issue 5): a farm query of the sessions of one page of devices would spare reading
// every live session on each poll; with 100 000 sessions one snapshot reads 100 pages.
async fn live_sessions(farm: &farm::Farm) -> ApiResult<Vec<Session>> {
    let mut out = Vec::new();
    loop {
        let offset = i64::try_from(out.len()).unwrap_or(i64::MAX);
        let page = farm.list_sessions(Some(SESSION_PAGE), Some(offset)).await?;
        let done = page.items.is_empty();
        out.extend(page.items);
        let held = i64::try_from(out.len()).unwrap_or(i64::MAX);
        if done || out.len() >= STATUS_SESSIONS_MAX || held >= page.total {
            return Ok(out);
        }
    }
}

async fn all_vdisks(farm: &farm::Farm) -> ApiResult<HashMap<i64, VDisk>> {
    let mut out = HashMap::new();
    loop {
        let offset = i64::try_from(out.len()).unwrap_or(i64::MAX);
        let page = farm.list_vdisks(Some(SESSION_PAGE), Some(offset)).await?;
        let done = page.items.is_empty();
        out.extend(page.items.into_iter().map(|v| (v.id, v)));
        if done || i64::try_from(out.len()).unwrap_or(i64::MAX) >= page.total {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(session: &str, bytes_read: u64, reported_at_ms: i64) -> Entry {
        Entry {
            session_id: session.into(),
            server_id: None,
            server_address: None,
            reported_at_ms,
            counters: Counters {
                bytes_read,
                ..Counters::default()
            },
            shared_at_ms: 0,
        }
    }

    fn server(id: i64, name: &str, address: &str) -> Server {
        Server {
            id,
            site_id: 1,
            name: name.into(),
            address: address.into(),
            registered_at_ms: 0,
            heartbeat_at_ms: 0,
            rating: farm::balance::DEFAULT_RATING,
            draining: farm::model::Flag(false),
            api_url: None,
        }
    }

    #[test]
    fn reported_address_names_the_server_registered_there() {
        let servers = [
            server(1, "pvs-1", "10.0.0.5:10809"),
            server(2, "pvs-2", "10.0.0.6:10809"),
        ];
        let found = reported_server(&servers, None, Some("10.0.0.6:10809"));
        assert_eq!(found.map(|s| s.name.as_str()), Some("pvs-2"));
    }

    #[test]
    fn reported_id_wins_over_the_address() {
        let servers = [
            server(1, "pvs-1", "10.0.0.5:10809"),
            server(2, "pvs-2", "10.0.0.6:10809"),
        ];
        let found = reported_server(&servers, Some(1), Some("10.0.0.6:10809"));
        assert_eq!(found.map(|s| s.id), Some(1));
    }

    #[test]
    fn unregistered_address_names_no_server() {
        let servers = [server(1, "pvs-1", "10.0.0.5:10809")];
        assert!(reported_server(&servers, None, Some("10.9.9.9:10809")).is_none());
    }

    #[test]
    fn counters_of_a_replaced_session_are_not_shown() {
        let b = StatusBoard::new();
        b.record(1, entry("old", 5, 0)).unwrap();
        assert!(b.get(1, "new").is_none());
        assert_eq!(b.get(1, "old").unwrap().counters.bytes_read, 5);
    }

    #[test]
    fn second_report_replaces_the_first() {
        let b = StatusBoard::new();
        b.record(1, entry("s", 5, 0)).unwrap();
        b.record(1, entry("s", 9, 1)).unwrap();
        assert_eq!(b.get(1, "s").unwrap().counters.bytes_read, 9);
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn export_name_shape_is_checked_before_the_database() {
        assert!(is_export_name("ferry-s-0123456789abcdef0123456789abcdef"));
        assert!(!is_export_name("ferry-s-"));
        assert!(!is_export_name("ferry-s-00\u{0}"));
        assert!(!is_export_name("golden"));
        assert!(!is_export_name(&format!("ferry-s-{}", "0".repeat(64))));
    }

    #[test]
    fn report_without_an_export_name_is_rejected() {
        let r = serde_json::from_str::<Report>(
            r#"{"bytes_read":1,"bytes_written":0,"retries":0,"cache_used_bytes":0}"#,
        );
        assert!(r.is_err());
    }

    #[test]
    fn negative_counter_is_rejected() {
        let r = serde_json::from_str::<Report>(
            r#"{"export_name":"x","bytes_read":-1,"bytes_written":0,"retries":0,"cache_used_bytes":0}"#,
        );
        assert!(r.is_err());
    }
}
