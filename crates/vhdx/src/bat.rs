//! bat
