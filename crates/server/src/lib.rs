//! Ferry's streaming server library.
//!
//! ```text
//!   TCP / unix listeners ──► nbd_server (one task per connection)
//!                                  │  requests decoded by the pure `nbd-proto` codec
//!                                  ▼
//!                         ExportSource::open(name) ──► Arc<dyn disk::BlockDevice>
//!                                  │  disk calls on a bounded blocking pool
//!                                  ▼
//!                         replies ──► one writer task per connection
//! ```
//!
//! The NBD transport (the `nbd-server` crate) knows nothing about stores or caches: it asks
//! an [`nbd_server::ExportSource`] for a device by export name and reports to an
//! [`nbd_server::NbdMetrics`].

#![warn(missing_docs)]

pub mod access;
pub mod boot_sets;
mod boot_watch;
pub mod config;
pub mod diff_cache;
pub mod exports;
pub mod http;
pub mod metrics;
pub mod open_sessions;
pub mod store;
pub use boot_watch::BootWatch;
