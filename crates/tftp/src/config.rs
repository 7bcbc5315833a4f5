//! The server's settings and limits, with their defaults.

use std::time::Duration;

use crate::options::{BLKSIZE_MAX, Bounds};

/// Default most transfers at once.
pub const MAX_TRANSFERS_DEFAULT: usize = 128;
/// Default most transfers at once per client IP address.
pub const MAX_TRANSFERS_PER_CLIENT_DEFAULT: usize = 8;
/// Default most transfers at once whose first packet (OACK or block 1) is not acknowledged
/// yet, per client IP address. A boot client asks for one file at a time; a source address
/// that has acknowledged nothing (it may be forged) gets no second transfer to reflect.
pub const MAX_UNACKNOWLEDGED_PER_CLIENT_DEFAULT: usize = 1;
/// Default most transfers at once whose first packet is not acknowledged yet, all clients
/// together: half the slots, so unacknowledged requests from many (forged) addresses leave
/// the other half to transfers that are under way.
pub const MAX_UNACKNOWLEDGED_DEFAULT: usize = MAX_TRANSFERS_DEFAULT / 2;
/// Default time a client has to acknowledge a transfer's first packet (its OACK, or block 1
/// without options), whatever `timeout` it asked for: a few seconds, the time a boot ROM
/// takes to answer even on a slow link.
pub const FIRST_ACK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(3);
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
/// Times a transfer sends its first packet before that packet is acknowledged: once, and
/// once more when the client repeats its request (its first packet was lost). The server
/// never retransmits it on its own, so a request whose source never acknowledges draws at
/// most this many packets (RFC 1350 §4: the requester retransmits its request on timeout).
pub const FIRST_PACKET_SENDS_MAX: u32 = 2;

/// The server's settings and limits.
#[derive(Debug, Clone)]
pub struct Config {
    /// Most transfers at once; more requests are refused (`limit`).
    pub max_transfers: usize,
    /// Most transfers at once per client IP address.
    pub max_transfers_per_client: usize,
    /// Most transfers at once per client IP address whose first packet is not acknowledged;
    /// more requests are dropped without a reply (`unacknowledged`).
    pub max_unacknowledged_per_client: usize,
    /// Most transfers at once whose first packet is not acknowledged, all clients together;
    /// more requests are dropped without a reply (`unacknowledged`).
    pub max_unacknowledged: usize,
    /// Time a client has to acknowledge a transfer's first packet (OACK or block 1) before
    /// the transfer ends and its slot is free, whatever `timeout` option it sent.
    pub first_ack_timeout: Duration,
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
    /// Budgets of log lines about refused requests, per client address and in all, and the
    /// interval of the summary lines that count what was left out.
    pub refusal_logs: contract::refusal_log::Limits,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_transfers: MAX_TRANSFERS_DEFAULT,
            max_transfers_per_client: MAX_TRANSFERS_PER_CLIENT_DEFAULT,
            max_unacknowledged_per_client: MAX_UNACKNOWLEDGED_PER_CLIENT_DEFAULT,
            max_unacknowledged: MAX_UNACKNOWLEDGED_DEFAULT,
            first_ack_timeout: FIRST_ACK_TIMEOUT_DEFAULT,
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
            refusal_logs: contract::refusal_log::Limits::default(),
        }
    }
}
