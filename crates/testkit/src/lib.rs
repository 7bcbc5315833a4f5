//! Test doubles for Ferry.
