//! The server's settings and limits, with their defaults.

use std::time::Duration;

use crate::options::{BLKSIZE_MAX, Bounds};

/// Default most transfers at once.
pub const MAX_TRANSFERS_DEFAULT: usize = 128;
/// Default most transfers at once per client IP address.
pub const MAX_TRANSFERS_PER_CLIENT_DEFAULT: usize = 8;
/// Default largest file served.
pub const MAX_FILE_SIZE_DEFAULT: u64 = 1 << 30;
/// Default largest window size granted.
pub const MAX_WINDOWSIZE_DEFAULT: u16 = 64;
/// Default largest window in bytes (what one retransmission re-reads).
pub const MAX_WINDOW_BYTES_DEFAULT: usize = 1 << 20;
/// Default retransmission timeout when the client sets none.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
/// Default retransmissions in a row before a transfer is abandoned.
pub const MAX_RETRIES_DEFAULT: u32 = 5;
/// Default longest transfer.
pub const TRANSFER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30 * 60);
/// Default ERROR replies per second to hostile or refused packets (and their burst).
pub const ERROR_REPLIES_PER_SECOND_DEFAULT: u32 = 100;
/// Default log lines per second about single requests (and their burst).
pub const LOGS_PER_SECOND_DEFAULT: u32 = 10;
/// Characters of a client-sent string (file name, error message) put in a log line.
pub const LOGGED_STRING_MAX: usize = 64;

/// The server's settings and limits.
#[derive(Debug, Clone)]
pub struct Config {
    /// Most transfers at once; more requests are refused (`limit`).
    pub max_transfers: usize,
    /// Most transfers at once per client IP address.
    pub max_transfers_per_client: usize,
    /// Largest file served; larger ones are refused (`too_large`).
    pub max_file_size: u64,
    /// Bounds of negotiated blksize and windowsize.
    pub bounds: Bounds,
    /// Retransmission timeout when the client sets none (the `timeout` option overrides it).
    pub timeout: Duration,
    /// Retransmissions in a row without progress before a transfer is abandoned.
    pub max_retries: u32,
    /// Longest a transfer may run.
    pub transfer_timeout: Duration,
    /// ERROR replies per second to refused packets (burst the same).
    pub error_replies_per_second: u32,
    /// Log lines per second about single requests (burst twice that).
    pub logs_per_second: u32,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_transfers: MAX_TRANSFERS_DEFAULT,
            max_transfers_per_client: MAX_TRANSFERS_PER_CLIENT_DEFAULT,
            max_file_size: MAX_FILE_SIZE_DEFAULT,
            bounds: Bounds {
                max_blksize: BLKSIZE_MAX,
                max_windowsize: MAX_WINDOWSIZE_DEFAULT,
                max_window_bytes: MAX_WINDOW_BYTES_DEFAULT,
            },
            timeout: TIMEOUT_DEFAULT,
            max_retries: MAX_RETRIES_DEFAULT,
            transfer_timeout: TRANSFER_TIMEOUT_DEFAULT,
            error_replies_per_second: ERROR_REPLIES_PER_SECOND_DEFAULT,
            logs_per_second: LOGS_PER_SECOND_DEFAULT,
        }
    }
}
