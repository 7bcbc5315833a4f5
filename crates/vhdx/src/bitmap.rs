//! bitmap
