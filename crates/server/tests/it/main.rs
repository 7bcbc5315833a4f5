//! server's integration tests, one module per former test binary, in one binary:
//! each file its own binary cost ~15 s of compiling and linking the same async stack again
//! (docs/testing.md, "Where the time goes"). nextest still runs every test in a
//! process of its own.

#[macro_use]
mod common;
mod block_cache;
mod exports;
mod fast_paths;
mod log_flood;
mod metrics_http;
mod nbd_clients;
mod nbd_hostile;
mod nbd_inline;
mod store_files;
