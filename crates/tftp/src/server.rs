//! The TFTP server: one UDP socket receives requests; each accepted read request becomes a
//! transfer task with its own ephemeral socket (a new transfer ID, RFC 1350 §4).
//!
//! ```text
//!  listen socket ── recv_from ──► Packet::parse ──► RRQ octet, within limits ──► spawn transfer
//!                                      │                                         (own socket)
//!                                      └─► short / unknown opcode / bad / WRQ / netascii /
//!                                          over a limit: counted, answered with ERROR
//!                                          (rate-limited) or dropped
//! ```
//!
//! The listening loop never waits on a file or a client: opening and reading happen in the
//! transfer tasks, on the blocking pool. Limits: [`Config::max_transfers`] overall and
//! [`Config::max_transfers_per_client`] per client IP address (a flood of requests from one
//! address takes at most that many slots). A transfer whose first packet is not acknowledged
//! yet holds an *unacknowledged* slot: [`Config::max_unacknowledged_per_client`] per address
//! and [`Config::max_unacknowledged`] overall, and it ends at
//! [`Config::first_ack_timeout`] whatever `timeout` the client asked for; requests over these
//! limits are dropped without a reply, and before its first acknowledgement a transfer sends
//! its first packet at most [`FIRST_PACKET_SENDS_MAX`] times (see [`crate::sender`]). So
//! never-acknowledged requests (sources may be forged) can neither hold the slots nor draw
//! more than a packet or two per address. A second request from a client address and port
//! that already has a transfer starts nothing: it makes an unacknowledged transfer send its
//! first packet again. Every transfer ends after [`Config::max_retries`] unanswered
//! retransmissions or [`Config::transfer_timeout`].
//!
//! Logs: refusals are logged through a per-client [`RefusalLog`] (a few lines per client
//! per interval, a summary line naming each client whose lines were left out), other
//! per-request lines through a token bucket, and ERROR replies from the listening socket
//! through another, so hostile traffic can neither amplify nor flood the log.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::task::JoinSet;

use contract::refusal_log::RefusalLog;

pub use crate::config::{Config, FIRST_PACKET_SENDS_MAX, LOGGED_STRING_MAX};
use crate::counters::{Counters, RateLimit, Rejected};
use crate::packet::{ErrorCode, MAX_REQUEST_LEN, Mode, Packet, PacketError, clip};
use crate::shared::{Shared, Slot, Slots, Take};
use crate::source::FileSource;

/// A bound TFTP server.
pub struct Server {
    socket: Arc<UdpSocket>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.socket.local_addr().ok())
            .finish()
    }
}

/// What the listener does with one datagram.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Start a transfer.
    Serve(crate::packet::Request),
    /// Count, and reply with this ERROR if any.
    Refuse(Rejected, Option<(ErrorCode, String)>),
}

/// Decides what to do with a datagram at the listening port (before limits). Pure.
fn judge(buf: &[u8]) -> Verdict {
    let refuse = |r, code, msg: &str| Verdict::Refuse(r, Some((code, msg.to_string())));
    match Packet::parse(buf) {
        Ok(Packet::Rrq(req)) if req.mode == Mode::Octet => Verdict::Serve(req),
        Ok(Packet::Rrq(req)) => refuse(
            Rejected::Mode,
            ErrorCode::IllegalOperation,
            &format!("mode {} is not served, use octet", req.mode.as_str()),
        ),
        Ok(Packet::Wrq(_)) => refuse(
            Rejected::Write,
            ErrorCode::AccessViolation,
            "read-only server",
        ),
        Ok(_) => Verdict::Refuse(Rejected::Unexpected, None),
        Err(PacketError::TooShort { .. }) => Verdict::Refuse(Rejected::Short, None),
        Err(PacketError::UnknownOpcode(_)) => refuse(
            Rejected::UnknownOpcode,
            ErrorCode::IllegalOperation,
            "illegal TFTP operation",
        ),
        // Never answer an ERROR, even a malformed one.
        Err(_) if buf.starts_with(&crate::packet::OPCODE_ERROR.to_be_bytes()) => {
            Verdict::Refuse(Rejected::BadRequest, None)
        }
        Err(PacketError::Options(e)) => refuse(
            Rejected::BadRequest,
            ErrorCode::OptionRefused,
            &e.to_string(),
        ),
        Err(e) => refuse(
            Rejected::BadRequest,
            ErrorCode::IllegalOperation,
            &e.to_string(),
        ),
    }
}

impl Server {
    /// Binds the listening socket at `addr`.
    ///
    /// # Errors
    /// The bind fails.
    pub async fn bind(
        addr: SocketAddr,
        source: Arc<dyn FileSource>,
        config: Config,
    ) -> io::Result<Server> {
        let socket = UdpSocket::bind(addr).await?;
        let replies = RateLimit::new(
            config.error_replies_per_second,
            config.error_replies_per_second,
        );
        let logs = RateLimit::new(
            config.logs_per_second,
            config.logs_per_second.saturating_mul(2),
        );
        Ok(Server {
            socket: Arc::new(socket),
            shared: Arc::new(Shared {
                refusals: Mutex::new(RefusalLog::new(config.refusal_logs)),
                config,
                counters: Arc::new(Counters::default()),
                source,
                slots: Mutex::new(Slots::default()),
                replies: Mutex::new(replies),
                logs: Mutex::new(logs),
            }),
        })
    }

    /// The address the server listens on.
    ///
    /// # Errors
    /// The socket's address cannot be read.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// The live counters (for metrics).
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.shared.counters)
    }

    /// Serves until `shutdown` completes; then transfers in progress are abandoned.
    pub async fn run(self, shutdown: impl Future) {
        let local_ip = self
            .socket
            .local_addr()
            .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let mut tasks = JoinSet::new();
        let mut buf = vec![0u8; MAX_REQUEST_LEN + 1];
        let mut summaries = tokio::time::interval(
            self.shared
                .config
                .refusal_logs
                .interval
                .max(Duration::from_millis(1)),
        );
        summaries.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = async { (&mut shutdown).await; } => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = summaries.tick() => self.shared.flush_refusals(),
                r = self.socket.recv_from(&mut buf) => match r {
                    Ok((n, peer)) => self.datagram(&buf[..n], peer, local_ip, &mut tasks).await,
                    Err(e) => {
                        if let Some(suppressed) = self.shared.log_allowed() {
                            tracing::warn!(error = %e, suppressed, "tftp receive failed");
                        }
                        // Do not spin on a persistent error.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
            }
        }
        tasks.shutdown().await;
    }

    async fn datagram(
        &self,
        buf: &[u8],
        peer: SocketAddr,
        local_ip: IpAddr,
        tasks: &mut JoinSet<()>,
    ) {
        let sh = &self.shared;
        Counters::inc(&sh.counters.datagrams);
        let parsed_rrq = buf.starts_with(&crate::packet::OPCODE_RRQ.to_be_bytes());
        let verdict = judge(buf);
        if parsed_rrq && !matches!(verdict, Verdict::Refuse(Rejected::BadRequest, _)) {
            Counters::inc(&sh.counters.requests);
        }
        let req = match verdict {
            Verdict::Serve(req) => req,
            Verdict::Refuse(why, reply) => {
                sh.counters.reject(why);
                if sh.refusal_logged(peer) {
                    tracing::debug!(%peer, reason = why.as_str(), "tftp packet refused");
                }
                if let Some((code, msg)) = reply {
                    sh.reply_error(&self.socket, peer, code, &msg).await;
                }
                return;
            }
        };
        let taken = {
            let mut s = sh.slots.lock().unwrap_or_else(PoisonError::into_inner);
            s.try_take(peer, &sh.config)
        };
        let repeat = match taken {
            Take::Taken(repeat) => repeat,
            Take::Repeated => {
                sh.counters.reject(Rejected::Unexpected);
                return;
            }
            Take::Refused(why) => {
                sh.counters.reject(why);
                if sh.refusal_logged(peer) {
                    tracing::warn!(%peer, reason = why.as_str(), "tftp request over the transfer limits");
                }
                // No reply to a request over the unacknowledged limits: its source has
                // proven nothing, and a reply would go to whoever it names.
                if why == Rejected::Limit {
                    sh.reply_error(&self.socket, peer, ErrorCode::NotDefined, "server busy")
                        .await;
                }
                return;
            }
        };
        let slot = Slot {
            shared: Arc::clone(sh),
            peer,
        };
        if let Some(suppressed) = sh.log_allowed() {
            tracing::debug!(%peer, file = %clip(&req.filename, LOGGED_STRING_MAX), suppressed, "tftp read request");
        }
        tasks.spawn(crate::transfer::run(
            Arc::clone(sh),
            slot,
            repeat,
            local_ip,
            req,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_refuses_what_it_must() {
        assert_eq!(judge(&[0]), Verdict::Refuse(Rejected::Short, None));
        assert!(matches!(
            judge(&[0, 42, 0, 0]),
            Verdict::Refuse(
                Rejected::UnknownOpcode,
                Some((ErrorCode::IllegalOperation, _))
            )
        ));
        assert!(matches!(
            judge(b"\0\x02f\0octet\0"),
            Verdict::Refuse(Rejected::Write, Some((ErrorCode::AccessViolation, _)))
        ));
        assert!(matches!(
            judge(b"\0\x01f\0netascii\0"),
            Verdict::Refuse(Rejected::Mode, Some(_))
        ));
        assert!(matches!(
            judge(b"\0\x01f\0octet\0blksize\x001\0"),
            Verdict::Refuse(Rejected::BadRequest, Some((ErrorCode::OptionRefused, _)))
        ));
        assert_eq!(
            judge(&[0, 5, 0, 1]),
            Verdict::Refuse(Rejected::BadRequest, None)
        );
        assert_eq!(
            judge(&[0, 4, 0, 1]),
            Verdict::Refuse(Rejected::Unexpected, None)
        );
        assert!(matches!(judge(b"\0\x01f\0OCTET\0"), Verdict::Serve(_)));
    }
}
