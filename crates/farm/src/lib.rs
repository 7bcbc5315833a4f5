//! The Ferry farm: the model (farm → sites → servers, stores, device collections →
//! devices; vDisks with versions and access modes; API tokens; the audit log), its schema and
//! migrations, and one typed repository over SQLite (embedded, the default) or PostgreSQL.
//!
//! # Layout
//!
//! ```text
//! secrets.rs    DATA/secrets/: the farm key and the CA in files, server certificates
//! db.rs         Farm: pool, migrations (one set per backend), clock, init, secrets
//! private.rs    owner-only modes: data directory 0700, database files 0600
//! model.rs      the rows as typed values; enums stored as text
//! input.rs      the inputs of changes (API bodies)
//! validate.rs   checks of untrusted input: names, MACs, sizes, store paths, pages
//! confine.rs    the store-root rule: store paths, store dirs and chains stay inside
//! repo.rs       row helpers; settings, tokens, audit, sites, servers, stores
//! servers.rs    servers' identities: registration by the uid each keeps, removal
//! devices.rs    collections, devices, sessions
//! vdisks.rs     vDisks: import or create, change, remove (image library)
//! lifecycle.rs  versions: new, promote, revert, delete, merge, boot version (image library)
//! login.rs      device login: challenge (bounded per address), HMAC proof under the
//!               device's own key or a ticket, bounded auto-add, session, certificate
//! tickets.rs    one-time login tickets of diskless boots (the boot script's)
//! credentials.rs device credentials: reset; administrator certificates
//! boot.rs       the network boot decision by MAC (BootPlan): read-only, login's rules
//! boot_sets.rs  boot sets: a version's encoded set, saved by servers, read, cleared
//! vdisk_lock.rs a chain change's lock: the process's mutex, then PostgreSQL's advisory
//!               lock or an flock of DATA/locks/vdisk-ID.lock (SQLite)
//! balance.rs    load balancing at login: the servers' order (rating, load, draining),
//!               the server each session streams from, ratings and drains
//! moves.rs      where a rebalancing server's sessions go: each device's recorded
//!               destination, moved only into room
//! publish.rs    bucket stores: versions published write-once as they leave maintenance
//! publisher.rs  Publisher: the uploads a process gives the farm (the CLI's bucket client)
//! sessions.rs   SessionTable: the in-process check of session export names
//! counters.rs   devices' reported counters, shared between the API processes
//! grants.rs     a session's grant rebuilt from the database (other server, restart)
//! snapshot.rs   a server's snapshot of what boots and failovers read (in memory)
//! offline.rs    the database away: reads from the snapshot, offline logins pending,
//!               changes refused (Unavailable), catch-up when it returns; the snapshot read
//! offline_state.rs  what a process holds meanwhile (no database call)
//! error.rs      FarmError with a Kind the API maps to an HTTP status
//! ```
//!
//! What this crate is not: it serves no HTTP (`api` does) and no blocks (`server` does).
//! The values it shares with other crates (cache and access modes, MACs, export names, the
//! login wire format) are the `contract` crate's; `model` re-exports the modes.

#![warn(missing_docs)]

pub mod balance;
pub mod boot;
pub mod boot_sets;
mod confine;
pub mod counters;
pub mod credentials;
pub mod db;
pub mod devices;
pub mod error;
pub mod grants;
pub mod input;
pub mod lifecycle;
pub mod login;
pub mod model;
pub mod moves;
pub mod offline;
mod offline_state;
pub mod private;
pub mod publish;
pub mod publisher;
pub mod repo;
pub mod secrets;
pub mod servers;
pub mod sessions;
pub mod snapshot;
pub mod tickets;
pub mod validate;
mod vdisk_lock;
pub mod vdisks;

pub use db::{Backend, Clock, Farm, FarmConfig, InitSecrets, SimClock, SystemClock};
pub use error::{FarmError, Kind, Result};
pub use publisher::Publisher;
pub use sessions::{SessionGrant, SessionLookup, SessionTable};
