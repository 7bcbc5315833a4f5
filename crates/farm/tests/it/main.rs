//! farm's integration tests, one module per former test binary, in one binary:
//! each file its own binary cost ~15 s of compiling and linking the same async stack again
//! (docs/testing.md, "Where the time goes"). nextest still runs every test in a
//! process of its own.

#[macro_use]
mod common;
mod balance;
mod boot;
mod boot_sets;
mod credentials;
mod farm;
mod identity;
mod private_modes;
mod servers;
mod two_processes;
