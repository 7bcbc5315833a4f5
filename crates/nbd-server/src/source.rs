//! Where exports come from: the [`ExportSource`] the server's store implements, and what it
//! hands out (an [`ExportHandle`] per connection, an [`ExportInfo`] per listed export).

use std::fmt;
use std::sync::Arc;

/// One export, as listed by `NBD_OPT_LIST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export name a client asks for.
    pub name: String,
    /// A human-readable description (`NBD_INFO_DESCRIPTION`); may be empty.
    pub description: String,
    /// Size in bytes.
    pub size: u64,
}

/// An opened export, owned by one connection.
pub struct ExportHandle {
    /// The device to serve.
    pub device: Arc<dyn disk::BlockDevice>,
    /// Whether the client may write (the device must then also `can_write`).
    pub writable: bool,
    /// Runs once when the connection ends, after in-flight requests finished and a writable
    /// device was flushed (discard a non-persistent write cache, unlock a private image).
    pub release: Option<Box<dyn FnOnce() + Send>>,
}

impl fmt::Debug for ExportHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportHandle")
            .field("device", &self.device)
            .field("writable", &self.writable)
            .field("release", &self.release.is_some())
            .finish()
    }
}

/// Dropping a handle runs its `release` if the server has not already run it (the server
/// runs it explicitly, on the blocking pool, after the final flush).
impl Drop for ExportHandle {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Why an export could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// No export of that name (`NBD_REP_ERR_UNKNOWN`).
    #[error("no export named {0:?}")]
    NotFound(String),
    /// The export exists but cannot be opened now, e.g. a private image already has its one
    /// writer (`NBD_REP_ERR_POLICY`).
    #[error("export busy: {0}")]
    Busy(String),
    /// Anything else (`NBD_REP_ERR_UNKNOWN` with a message... logged on the server).
    #[error("cannot open export: {0}")]
    Other(String),
}

/// Where the NBD server finds its exports. Implemented by the server's store/registry.
///
/// Both methods are called on tokio's blocking pool, so they may do file I/O (open a chain,
/// scan a store directory). `open` is called once per `NBD_OPT_INFO`, `NBD_OPT_GO` and
/// `NBD_OPT_EXPORT_NAME`; the handle of an `NBD_OPT_INFO` is released right after its reply.
pub trait ExportSource: Send + Sync {
    /// Every export a client may list.
    fn list(&self) -> Vec<ExportInfo>;

    /// Opens `name` ("" is the default export) for one connection.
    ///
    /// # Errors
    /// [`OpenError`].
    fn open(&self, name: &str) -> Result<ExportHandle, OpenError>;
}
