//! The control socket: one request line, one JSON reply line.
//!
//! ```text
//!   "status\n"       → Status as JSON
//!   "mark-booted\n"  → {"boot_time_s": 12.5, "boot_ended_by": "marked"}
//!                     (or the end recorded before: "read_burst_over", "boot_bytes")
//! ```
//!
//! A unix socket next to the export (mode 0600 by the umask of root on a target), so only
//! the machine's own administrator talks to the agent.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The longest request line the agent reads.
pub const REQUEST_BYTES_MAX: usize = 256;
/// How long a client waits for the agent.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the control client.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The agent is not running there, or the socket failed.
    #[error("cannot reach the target agent at {path}")]
    Connect {
        /// The socket path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The agent answered with something else than JSON.
    #[error("invalid reply from the target agent: {0}")]
    InvalidReply(String),
}

/// Sends `command` to the agent at `path` and returns its JSON reply.
///
/// # Errors
/// [`ControlError`].
pub fn request(path: &Path, command: &str) -> Result<serde_json::Value, ControlError> {
    let conn_err = |source| ControlError::Connect {
        path: path.display().to_string(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(conn_err)?;
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).map_err(conn_err)?;
    s.write_all(format!("{command}\n").as_bytes())
        .map_err(conn_err)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).map_err(conn_err)?;
    serde_json::from_str(&line).map_err(|e| ControlError::InvalidReply(e.to_string()))
}
