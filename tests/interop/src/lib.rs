//! Interop test helpers.
