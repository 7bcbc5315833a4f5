//! What the runtime needs of the server it runs in: its open sessions, and moving, closing
//! and prefetching. [`server::exports::Registry`] is the one a server has; a simulation
//! gives its own (devices that connect, fail over and come back).

/// The server side of the farm-member runtime.
pub trait Served: Send + Sync + std::fmt::Debug {
    /// The session exports with open connections.
    fn open_session_names(&self) -> Vec<String>;

    /// Closes the connections of session export `name` while the session stays valid (its
    /// device fails over to the next server of its list); returns how many.
    fn move_session(&self, name: &str) -> usize;

    /// Closes the connections of session export `name`, whose session ended; returns how
    /// many.
    fn revoke_session(&self, name: &str) -> usize;

    /// Starts the prefetch of the boot set of `vdisk@version` into the block cache; returns
    /// whether this server holds the version and it has a set. Blocking (runs on the
    /// blocking pool).
    ///
    /// # Errors
    /// Why it was not prefetched here (a version this store does not hold, …).
    fn prefetch_boot_set(&self, vdisk: &str, version: u32) -> Result<bool, String>;
}

impl Served for server::exports::Registry {
    fn open_session_names(&self) -> Vec<String> {
        server::exports::Registry::open_session_names(self)
    }

    fn move_session(&self, name: &str) -> usize {
        server::exports::Registry::move_session(self, name)
    }

    fn revoke_session(&self, name: &str) -> usize {
        server::exports::Registry::revoke_session(self, name)
    }

    fn prefetch_boot_set(&self, vdisk: &str, version: u32) -> Result<bool, String> {
        server::exports::Registry::prefetch_boot_set(self, vdisk, version)
    }
}
