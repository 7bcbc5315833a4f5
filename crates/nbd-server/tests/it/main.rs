//! nbd-server's integration tests, one module per former test binary, in one binary:
//! each file its own binary cost ~15 s of compiling and linking the same async stack again
//! (docs/testing.md, "Where the time goes"). nextest still runs every test in a
//! process of its own.

#[macro_use]
mod common;
mod churn;
mod limits;
mod log_flood;
mod tls;
mod tls_interop;
