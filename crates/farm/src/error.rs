//! The one error type of the farm. Callers (the API) match on [`FarmError::kind`], never on
//! the message; the message is short, lowercase, and safe to show to an API caller.

/// What went wrong, for the caller to react on (the API maps it to an HTTP status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// The input is malformed or out of range (HTTP 400).
    InvalidInput,
    /// No object with that id or name (HTTP 404).
    NotFound,
    /// The request conflicts with the state: a forbidden transition, a duplicate name, an
    /// object still in use (HTTP 409).
    Conflict,
    /// The caller did not prove who it is (HTTP 401).
    Unauthenticated,
    /// The caller is known but may not do this (HTTP 403).
    Forbidden,
    /// A limit was reached (HTTP 429).
    LimitReached,
    /// The database failed (HTTP 500).
    Database,
    /// The database cannot be reached (refused, reset, timed out, shutting down): nothing
    /// was changed; try again when it returns (HTTP 503). Reads a server answers from its
    /// last snapshot of the farm never see it ([`crate::offline`]).
    Unavailable,
    /// An image operation in the store failed (HTTP 500).
    Image,
    /// A bucket store's bucket could not be reached, refused this process, or failed
    /// (HTTP 502).
    Bucket,
    /// The farm's secrets (its key, its CA) are missing, unreadable or another farm's
    /// (HTTP 500).
    Secrets,
}

/// A farm error: a [`Kind`], a message, and an optional source.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct FarmError {
    kind: Kind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The result type of the farm.
pub type Result<T> = std::result::Result<T, FarmError>;

impl FarmError {
    /// An error of `kind` with `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> FarmError {
        FarmError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// [`Kind::InvalidInput`].
    pub fn invalid(message: impl Into<String>) -> FarmError {
        FarmError::new(Kind::InvalidInput, message)
    }

    /// [`Kind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> FarmError {
        FarmError::new(Kind::NotFound, message)
    }

    /// [`Kind::Conflict`].
    pub fn conflict(message: impl Into<String>) -> FarmError {
        FarmError::new(Kind::Conflict, message)
    }

    /// [`Kind::Image`] with the image library's error as source.
    pub fn image(message: impl Into<String>, source: disk::Error) -> FarmError {
        FarmError {
            kind: Kind::Image,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// An error of the image library during `what`, with the kind it deserves: an
    /// argument the library refuses is [`Kind::InvalidInput`]; a damaged, unsupported or
    /// broken chain, or an output file that exists already, is [`Kind::Conflict`] (the
    /// store's state); a missing file is [`Kind::NotFound`]; other failures stay
    /// [`Kind::Image`]. The message names the operation and the library's reason.
    pub fn from_image(what: impl std::fmt::Display, source: disk::Error) -> FarmError {
        use disk::ErrorKind as D;
        let io = || {
            std::error::Error::source(&source)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .map(std::io::Error::kind)
        };
        let kind = match source.kind() {
            D::InvalidArgument => Kind::InvalidInput,
            D::ChainBroken
            | D::InvalidFormat
            | D::Corrupt
            | D::Unsupported
            | D::LimitExceeded
            | D::ReadOnly => Kind::Conflict,
            D::Io => match io() {
                Some(std::io::ErrorKind::AlreadyExists) => Kind::Conflict,
                Some(std::io::ErrorKind::NotFound) => Kind::NotFound,
                _ => return FarmError::image(what.to_string(), source),
            },
            _ => return FarmError::image(what.to_string(), source),
        };
        FarmError {
            kind,
            message: format!("{what}: {source}"),
            source: Some(Box::new(source)),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The message, without the source chain.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<sqlx::Error> for FarmError {
    fn from(e: sqlx::Error) -> FarmError {
        let kind = match &e {
            sqlx::Error::RowNotFound => Kind::NotFound,
            sqlx::Error::Database(d) if d.is_unique_violation() => Kind::Conflict,
            sqlx::Error::Database(d) if d.is_foreign_key_violation() => Kind::Conflict,
            e if unreachable(e) => Kind::Unavailable,
            _ => Kind::Database,
        };
        let message = match kind {
            Kind::NotFound => "not found".to_string(),
            Kind::Conflict => match &e {
                sqlx::Error::Database(d) if d.is_unique_violation() => {
                    "an object with that name already exists".to_string()
                }
                _ => "the object is referenced by another object".to_string(),
            },
            Kind::Unavailable => UNAVAILABLE.to_string(),
            _ => "database error".to_string(),
        };
        if kind == Kind::Unavailable {
            tracing::debug!(error = %e, "database unreachable");
        }
        if kind == Kind::Database {
            tracing::error!(error = %e, "database error");
        }
        FarmError {
            kind,
            message,
            source: Some(Box::new(e)),
        }
    }
}

/// What a caller is told when the database cannot be reached.
pub const UNAVAILABLE: &str = "the farm database cannot be reached: nothing was changed; \
     devices keep booting from the servers' last snapshot of the farm; try again when the \
     database is back";

/// True when `e` says the database is not there (as opposed to refusing a statement): the
/// connection failed or broke, the pool timed out waiting for one, or the server is
/// shutting down or starting (SQLSTATE class 08, 57P01–57P03).
fn unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

impl From<sqlx::migrate::MigrateError> for FarmError {
    fn from(e: sqlx::migrate::MigrateError) -> FarmError {
        FarmError {
            kind: Kind::Database,
            message: "database migration failed".to_string(),
            source: Some(Box::new(e)),
        }
    }
}
