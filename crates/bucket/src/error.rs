//! The errors of bucket stores.

use std::path::PathBuf;

/// Errors of reading, writing, filling and verifying bucket stores.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BucketError {
    /// A store URL that is not `s3://BUCKET[/PREFIX]`.
    #[error("bad bucket URL {url:?}: {why}")]
    Url {
        /// The text given.
        url: String,
        /// What is wrong.
        why: &'static str,
    },
    /// Credentials that cannot be read.
    #[error("credentials: {0}")]
    Credentials(String),
    /// A request to the object store failed (unreachable endpoint, refused credential...).
    #[error("{op} {url}: {detail}")]
    Store {
        /// What was being done.
        op: &'static str,
        /// The object or prefix, as `s3://BUCKET/KEY`.
        url: String,
        /// The client's error with its causes, outermost first.
        detail: String,
    },
    /// An object that is missing its manifest, or the other way round.
    #[error("{0}")]
    Missing(String),
    /// A manifest that does not parse.
    #[error("manifest {url}: {source}")]
    Manifest {
        /// Where it came from.
        url: String,
        /// The parse error.
        #[source]
        source: manifest::ManifestError,
    },
    /// Bytes that do not hash to what the manifest says: never used.
    #[error(
        "hash mismatch in {object} chunk {chunk} (bytes {start}..{end}): the manifest says \
         {expected}, the bytes hash to {actual}; the object changed under a published \
         version, and its bytes are not served"
    )]
    HashMismatch {
        /// The object (`s3://BUCKET/KEY` or a local path).
        object: String,
        /// The chunk index.
        chunk: u64,
        /// Its first byte.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// The manifest's hash, hex.
        expected: String,
        /// The bytes' hash, hex.
        actual: String,
    },
    /// An object or manifest that already exists: published versions are never rewritten.
    #[error("{0} already exists: a published version is never rewritten")]
    Exists(String),
    /// A local file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The background runtime is gone or could not start.
    #[error("bucket runtime: {0}")]
    Runtime(String),
}

impl BucketError {
    /// A local I/O error.
    pub fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> BucketError {
        let path = path.into();
        move |source| BucketError::Io { op, path, source }
    }

    /// An object store error, with its whole chain of causes in the text (the client's
    /// outermost message alone often hides "connection refused" or the server's reply).
    pub fn store(
        op: &'static str,
        url: impl Into<String>,
    ) -> impl FnOnce(object_store::Error) -> BucketError {
        let url = url.into();
        move |e| BucketError::Store {
            op,
            url,
            detail: error_chain(&e),
        }
    }

    /// As a [`disk::Error`] for `Storage` callers: a hash mismatch is `Corrupt`, other
    /// failures `Io`; the text is kept whole.
    pub fn into_disk(self) -> disk::Error {
        let kind = match &self {
            BucketError::HashMismatch { .. } => disk::ErrorKind::Corrupt,
            _ => disk::ErrorKind::Io,
        };
        disk::Error::new(kind, self.to_string())
    }
}

/// An error and its causes, outermost first, joined by ": " (repeats dropped).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}
