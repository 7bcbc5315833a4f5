//! `ferry farm ...`: create and serve a farm (`init`, `serve`: local, on the data directory),
//! and the farm-wide objects over the REST API (`vdisk`, `server`, `token`, `session`,
//! `audit`, `settings`). `ferry vdisk` and `ferry server` stay the local image and NBD
//! commands; their farm counterparts live here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

use crate::farm_client::{Client, Conn, Paging, cell, vdisk_id};
use crate::{Global, print_json};

/// `ferry farm`.
#[derive(Debug, Args)]
pub struct FarmArgs {
    #[command(subcommand)]
    command: FarmCommand,
}

/// Where the farm's data lives.
#[derive(Debug, Clone, Args)]
struct DataArgs {
    /// The data directory (SQLite database, store root, secrets/: farm key and CA).
    #[arg(long, value_name = "DIR", default_value = "ferry-data")]
    data: PathBuf,
    /// A PostgreSQL database instead of SQLite (`postgres://user:pass@host/db`).
    #[arg(long, value_name = "URL", env = "FERRY_DB", hide_env_values = true)]
    db: Option<String>,
}

impl DataArgs {
    fn config(&self) -> farm::FarmConfig {
        farm::FarmConfig {
            data_dir: self.data.clone(),
            db_url: self.db.clone(),
            store_root: None,
        }
    }
}

#[derive(Debug, Subcommand)]
enum FarmCommand {
    /// Create a farm: its database (SQLite in DIR unless --db), its secrets (DIR/secrets/: the
    /// farm key and the CA) and an admin token.
    #[command(after_help = "Example:\n  ferry farm init --data /srv/ferry")]
    Init {
        #[command(flatten)]
        data: DataArgs,
        /// The farm's name.
        #[arg(long, default_value = "ferry")]
        name: String,
        /// Print the secrets as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve the farm's REST API (and its OpenAPI document) until SIGINT or SIGTERM.
    #[command(
        after_help = "Example:\n  ferry farm serve --data /srv/ferry --listen 0.0.0.0:8080\n  \
                            curl http://127.0.0.1:8080/api/v1/openapi.json"
    )]
    Serve {
        #[command(flatten)]
        data: DataArgs,
        /// The HTTP address.
        #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// How to reach the buckets of bucket stores (the lifecycle publishes to them).
        #[command(flatten)]
        s3: crate::vdisk_bucket::S3Args,
        /// The API's per-address cap and timeouts (hidden flags).
        #[command(flatten)]
        limits: crate::server_listen::ListenArgs,
    },
    /// vDisks of the farm (the image files are managed by `ferry version`).
    #[command(
        after_help = "Examples:\n  ferry farm vdisk add golden --store 1 --size 40G\n  \
                            ferry farm vdisk list --json"
    )]
    Vdisk(VdiskArgs),
    /// Servers of the farm.
    #[command(after_help = "Example:\n  ferry farm server list")]
    Server(crate::farm_servers::ServerArgs),
    /// API tokens.
    #[command(after_help = "Example:\n  ferry farm token create ops --role operator")]
    Token(TokenArgs),
    /// Device sessions (logged-in devices).
    #[command(after_help = "Example:\n  ferry farm session list")]
    Session(SessionArgs),
    /// The audit log, newest first.
    #[command(after_help = "Example:\n  ferry farm audit --limit 20")]
    Audit {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        paging: Paging,
    },
    /// Issue certificates from the farm's CA (local: reads DIR/secrets/).
    #[command(after_help = "Examples:\n  \
        ferry farm cert admin alice --data /srv/ferry --out ~/.ferry/alice --days 30\n  \
        qemu-img info --image-opts --object tls-creds-x509,id=t,dir=$HOME/.ferry/alice,\
endpoint=client \\\n    driver=nbd,host=pvs1,port=10809,export=golden,tls-creds=t\n  \
        nbdinfo 'nbds://pvs1/golden?tls-certificates=/home/alice/.ferry/alice'\n  \
        ferry farm cert server pvs1 --host pvs1.example.com --host 10.0.0.5 --out /etc/ferry/tls")]
    Cert(CertArgs),
    /// Show or change the farm settings.
    #[command(
        after_help = "Examples:\n  ferry farm settings --auto-merge-chain-max 5\n  \
        ferry farm settings --boot-ticket-secs 60"
    )]
    Settings {
        #[command(flatten)]
        conn: Conn,
        /// Merge a chain into a new base when a new version would make it longer (0: never).
        #[arg(long)]
        auto_merge_chain_max: Option<i64>,
        /// How long a diskless boot's login ticket stays valid, in seconds (5 to 3600,
        /// default 120): the machine must log in within it (docs/netboot.md).
        #[arg(long)]
        boot_ticket_secs: Option<i64>,
    },
}

/// Runs `ferry farm`.
///
/// # Errors
/// Database, bind and API errors.
pub fn run(a: FarmArgs, global: Global) -> anyhow::Result<ExitCode> {
    match a.command {
        FarmCommand::Init { data, name, json } => init(&data, &name, json),
        FarmCommand::Serve {
            data,
            listen,
            s3,
            limits,
        } => serve(&data, listen, &s3, &limits, global),
        FarmCommand::Cert(c) => cert(c),
        FarmCommand::Vdisk(v) => vdisk(v),
        FarmCommand::Server(s) => crate::farm_servers::run(s),
        FarmCommand::Token(t) => token(t),
        FarmCommand::Session(s) => session(s),
        FarmCommand::Audit { conn, paging } => {
            let c = Client::new(&conn)?;
            let v = c.get(&format!("/audit?{}", paging.query()))?;
            c.show(
                &v,
                &["id", "at_ms", "actor", "action", "object_type", "object_id"],
            )?;
            Ok(ExitCode::SUCCESS)
        }
        FarmCommand::Settings {
            conn,
            auto_merge_chain_max,
            boot_ticket_secs,
        } => {
            let c = Client::new(&conn)?;
            let v = if auto_merge_chain_max.is_some() || boot_ticket_secs.is_some() {
                let mut body = serde_json::Map::new();
                if let Some(n) = auto_merge_chain_max {
                    body.insert("auto_merge_chain_max".into(), json!(n));
                }
                if let Some(n) = boot_ticket_secs {
                    body.insert("boot_ticket_secs".into(), json!(n));
                }
                c.call(Method::PATCH, "/farm", Some(body.into()))?
            } else {
                c.get("/farm")?
            };
            c.show(&v, &[])?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ferry-farm")
        .build()
        .context("start async runtime")
}

fn init(data: &DataArgs, name: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let secrets = runtime()?.block_on(async {
        let farm = farm::Farm::open(&data.config())
            .await
            .context("open farm database")?;
        farm.init(name).await.context("initialize farm")
    })?;
    let key_path = secrets.farm_key_file.clone();
    let secrets_dir = data.data.join(farm::secrets::SECRETS_DIR);
    let ca_cert = secrets_dir.join(farm::secrets::CA_CERT_FILE);
    if as_json {
        print_json(&json!({
            "admin_token": secrets.admin_token,
            "farm_key_file": key_path,
            "secrets_dir": secrets_dir,
            "ca_cert_file": ca_cert,
            "data_dir": data.data,
        }))?;
    } else {
        outln!("created farm {name:?} in {}", data.data.display());
        outln!("admin token (shown once): {}", secrets.admin_token);
        // The key itself is never printed (a terminal's scrollback, a CI log): it is in
        // its 0600 file.
        outln!(
            "farm key (it logs no device in; keep it with the secrets directory): {}",
            key_path.display()
        );
        outln!(
            "CA certificate (targets and clients trust it): {}",
            ca_cert.display()
        );
        outln!();
        outln!("Next: ferry farm serve --data {}", data.data.display());
        outln!("      export FERRY_TOKEN={}", secrets.admin_token);
        outln!("      ferry site add hq");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    f.write_all(format!("{text}\n").as_bytes())
        .with_context(|| format!("write {}", path.display()))
}

fn serve(
    data: &DataArgs,
    listen: SocketAddr,
    s3: &crate::vdisk_bucket::S3Args,
    limits: &crate::server_listen::ListenArgs,
    global: Global,
) -> anyhow::Result<ExitCode> {
    let mut section = server::config::LimitsSection::default();
    limits.apply(&mut section);
    let budget = crate::server_listen::farm_api(&section.resolve()?);
    runtime()?.block_on(async {
        let farm = farm::Farm::open(&data.config())
            .await
            .context("open farm database")?;
        if !farm.is_initialized().await? {
            anyhow::bail!(
                "no farm in {}; run `ferry farm init` first",
                data.data.display()
            );
        }
        farm.set_publisher(Arc::new(crate::server_bucket::FarmPublisher::new(
            s3.config(),
        )));
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("bind {listen}"))?;
        let addr = listener.local_addr()?;
        if !global.quiet {
            eprintln!(
                "serving the farm API on http://{addr}/api/v1 (OpenAPI: /api/v1/openapi.json)"
            );
        }
        let state = api::AppState {
            farm: Arc::new(farm),
            server_id: None,
        };
        let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
        let stop = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        api::tls::check_plain_listen(addr)?;
        api::serve_in(listener, state, None, budget, stop)
            .await
            .context("serve farm API")?;
        Ok(ExitCode::SUCCESS)
    })
}

/// `ferry farm cert`.
#[derive(Debug, Args)]
pub struct CertArgs {
    #[command(subcommand)]
    command: CertCommand,
}

#[derive(Debug, Subcommand)]
enum CertCommand {
    /// An administrator's client certificate (urn:ferry:admin:NAME), which may open any
    /// export: writes ca-cert.pem, client-cert.pem and client-key.pem into --out (0700, files
    /// 0600), the layout of qemu's tls-creds-x509 dir= and libnbd's tls-certificates=.
    Admin {
        /// The administrator's name (letters, digits, '.', '_', '-').
        name: String,
        #[command(flatten)]
        data: DataArgs,
        /// The directory to write.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Days of validity.
        #[arg(long, default_value_t = farm::credentials::ADMIN_CERT_DAYS_DEFAULT)]
        days: u32,
        /// Print the paths and expiry as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A server's certificate (urn:ferry:server:NAME) for the host names and addresses
    /// clients dial: writes ca-cert.pem, server-cert.pem and server-key.pem into --out.
    Server {
        /// The server's name.
        name: String,
        #[command(flatten)]
        data: DataArgs,
        /// A host name or IP address clients use (repeat).
        #[arg(long = "host", value_name = "HOST", required = true)]
        hosts: Vec<String>,
        /// The directory to write.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Print the paths and expiry as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The actor of local certificate commands in the audit log.
fn local_actor() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    format!("cli:{user}")
}

fn cert(a: CertArgs) -> anyhow::Result<ExitCode> {
    let (data, out, as_json) = match &a.command {
        CertCommand::Admin {
            data, out, json, ..
        }
        | CertCommand::Server {
            data, out, json, ..
        } => (data.clone(), out.clone(), *json),
    };
    let (kind, name, ca, issued, files) = runtime()?.block_on(async {
        let farm = farm::Farm::open(&data.config())
            .await
            .context("open farm database")?;
        if !farm.is_initialized().await? {
            anyhow::bail!(
                "no farm in {}; run `ferry farm init` first",
                data.data.display()
            );
        }
        Ok(match &a.command {
            CertCommand::Admin { name, days, .. } => {
                let (ca, issued) = farm
                    .issue_admin_cert(name, *days, &local_actor())
                    .await
                    .context("issue the administrator certificate")?;
                let files = (pki::CLIENT_CERT, pki::CLIENT_KEY);
                ("admin", name.clone(), ca, issued, files)
            }
            CertCommand::Server { name, hosts, .. } => {
                let (ca, issued) = farm
                    .issue_server_cert(name, hosts, &local_actor())
                    .await
                    .context("issue the server certificate")?;
                let files = (pki::SERVER_CERT, pki::SERVER_KEY);
                ("server", name.clone(), ca, issued, files)
            }
        })
    })?;
    let dir = pki::CertDir::create(&out).with_context(|| format!("create {}", out.display()))?;
    let write = |file: &str, text: &str| {
        dir.write(file, text)
            .with_context(|| format!("write {}", dir.file(file).display()))
    };
    write(pki::CA_CERT, &ca)?;
    write(files.1, &issued.key_pem)?;
    write(files.0, &issued.cert_pem)?;
    let identity = format!("urn:ferry:{kind}:{name}");
    if as_json {
        print_json(&json!({
            "identity": identity,
            "dir": dir.path(),
            "ca_cert": dir.file(pki::CA_CERT),
            "cert": dir.file(files.0),
            "key": dir.file(files.1),
            "not_after_unix": issued.not_after_unix,
        }))?;
    } else {
        outln!(
            "wrote the certificate of {identity} to {} (valid until Unix time {})",
            dir.path().display(),
            issued.not_after_unix
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry farm vdisk`.
#[derive(Debug, Args)]
pub struct VdiskArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: VdiskCommand,
}

#[derive(Debug, Subcommand)]
enum VdiskCommand {
    /// List vDisks.
    List(Paging),
    /// Add a vDisk: import NAME.vhdx from the store, or create it with --size.
    Add {
        /// Its name (the file is NAME.vhdx in the store).
        name: String,
        /// The store's id.
        #[arg(long)]
        store: i64,
        /// Create an empty dynamic image of this size (e.g. 40G) when NAME.vhdx is missing.
        #[arg(long, value_parser = crate::size::parse_nonzero_size)]
        size: Option<u64>,
        /// Default cache mode of its devices.
        #[arg(long)]
        cache_mode: Option<String>,
        /// Default RAM cache size in bytes (at least 1).
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        ram_bytes: Option<i64>,
        /// Free text.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Show a vDisk (name or id) and its versions.
    Show {
        /// Name or id.
        vdisk: String,
    },
    /// Remove a vDisk from the farm (its files stay in the store).
    Remove {
        /// Name or id.
        vdisk: String,
    },
    /// Change a vDisk's defaults and network boot overrides.
    #[command(after_help = "Example:\n  ferry farm vdisk set golden \
                            --boot-cmdline 'console=ttyS0,115200' --boot-kernel /boot/vmlinuz")]
    Set {
        /// Name or id.
        vdisk: String,
        /// Default cache mode of its devices.
        #[arg(long)]
        cache_mode: Option<String>,
        /// Default RAM cache size in bytes (at least 1).
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        ram_bytes: Option<i64>,
        /// Free text.
        #[arg(long)]
        description: Option<String>,
        /// Kernel arguments the network boot appends ("" clears them).
        #[arg(long, value_name = "ARGS")]
        boot_cmdline: Option<String>,
        /// The kernel's path under /boot in the version's filesystem ("" : found in /boot).
        #[arg(long, value_name = "PATH")]
        boot_kernel: Option<String>,
        /// The initramfs's path under /boot in the version's filesystem ("" : found in
        /// /boot).
        #[arg(long, value_name = "PATH")]
        boot_initrd: Option<String>,
    },
}

/// A path override's JSON: `""` clears it (null).
fn path_or_null(p: String) -> Value {
    if p.is_empty() { Value::Null } else { json!(p) }
}

fn vdisk(a: VdiskArgs) -> anyhow::Result<ExitCode> {
    let c = Client::new(&a.conn)?;
    match a.command {
        VdiskCommand::List(p) => {
            let v = c.get(&format!("/vdisks?{}", p.query()))?;
            c.show(
                &v,
                &[
                    "id",
                    "name",
                    "store_id",
                    "size_bytes",
                    "cache_mode",
                    "ram_bytes",
                ],
            )?;
        }
        VdiskCommand::Add {
            name,
            store,
            size,
            cache_mode,
            ram_bytes,
            description,
        } => {
            let body = json!({"name": name, "store_id": store, "size_bytes": size,
                "cache_mode": cache_mode, "ram_bytes": ram_bytes, "description": description});
            let v = c.post("/vdisks", Some(body))?;
            c.done(
                &v,
                &format!(
                    "added vdisk {} (id {}), version 0 in production",
                    cell(&v["name"]),
                    cell(&v["id"])
                ),
            )?;
        }
        VdiskCommand::Show { vdisk } => {
            let id = vdisk_id(&c, &vdisk)?;
            let mut v = c.get(&format!("/vdisks/{id}"))?;
            v["versions"] = c.get(&format!("/vdisks/{id}/versions"))?["items"].clone();
            c.show(&v, &[])?;
        }
        VdiskCommand::Remove { vdisk } => {
            let id = vdisk_id(&c, &vdisk)?;
            let v = c.call(Method::DELETE, &format!("/vdisks/{id}"), None)?;
            c.done(&v, &format!("removed vdisk {vdisk} from the farm"))?;
        }
        VdiskCommand::Set {
            vdisk,
            cache_mode,
            ram_bytes,
            description,
            boot_cmdline,
            boot_kernel,
            boot_initrd,
        } => {
            let id = vdisk_id(&c, &vdisk)?;
            let mut body = json!({});
            if let Some(m) = cache_mode {
                body["cache_mode"] = json!(m);
            }
            if let Some(r) = ram_bytes {
                body["ram_bytes"] = json!(r);
            }
            if let Some(d) = description {
                body["description"] = json!(d);
            }
            if let Some(b) = boot_cmdline {
                body["boot_cmdline"] = json!(b);
            }
            if let Some(k) = boot_kernel {
                body["boot_kernel"] = path_or_null(k);
            }
            if let Some(i) = boot_initrd {
                body["boot_initrd"] = path_or_null(i);
            }
            let v = c.call(Method::PATCH, &format!("/vdisks/{id}"), Some(body))?;
            c.done(&v, &format!("changed vdisk {vdisk}"))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry farm token`.
#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// List tokens (never their secrets).
    List(Paging),
    /// Create a token; its secret is printed once.
    Create {
        /// Its name (the actor in the audit log).
        name: String,
        /// admin, operator or read_only.
        #[arg(long, default_value = "read_only")]
        role: String,
    },
    /// Delete a token.
    Delete {
        /// Its id.
        id: i64,
    },
}

fn token(a: TokenArgs) -> anyhow::Result<ExitCode> {
    let c = Client::new(&a.conn)?;
    match a.command {
        TokenCommand::List(p) => {
            c.show(
                &c.get(&format!("/tokens?{}", p.query()))?,
                &["id", "name", "role"],
            )?;
        }
        TokenCommand::Create { name, role } => {
            let v = c.post("/tokens", Some(json!({"name": name, "role": role})))?;
            let secret = v["secret"].as_str().unwrap_or_default();
            c.done(&v, &format!("token {name} ({role}), shown once: {secret}"))?;
        }
        TokenCommand::Delete { id } => {
            let v = c.call(Method::DELETE, &format!("/tokens/{id}"), None)?;
            c.done(&v, &format!("deleted token {id}"))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry farm session`.
#[derive(Debug, Args)]
pub struct SessionArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: SessionCommand,
}

#[derive(Debug, Subcommand)]
enum SessionCommand {
    /// List live device sessions.
    List(Paging),
    /// End a session (the device no longer counts as booted from its version).
    End {
        /// The session id.
        id: String,
    },
}

fn session(a: SessionArgs) -> anyhow::Result<ExitCode> {
    let c = Client::new(&a.conn)?;
    match a.command {
        SessionCommand::List(p) => {
            let v = c.get(&format!("/sessions?{}", p.query()))?;
            c.show(
                &v,
                &[
                    "id",
                    "device_id",
                    "vdisk_id",
                    "version_number",
                    "device_type",
                    "export_name",
                ],
            )?;
        }
        SessionCommand::End { id } => {
            let v = c.call(Method::DELETE, &format!("/sessions/{id}"), None)?;
            c.done(&v, &format!("ended session {id}"))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
