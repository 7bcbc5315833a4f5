//! The one public error type of the I/O layer: a stable [`ErrorKind`], a context string
//! (path, offset, operation) and an optional source.

use std::fmt;

/// What class of failure this is; callers match on this, never on message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The operating system failed an I/O call.
    Io,
    /// The bytes are not a valid image of the expected format.
    InvalidFormat,
    /// The image is valid but uses a feature this implementation does not support.
    Unsupported,
    /// The image is structurally inconsistent (overlaps, bad pointers).
    Corrupt,
    /// An access beyond the virtual disk.
    OutOfBounds,
    /// A differencing chain cannot be assembled (missing parent, wrong GUID, cycle, too deep).
    ChainBroken,
    /// An earlier durability failure poisoned this object; nothing more is accepted.
    Poisoned,
    /// The device or image is read-only.
    ReadOnly,
    /// A caller-supplied argument is invalid.
    InvalidArgument,
    /// A limit was exceeded.
    LimitExceeded,
    /// Nothing exists at the path named.
    NotFound,
    /// The path names a FIFO, device, socket or directory where a file was expected.
    NotRegularFile,
    /// The path lies outside the directory opens are confined to (see
    /// [`crate::file::open_beneath`]).
    OutsideRoot,
}

/// The error of the image library.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    context: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// Shorthand result.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A new error with a message.
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error {
            kind,
            context: context.into(),
            source: None,
        }
    }

    /// A new error wrapping a source.
    pub fn with_source(
        kind: ErrorKind,
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error {
            kind,
            context: context.into(),
            source: Some(Box::new(source)),
        }
    }

    /// An I/O failure during `op`.
    pub fn io(op: impl Into<String>, e: std::io::Error) -> Error {
        Error::with_source(ErrorKind::Io, op, e)
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Prefixes the context with more detail (for instance the path).
    pub fn context(mut self, outer: impl fmt::Display) -> Error {
        self.context = format!("{outer}: {}", self.context);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
