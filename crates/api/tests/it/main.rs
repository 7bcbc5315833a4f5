//! api's integration tests, one module per former test binary, in one binary:
//! each file its own binary cost ~15 s of compiling and linking the same async stack again
//! (docs/testing.md, "Where the time goes"). nextest still runs every test in a
//! process of its own.

#[path = "../../../farm/tests/it/common/mod.rs"]
#[macro_use]
mod common;
mod api;
mod api_flood;
mod boot;
mod boot_sets;
mod console_e2e;
mod console_routes;
mod hardening;
mod https;
mod login_flood;
mod status_shared;
mod support;
