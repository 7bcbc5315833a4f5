//! Device login, target side: a challenge and a proof of the device's key against the
//! farm's REST API, which answers with what to attach (docs/farm.md, "Device login").
//!
//! ```text
//!   target                                   farm (ferry farm serve / ferry server --farm)
//!   POST /api/v1/login/challenge {mac}  ──►  {nonce, expires_at_ms}
//!   hmac = HMAC-SHA256(key, nonce ‖ mac)
//!   POST /api/v1/login {mac, nonce, hmac} ─► LoginGrant: servers, vDisk, version, cache
//!                                            mode, RAM size, session export, token,
//!                                            device certificate
//!   or, diskless: POST /api/v1/login {mac, ticket} ─► the same, with the device's new
//!                                            secret for this boot's later logins
//! ```
//!
//! `key` is the device secret's bytes: 32 random bytes the farm made for this device alone
//! (an administrator's `ferry device credential`, kept in the target's state file,
//! [`DeviceState`]: [`login_device`] stores the one it is given at its first login), or,
//! in a diskless machine, the key the grant of its boot's ticket login carried (kept in
//! RAM: [`login_ticket`]). `nonce` is the nonce's text as received and `mac` the normalized
//! MAC (`aa:bb:cc:dd:ee:ff`), concatenated as UTF-8; `hmac` goes out as lowercase hex. No
//! key crosses the wire. The bodies, the MAC's normalization and the proof are
//! `contract::login`'s and `contract::Mac`'s, the same code the farm answers with.
//!
//! The API is `https://` with its certificate verified against the farm's CA only (a file
//! given by the caller, `--farm-ca`); plain `http://` is allowed to a loopback address only.
//!
//! This file is longer than 800 lines because its tests (about half of it) drive a fake
//! farm API over real HTTP.
//!
//! The client is blocking (reqwest's blocking client): call [`login`] before starting an
//! async runtime, or from `spawn_blocking`.

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use contract::login::DeviceTls;
use contract::login::{
    CHALLENGE_PATH, Challenge, ChallengeRequest, DeviceRef, LOGIN_PATH, LoginRequest,
};
use contract::{ErrorChain, ExportName, Mac};
use reqwest::StatusCode;
use reqwest::Url;
use serde::Deserialize;

use crate::CacheMode;

/// The NBD port used when the farm lists no server.
pub const DEFAULT_NBD_PORT: u16 = 10809;
/// The API port of `HOST` given without a scheme (`ferry server --api-listen`'s default).
pub const DEFAULT_API_PORT: u16 = 8080;
/// Timeout of one TCP connect to the API.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of one API request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How many times a challenge answered 429 (too many logins under way from this address:
/// machines behind one NAT or host booting at once) is asked again, and the pause before
/// the first retry (doubled each time, at most [`CHALLENGE_BUSY_PAUSE_MAX`]).
const CHALLENGE_BUSY_RETRIES: u32 = 8;
const CHALLENGE_BUSY_PAUSE: Duration = Duration::from_millis(250);
const CHALLENGE_BUSY_PAUSE_MAX: Duration = Duration::from_secs(4);
/// Most bytes of an API error message kept in a [`LoginError`].
const MESSAGE_BYTES_MAX: usize = 1024;
/// Most bytes of a device secret file read (64 hex digits and a newline).
const SECRET_FILE_BYTES_MAX: u64 = 1024;

/// Why a login failed. Every variant names what failed; the farm's own message (its
/// `{"error": ...}` body) is kept where there is one.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// The API URL is not `http://HOST[:PORT]`.
    #[error("invalid farm API URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The MAC is not six hex pairs.
    #[error("invalid MAC address {0:?} (expected aa:bb:cc:dd:ee:ff)")]
    BadMac(String),
    /// The device secret (or ticket) is not what it must be.
    #[error("invalid device secret: {0}")]
    BadKey(&'static str),
    /// The device has no secret in its state directory and none was given.
    #[error(
        "device {mac} has no device secret in {dir} and none was given: an administrator \
         makes one (ferry device credential MAC)"
    )]
    NoCredential {
        /// The MAC.
        mac: String,
        /// The state directory.
        dir: String,
    },
    /// The state directory or the device secret in it cannot be read or written.
    #[error("device state {path}: {reason}")]
    State {
        /// The file or directory.
        path: String,
        /// What failed.
        reason: String,
    },
    /// The farm's CA certificate cannot be used, or is missing for an `https://` API.
    #[error("farm CA for {url}: {reason}")]
    FarmCa {
        /// The API's URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// No answer from the API (connection refused, timeout, DNS).
    #[error("farm API {url} is unreachable: {reason}")]
    Unreachable {
        /// The URL tried.
        url: String,
        /// The transport error.
        reason: String,
    },
    /// 401: a wrong key: a device secret an administrator has reset, a device with no key
    /// yet, a used or expired ticket, a ticket for a device that is not diskless (or a nonce
    /// that expired on the way).
    #[error(
        "login refused by {url} (device secret reset or never given, or a used or expired \
         ticket?): {message}"
    )]
    BadProof {
        /// The API's URL.
        url: String,
        /// The API's message.
        message: String,
    },
    /// 403: the farm does not know the MAC and no collection adds devices automatically.
    #[error("device {mac} is unknown to the farm at {url}: {message}")]
    UnknownDevice {
        /// The MAC.
        mac: String,
        /// The API's URL.
        url: String,
        /// The API's message.
        message: String,
    },
    /// 409: the device has no vDisk, its type has no version to boot, or another
    /// maintenance device is booted from the vDisk.
    #[error("the farm at {url} cannot boot device {mac}: {message}")]
    Conflict {
        /// The MAC.
        mac: String,
        /// The API's URL.
        url: String,
        /// The API's message.
        message: String,
    },
    /// Any other refusal (400, 404, 429, 5xx).
    #[error("{step} at {url} failed with HTTP {status}: {message}")]
    Refused {
        /// `challenge` or `login`.
        step: &'static str,
        /// The API's URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The API's message (or the body).
        message: String,
    },
    /// The answer is not what the API documents.
    #[error("{step} at {url}: unexpected answer: {reason}")]
    BadAnswer {
        /// `challenge` or `login`.
        step: &'static str,
        /// The API's URL.
        url: String,
        /// What did not parse.
        reason: String,
    },
}

/// What a login grants: what to attach and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginGrant {
    /// NBD endpoints (`host:port`) in failover order (alive servers first).
    pub servers: Vec<String>,
    /// True when the farm listed no server and [`LoginGrant::servers`] is the API's host on
    /// port [`DEFAULT_NBD_PORT`].
    pub servers_defaulted: bool,
    /// The device's MAC.
    pub mac: Mac,
    /// The device's name in the farm.
    pub device_name: String,
    /// The vDisk's name.
    pub vdisk: String,
    /// The vDisk's id in the farm (a vDisk deleted and created again under its name gets
    /// another): part of the host read cache's version key.
    pub vdisk_id: i64,
    /// The version the device boots.
    pub version: i64,
    /// When the farm made that version: a version deleted and made again under its number
    /// has another (part of the host read cache's version key).
    pub version_created_at_ms: i64,
    /// The vDisk's virtual size in bytes.
    pub size_bytes: u64,
    /// Where writes go, as the agent's mode.
    pub cache_mode: CacheMode,
    /// RAM budget of the `ram` and `ram-overflow` caches.
    pub ram_bytes: u64,
    /// The session-scoped export name (`ferry-s-…`) to open on the servers.
    pub export_name: ExportName,
    /// The session id.
    pub session_id: String,
    /// The session token (bearer), for later calls of this session.
    pub session_token: String,
    /// When the session ends (Unix ms).
    pub expires_at_ms: i64,
    /// True in private mode: the export writes to the version itself.
    pub writable: bool,
    /// The device's client certificate, its key and the farm's CA, for the NBD servers
    /// (when the farm has a CA).
    pub tls: Option<DeviceTls>,
    /// The device's new secret, from a ticket login only: later logins of this boot prove
    /// with it.
    pub device_secret: Option<String>,
}

/// Parses a MAC as the farm does (`contract::Mac`): 12 hex digits, optionally separated
/// by five `:` or `-`; its text is lowercase `aa:bb:cc:dd:ee:ff`.
///
/// # Errors
/// [`LoginError::BadMac`].
pub fn parse_mac(value: &str) -> Result<Mac, LoginError> {
    value
        .parse()
        .map_err(|_| LoginError::BadMac(value.to_string()))
}

/// A device secret from its text (`ferry device credential`'s output, a state file): hex,
/// surrounding whitespace ignored.
///
/// # Errors
/// [`LoginError::BadKey`] when it is empty or not hex.
pub fn parse_secret(text: &str) -> Result<Vec<u8>, LoginError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(LoginError::BadKey("it is empty"));
    }
    hex::decode(t).map_err(|_| LoginError::BadKey("it is not hex"))
}

/// Parses the API's base URL: `https://HOST[:PORT]` or `http://HOST[:PORT]` (a path
/// prefix is kept). `HOST[:PORT]` without a scheme means `http://HOST:PORT`, port
/// [`DEFAULT_API_PORT`] by default. (Which of them may be used is [`api_client`]'s call.)
///
/// # Errors
/// [`LoginError::BadUrl`].
pub fn parse_api_url(url: &str) -> Result<Url, LoginError> {
    let bad = |reason: &str| LoginError::BadUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let schemeless = !url.contains("://");
    let text = if schemeless {
        format!("http://{url}")
    } else {
        url.to_string()
    };
    let mut u = Url::parse(&text).map_err(|e| bad(&e.to_string()))?;
    if schemeless && u.port().is_none() {
        u.set_port(Some(DEFAULT_API_PORT))
            .map_err(|()| bad("cannot set the port"))?;
    }
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad(
            "only https:// (or http:// to a loopback address) is supported",
        ));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad("no query or fragment allowed"));
    }
    if !u.path().ends_with('/') {
        let p = format!("{}/", u.path());
        u.set_path(&p);
    }
    Ok(u)
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: String,
}

/// True when `u` names a loopback host (`localhost`, 127.0.0.0/8, ::1).
fn is_loopback(u: &Url) -> bool {
    let host = u.host_str().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A blocking HTTP client builder for the farm API at `base` (from [`parse_api_url`]):
/// for `https://`, trusting only the farm's CA `ca_pem` (no built-in roots); `http://` only
/// to a loopback address.
///
/// # Errors
/// [`LoginError::FarmCa`]: `https://` without a CA, a CA that does not parse, or `http://`
/// to another host.
pub fn api_client(
    base: &Url,
    ca_pem: Option<&str>,
) -> Result<reqwest::blocking::ClientBuilder, LoginError> {
    let shown = base.as_str().trim_end_matches('/').to_string();
    let fail = |reason: &str| LoginError::FarmCa {
        url: shown.clone(),
        reason: reason.to_string(),
    };
    let builder = reqwest::blocking::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .tls_built_in_root_certs(false);
    if base.scheme() == "http" {
        if !is_loopback(base) {
            return Err(fail(
                "plain http:// is allowed to a loopback address only; use https:// and \
                 --farm-ca FILE",
            ));
        }
        return Ok(builder);
    }
    let pem =
        ca_pem.ok_or_else(|| fail("https:// needs the farm's CA certificate (--farm-ca FILE)"))?;
    let ca = reqwest::Certificate::from_pem(pem.as_bytes())
        .map_err(|e| fail(&format!("not a PEM certificate: {}", ErrorChain(&e))))?;
    Ok(builder.add_root_certificate(ca).https_only(true))
}

/// Logs device `mac` in at the farm API `api_url`, proving with `key` (the device secret's
/// bytes), trusting `ca_pem` for an `https://` API.
///
/// # Errors
/// [`LoginError`]: each failure names its step and keeps the API's message.
pub fn login(
    api_url: &str,
    mac: &str,
    key: &[u8],
    ca_pem: Option<&str>,
) -> Result<LoginGrant, LoginError> {
    login_as(api_url, mac, key, ca_pem, false)
}

/// [`login`], saying whether this device is diskless (the boot agent in a machine's
/// initramfs, with no disk to keep a device secret in).
///
/// # Errors
/// As [`login`].
pub fn login_as(
    api_url: &str,
    mac: &str,
    key: &[u8],
    ca_pem: Option<&str>,
    diskless: bool,
) -> Result<LoginGrant, LoginError> {
    if key.is_empty() {
        return Err(LoginError::BadKey("it is empty"));
    }
    let base = parse_api_url(api_url)?;
    let mac = parse_mac(mac)?;
    let client = Client::new(&base, ca_pem)?;
    let at = client.at(mac);
    let body = at.proof_of(key, diskless)?;
    let g: contract::login::LoginGrant<DeviceRef> = at.post("login", LOGIN_PATH, &body)?;
    grant_of(g, mac, &base, &client.shown)
}

/// Logs the diskless device `mac` in with its boot's one-time login `ticket` (the boot
/// script's `ferry.ticket=`), trusting `ca_pem`. The grant carries the device's new
/// secret ([`LoginGrant::device_secret`]), with which the same boot logs in again
/// ([`login_as`]) when it must: the ticket is used up.
///
/// # Errors
/// As [`login`]; [`LoginError::BadKey`] for a ticket that is not one.
pub fn login_ticket(
    api_url: &str,
    mac: &str,
    ticket: &str,
    ca_pem: Option<&str>,
) -> Result<LoginGrant, LoginError> {
    if !ticket.starts_with(contract::login::TICKET_PREFIX)
        || ticket.len() > contract::login::TICKET_CHARS_MAX
    {
        return Err(LoginError::BadKey(
            "the login ticket is not ft_ and hex digits",
        ));
    }
    let base = parse_api_url(api_url)?;
    let mac = parse_mac(mac)?;
    let client = Client::new(&base, ca_pem)?;
    let body = LoginRequest {
        mac: mac.to_string(),
        nonce: String::new(),
        hmac: String::new(),
        diskless: true,
        ticket: Some(ticket.to_string()),
    };
    let g: contract::login::LoginGrant<DeviceRef> =
        client.at(mac).post("login", LOGIN_PATH, &body)?;
    grant_of(g, mac, &base, &client.shown)
}

/// Tells the farm at `api_url` that device `mac` keeps its key (`key`, which proves it, as
/// at login) in its TPM: the farm then takes no login ticket for it.
///
/// # Errors
/// As [`login`].
pub fn bind_tpm(
    api_url: &str,
    mac: &str,
    key: &[u8],
    ca_pem: Option<&str>,
) -> Result<(), LoginError> {
    let base = parse_api_url(api_url)?;
    let mac = parse_mac(mac)?;
    let client = Client::new(&base, ca_pem)?;
    let at = client.at(mac);
    let body = at.proof_of(key, true)?;
    let _: serde_json::Value = at.post("tpm", contract::login::TPM_BIND_PATH, &body)?;
    Ok(())
}

/// A blocking client of the farm API at `base`, and the URL its errors show.
struct Client {
    client: reqwest::blocking::Client,
    base: Url,
    shown: String,
}

impl Client {
    fn new(base: &Url, ca_pem: Option<&str>) -> Result<Client, LoginError> {
        let shown = base.as_str().trim_end_matches('/').to_string();
        let client = api_client(base, ca_pem)?
            .build()
            .map_err(|e| LoginError::Unreachable {
                url: shown.clone(),
                reason: ErrorChain(&e).to_string(),
            })?;
        Ok(Client {
            client,
            base: base.clone(),
            shown,
        })
    }

    fn at(&self, mac: Mac) -> Post<'_> {
        Post {
            client: &self.client,
            base: &self.base,
            shown: &self.shown,
            mac,
        }
    }
}

/// The agent's [`LoginGrant`] from the farm's answer.
fn grant_of(
    g: contract::login::LoginGrant<DeviceRef>,
    mac: Mac,
    base: &Url,
    shown: &str,
) -> Result<LoginGrant, LoginError> {
    let bad = |reason: String| LoginError::BadAnswer {
        step: "login",
        url: shown.to_string(),
        reason,
    };
    let ram_bytes =
        u64::try_from(g.ram_bytes).map_err(|_| bad(format!("ram_bytes {}", g.ram_bytes)))?;
    let size_bytes =
        u64::try_from(g.size_bytes).map_err(|_| bad(format!("size_bytes {}", g.size_bytes)))?;
    let export_name = match g.export_name.parse() {
        Ok(name @ ExportName::Session(_)) => name,
        _ => return Err(bad(format!("export name {:?}", g.export_name))),
    };
    let mut servers: Vec<String> = g
        .servers
        .into_iter()
        .map(|s| s.address.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    let servers_defaulted = servers.is_empty();
    if servers_defaulted {
        let host = base.host_str().unwrap_or_default();
        servers.push(format!("{host}:{DEFAULT_NBD_PORT}"));
    }
    Ok(LoginGrant {
        servers,
        servers_defaulted,
        mac,
        device_name: g.device.name,
        vdisk: g.vdisk_name,
        vdisk_id: g.vdisk_id,
        version: g.version,
        version_created_at_ms: g.version_created_at_ms,
        size_bytes,
        cache_mode: g.cache_mode,
        ram_bytes,
        export_name,
        session_id: g.session_id,
        session_token: g.session_token,
        expires_at_ms: g.expires_at_ms,
        writable: g.writable,
        tls: g.tls,
        device_secret: g.device_secret,
    })
}

/// A target's state directory (0700): its device secret, one file per MAC
/// (`device-aa-bb-cc-dd-ee-ff.secret`, 0600, the secret's hex text), written at the first
/// login from the secret an administrator's `ferry device credential` printed, or by hand
/// after a reset.
#[derive(Debug, Clone)]
pub struct DeviceState {
    dir: PathBuf,
}

impl DeviceState {
    /// The state directory `dir` (made 0700 when it is first written).
    pub fn new(dir: &Path) -> DeviceState {
        DeviceState {
            dir: dir.to_path_buf(),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The file of `mac`'s secret.
    pub fn secret_file(&self, mac: Mac) -> PathBuf {
        let dashed = mac.to_string().replace(':', "-");
        self.dir.join(format!("device-{dashed}.secret"))
    }

    /// `mac`'s device secret (bytes), or `None` when there is none yet.
    ///
    /// # Errors
    /// [`LoginError::State`]: the file cannot be read or is not hex.
    pub fn secret(&self, mac: Mac) -> Result<Option<Vec<u8>>, LoginError> {
        use std::io::Read as _;
        let p = self.secret_file(mac);
        let state = |reason: String| LoginError::State {
            path: p.display().to_string(),
            reason,
        };
        let f = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(state(e.to_string())),
        };
        let mut text = String::new();
        f.take(SECRET_FILE_BYTES_MAX)
            .read_to_string(&mut text)
            .map_err(|e| state(e.to_string()))?;
        match hex::decode(text.trim()) {
            Ok(k) if !k.is_empty() => Ok(Some(k)),
            _ => Err(state("does not hold a hex device secret".into())),
        }
    }

    /// Stores `mac`'s device secret (hex), replacing the file atomically: the directory
    /// 0700, the file 0600.
    ///
    /// # Errors
    /// [`LoginError::State`].
    pub fn store(&self, mac: Mac, secret_hex: &str) -> Result<(), LoginError> {
        use std::io::Write as _;
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
        let p = self.secret_file(mac);
        let state = |e: std::io::Error| LoginError::State {
            path: p.display().to_string(),
            reason: e.to_string(),
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(state)?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(state)?;
        let tmp = p.with_extension("secret.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(state)?;
        f.write_all(format!("{}\n", secret_hex.trim()).as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(state)?;
        std::fs::rename(&tmp, &p).map_err(state)
    }
}

/// Logs device `mac` in with `given` (the secret an administrator's `ferry device
/// credential` printed), which is stored in `state` once it has logged in, so that later
/// logins need it no more; without `given`, with the secret stored in `state`.
///
/// # Errors
/// [`LoginError::NoCredential`] with neither; [`LoginError::State`] when the secret cannot
/// be stored; else as [`login`].
pub fn login_device(
    api_url: &str,
    mac: &str,
    given: Option<&[u8]>,
    state: &DeviceState,
    ca_pem: Option<&str>,
) -> Result<LoginGrant, LoginError> {
    let parsed = parse_mac(mac)?;
    let Some(key) = given else {
        let secret = state
            .secret(parsed)?
            .ok_or_else(|| LoginError::NoCredential {
                mac: parsed.to_string(),
                dir: state.path().display().to_string(),
            })?;
        return login(api_url, mac, &secret, ca_pem);
    };
    let grant = login(api_url, mac, key, ca_pem)?;
    if state.secret(parsed)?.as_deref() != Some(key) {
        state.store(parsed, &hex::encode(key))?;
        tracing::info!(mac = %parsed, file = %state.secret_file(parsed).display(),
            "stored the device secret given");
    }
    Ok(grant)
}

/// Where the login's POSTs go.
struct Post<'a> {
    client: &'a reqwest::blocking::Client,
    base: &'a Url,
    /// The API's URL as the errors show it.
    shown: &'a str,
    mac: Mac,
}

impl Post<'_> {
    /// A login request proving `key`: a challenge's nonce and the proof of it.
    fn proof_of(&self, key: &[u8], diskless: bool) -> Result<LoginRequest, LoginError> {
        let mac = self.mac.to_string();
        let challenge = self.challenge(&ChallengeRequest { mac: mac.clone() })?;
        Ok(LoginRequest {
            hmac: contract::login::proof(key, &challenge.nonce, self.mac),
            nonce: challenge.nonce,
            mac,
            diskless,
            ticket: None,
        })
    }

    /// A challenge, asked again (a few times, with pauses) while the farm answers 429.
    fn challenge(&self, body: &ChallengeRequest) -> Result<Challenge, LoginError> {
        let mut pause = CHALLENGE_BUSY_PAUSE;
        let mut tries = 0;
        loop {
            match self.post("challenge", CHALLENGE_PATH, body) {
                Err(LoginError::Refused { status: 429, .. }) if tries < CHALLENGE_BUSY_RETRIES => {
                    tries += 1;
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(CHALLENGE_BUSY_PAUSE_MAX);
                }
                r => return r,
            }
        }
    }

    /// One POST of `body` as JSON to `path`; a 2xx answer parsed as `T`, anything else a
    /// [`LoginError`] of `step`.
    fn post<T: serde::de::DeserializeOwned>(
        &self,
        step: &'static str,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T, LoginError> {
        let shown = self.shown;
        let unreachable = |e: reqwest::Error| LoginError::Unreachable {
            url: shown.to_string(),
            reason: ErrorChain(&e).to_string(),
        };
        let url = self.base.join(path).map_err(|e| LoginError::BadUrl {
            url: shown.to_string(),
            reason: e.to_string(),
        })?;
        let r = self
            .client
            .post(url)
            .json(body)
            .send()
            .map_err(unreachable)?;
        let status = r.status();
        let mut text = r.text().map_err(unreachable)?;
        if status == StatusCode::NO_CONTENT {
            text = "null".to_string();
        }
        if status.is_success() {
            return serde_json::from_str(&text).map_err(|e| LoginError::BadAnswer {
                step,
                url: shown.to_string(),
                reason: e.to_string(),
            });
        }
        let message = match serde_json::from_str::<ErrorAnswer>(&text) {
            Ok(e) => e.error,
            Err(_) => text,
        };
        let message = clip(message);
        let (url, mac) = (shown.to_string(), self.mac.to_string());
        Err(match status {
            StatusCode::UNAUTHORIZED => LoginError::BadProof { url, message },
            StatusCode::FORBIDDEN => LoginError::UnknownDevice { mac, url, message },
            StatusCode::CONFLICT => LoginError::Conflict { mac, url, message },
            _ => LoginError::Refused {
                step,
                url,
                status: status.as_u16(),
                message,
            },
        })
    }
}

fn clip(mut s: String) -> String {
    if s.len() > MESSAGE_BYTES_MAX {
        let mut end = MESSAGE_BYTES_MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
#[path = "login_tests.rs"]
mod tests;
