//! parent
