//! Contracts shared between Ferry's crates: the values that cross a crate boundary as
//! text or JSON and must be spelled the same way on both sides.
//!
//! What it is not: no I/O, no sockets, no clock, no async. Every type here parses from and
//! prints to text (or JSON through serde), so each side of a contract calls the same code;
//! the one policy here, [`refusal_log`], takes the time as an argument.
//!
//! # Layout
//!
//! ```text
//! name.rs         VdiskName, DeviceName: the names an export name is made of
//! export.rs       ExportName: NAME[@N][+DEVICE[+persistent]] | NAME+private | ferry-s-KEY
//! mac.rs          Mac: a MAC address, normalized to aa:bb:cc:dd:ee:ff
//! identity.rs     Identity: who a certificate names, urn:ferry:device|admin|server:NAME
//! cache_mode.rs   CacheMode: where a device's writes go; farm (snake) and CLI (kebab) names
//! access.rs       AccessMode: who may boot a version
//! login.rs        device login: the JSON of /login/challenge and /login, and the proof
//! error_chain.rs  ErrorChain: prints `what: cause: cause`
//! boot_args.rs    BootArgs: the boot agent's `ferry.*` kernel arguments and boot.conf
//! bucket_url.rs   BucketUrl: s3://BUCKET[/PREFIX] of a bucket store
//! boot_set.rs     BootSetRequest: a device asks for its version's boot set
//! refusal_log.rs  RefusalLog: per-client budget of refusal log lines, summaries per interval
//! ```
//!
//! Who uses what:
//!
//! ```text
//!   server   ExportName (parses every NBD export name), VdiskName, DeviceName, SessionKey
//!   agent    ExportName (prints the one it attaches), CacheMode, Mac, login (client side)
//!   farm     CacheMode, AccessMode (stored as text), Mac, SessionKey (makes session
//!            exports), login (server side), name::check_plain_name (every object's name)
//!   api      login (request bodies and schemas), ExportName (status reports), ErrorChain
//!   cli      ExportName + DeviceName (session grant -> registry export), CacheMode, Mac
//!   pki      Identity (the SAN URI of every certificate it issues or reads back)
//!   boot-agent BootArgs (what the farm's boot script and install-initramfs told it)
//!   farm, bucket BucketUrl (the store's bucket, checked when stored and when connected)
//!   nbd-server, tftp RefusalLog (what a client's refusals may write to the log)
//!   all      ErrorChain
//! ```
//!
//! With the `utoipa` feature the wire types also derive `utoipa::ToSchema`, so the farm
//! API's OpenAPI document describes them from these definitions.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access;
pub mod boot_args;
pub mod boot_set;
pub mod bucket_url;
pub mod cache_mode;
pub mod error_chain;
pub mod export;
pub mod identity;
pub mod login;
pub mod mac;
pub mod name;
pub mod refusal_log;

pub use access::AccessMode;
pub use bucket_url::{BucketUrl, BucketUrlError};
pub use cache_mode::{CacheMode, CacheModeError};
pub use error_chain::ErrorChain;
pub use export::{ExportName, ExportNameError, SESSION_EXPORT_PREFIX, SessionKey};
pub use identity::{IDENTITY_NAME_BYTES_MAX, IDENTITY_URI_PREFIX, Identity, IdentityError};
pub use mac::{Mac, MacError};
pub use name::{DeviceName, NameError, VdiskName};
