//! One read transfer: its own UDP socket (a new transfer ID), the file opened through the
//! [`FileSource`](crate::FileSource) on the blocking pool, option negotiation, then the
//! [`Sender`] state machine driven by ACKs, timeouts and repeated requests (the listener
//! signals those). Datagrams from any other address or port get ERROR 5 and do not disturb
//! the transfer (RFC 1350 §4). When the first packet is acknowledged the transfer tells the
//! slot table, which then stops counting it as unacknowledged.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::Notify;
use tokio::time::sleep_until;

use crate::config::LOGGED_STRING_MAX;
use crate::counters::{Counters, Rejected};
use crate::options::negotiate;
use crate::packet::{ErrorCode, MAX_PACKET_LEN, Packet, Request, clip, encode_data_header};
use crate::sender::{AckOutcome, GiveUp, Params, Sender, Transmit, wire_block};
use crate::shared::{Shared, Slot};
use crate::source::TftpFile;

/// The reason of a transfer that ended because its first packet was not acknowledged.
const FIRST_ACK_TIMEOUT: &str = "first packet not acknowledged";

/// How a transfer ended, for the counters and the log.
enum End {
    Completed,
    Failed(&'static str),
}

/// Runs one transfer to its end; `slot` is freed when it returns (or is aborted). `repeat`
/// is signalled when the client sends its request again.
pub(crate) async fn run(
    sh: Arc<Shared>,
    slot: Slot,
    repeat: Arc<Notify>,
    local_ip: IpAddr,
    req: Request,
) {
    let peer = slot.peer;
    let socket = match UdpSocket::bind(SocketAddr::new(local_ip, 0)).await {
        Ok(s) => s,
        Err(e) => {
            if let Some(suppressed) = sh.log_allowed() {
                tracing::warn!(%peer, error = %e, suppressed, "tftp: cannot bind a transfer socket");
            }
            return;
        }
    };
    let file = match open(&sh, peer, &req).await {
        Ok(f) => f,
        Err((code, msg)) => {
            // The slot is free before the client hears why, so its next request (sent as
            // soon as this ERROR arrives) is not refused as a second unacknowledged one.
            drop(slot);
            sh.reply_error(&socket, peer, code, &msg).await;
            return;
        }
    };
    let started = Instant::now();
    Counters::inc(&sh.counters.transfers_started);
    Counters::inc(&sh.counters.transfers_active);
    let mut t = Transfer {
        sh: &sh,
        socket: &socket,
        peer,
        file,
        repeat,
        highest_sent: 0,
        oack_sent: false,
        packet: Vec::with_capacity(MAX_PACKET_LEN),
        window: Vec::new(),
        last_word: None,
    };
    let end = t.serve(&req).await;
    sh.counters
        .transfers_active
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    let file_name = clip(&req.filename, LOGGED_STRING_MAX);
    match end {
        End::Completed => {
            Counters::inc(&sh.counters.transfers_completed);
            if let Some(suppressed) = sh.log_allowed() {
                tracing::info!(%peer, file = %file_name, size = t.file.size(),
                    ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX), suppressed, "tftp transfer complete");
            }
        }
        End::Failed(why) => {
            Counters::inc(&sh.counters.transfers_failed);
            if why == FIRST_ACK_TIMEOUT {
                Counters::inc(&sh.counters.first_ack_timeouts);
            }
            if let Some(suppressed) = sh.log_allowed() {
                tracing::info!(%peer, file = %file_name, reason = why, suppressed, "tftp transfer failed");
            }
        }
    }
    let last_word = t.last_word;
    drop(slot);
    if let Some(msg) = last_word {
        sh.reply_error(&socket, peer, ErrorCode::NotDefined, msg)
            .await;
    }
}

/// Opens the file; on failure counts and logs why and returns the ERROR to send.
async fn open(
    sh: &Arc<Shared>,
    peer: SocketAddr,
    req: &Request,
) -> Result<TftpFile, (ErrorCode, String)> {
    let source = Arc::clone(&sh.source);
    let name = req.filename.clone();
    let opened = tokio::task::spawn_blocking(move || source.open(&name, peer)).await;
    let (why, code, msg) = match opened {
        Ok(Ok(f)) if f.size() <= sh.config.max_file_size => return Ok(f),
        Ok(Ok(_)) => (
            Rejected::TooLarge,
            ErrorCode::NotDefined,
            "file too large".to_string(),
        ),
        Ok(Err(e)) => {
            let why = if e.is_refusal() {
                Rejected::PathRefused
            } else {
                Rejected::NotFound
            };
            (why, e.error_code(), e.to_string())
        }
        Err(_) => (
            Rejected::NotFound,
            ErrorCode::NotDefined,
            "open failed".to_string(),
        ),
    };
    sh.counters.reject(why);
    if sh.refusal_logged(peer) {
        tracing::info!(%peer, file = %clip(&req.filename, LOGGED_STRING_MAX), reason = why.as_str(),
            error = %msg, "tftp request refused");
    }
    Err((code, msg))
}

struct Transfer<'a> {
    sh: &'a Shared,
    socket: &'a UdpSocket,
    peer: SocketAddr,
    file: TftpFile,
    /// Signalled by the listener when the client repeats its request.
    repeat: Arc<Notify>,
    /// The highest block sent so far (a lower one sent again is a retransmission).
    highest_sent: u64,
    /// The OACK went out once (a second time is a retransmission).
    oack_sent: bool,
    packet: Vec<u8>,
    window: Vec<u8>,
    /// The ERROR message that ends the transfer, sent after its slot is freed.
    last_word: Option<&'static str>,
}

impl Transfer<'_> {
    async fn serve(&mut self, req: &Request) -> End {
        let n = negotiate(&req.options, self.file.size(), &self.sh.config.bounds);
        let timeout = n
            .timeout
            .map_or(self.sh.config.timeout, |s| Duration::from_secs(s.into()));
        let now = Instant::now();
        let params = Params {
            size: self.file.size(),
            blksize: n.blksize,
            window: n.windowsize,
            oack: !n.oack.is_empty(),
            timeout,
            first_ack_timeout: self.sh.config.first_ack_timeout,
            max_retries: self.sh.config.max_retries,
        };
        let (mut sender, first) = Sender::new(params, now);
        let give_up = tokio::time::Instant::from_std(now + self.sh.config.transfer_timeout);
        if let Err(why) = self.transmit(&sender, first, &n.oack).await {
            return End::Failed(why);
        }
        let mut buf = vec![0u8; MAX_PACKET_LEN + 1];
        let repeat = Arc::clone(&self.repeat);
        loop {
            let deadline = tokio::time::Instant::from_std(sender.deadline());
            let first_pending = !sender.first_acked();
            let next = tokio::select! {
                r = self.socket.recv_from(&mut buf) => match r {
                    Ok((len, from)) => self.datagram(&mut sender, &buf[..len], from).await,
                    Err(_) => continue,
                },
                () = repeat.notified(), if first_pending => {
                    sender.on_repeated_request().map_or(Step::Wait, Step::Send)
                }
                () = sleep_until(deadline) => match sender.on_timeout(Instant::now()) {
                    Ok(t) => Step::Send(t),
                    Err(GiveUp::FirstAckTimeout) => Step::End(End::Failed(FIRST_ACK_TIMEOUT)),
                    Err(GiveUp::RetriesExhausted { .. }) => {
                        Step::End(End::Failed("client stopped acknowledging"))
                    }
                },
                () = sleep_until(give_up) => {
                    self.last_word = Some("transfer timed out");
                    Step::End(End::Failed("transfer timeout"))
                }
            };
            if first_pending && sender.first_acked() {
                let mut slots = self.sh.slots.lock().unwrap_or_else(PoisonError::into_inner);
                slots.acknowledged(self.peer);
            }
            match next {
                Step::Wait => {}
                Step::End(e) => return e,
                Step::Send(t) => {
                    if let Err(why) = self.transmit(&sender, t, &n.oack).await {
                        return End::Failed(why);
                    }
                }
            }
        }
    }

    async fn datagram(&mut self, sender: &mut Sender, buf: &[u8], from: SocketAddr) -> Step {
        if from != self.peer {
            self.sh.counters.reject(Rejected::WrongTid);
            if self.sh.refusal_logged(from) {
                tracing::debug!(peer = %self.peer, %from, "tftp packet from a wrong transfer ID");
            }
            if !buf.starts_with(&crate::packet::OPCODE_ERROR.to_be_bytes()) {
                self.sh
                    .reply_error(
                        self.socket,
                        from,
                        ErrorCode::UnknownTid,
                        "unknown transfer ID",
                    )
                    .await;
            }
            return Step::Wait;
        }
        match Packet::parse(buf) {
            Ok(Packet::Ack { block }) => match sender.on_ack(block, Instant::now()) {
                AckOutcome::Send(t) => Step::Send(t),
                AckOutcome::Ignored => Step::Wait,
                AckOutcome::Done => Step::End(End::Completed),
            },
            Ok(Packet::Error { code, message }) => {
                if let Some(suppressed) = self.sh.log_allowed() {
                    tracing::debug!(peer = %self.peer, code = code.to_u16(),
                        message = %clip(&message, LOGGED_STRING_MAX), suppressed, "tftp client sent an error");
                }
                Step::End(End::Failed("client sent an error"))
            }
            Ok(_) => {
                self.sh.counters.reject(Rejected::Unexpected);
                Step::Wait
            }
            Err(_) => {
                self.sh.counters.reject(Rejected::BadRequest);
                Step::Wait
            }
        }
    }

    /// Sends the OACK or a run of blocks (read from the file on the blocking pool).
    async fn transmit(
        &mut self,
        sender: &Sender,
        t: Transmit,
        oack: &crate::options::Options,
    ) -> Result<(), &'static str> {
        let (first, last) = match t {
            Transmit::Oack => {
                self.packet.clear();
                Packet::Oack(*oack).encode(&mut self.packet);
                if self.oack_sent {
                    Counters::inc(&self.sh.counters.retransmits);
                }
                self.oack_sent = true;
                let _ = self.socket.send_to(&self.packet, self.peer).await;
                return Ok(());
            }
            Transmit::Blocks { first, last } => (first, last),
        };
        let (start, _) = sender.block_range(first);
        let (last_off, last_len) = sender.block_range(last);
        let total =
            usize::try_from(last_off + last_len as u64 - start).map_err(|_| "window too large")?;
        let file = self.file.clone();
        let mut window = std::mem::take(&mut self.window);
        window.resize(total, 0);
        let read = tokio::task::spawn_blocking(move || {
            let r = file.read_exact_at(&mut window, start);
            (window, r)
        })
        .await;
        let window = match read {
            Ok((w, Ok(()))) => w,
            Ok((_, Err(_))) | Err(_) => {
                self.last_word = Some("read error");
                return Err("read error");
            }
        };
        for abs in first..=last {
            let (off, len) = sender.block_range(abs);
            let at = usize::try_from(off - start).map_err(|_| "window too large")?;
            self.packet.clear();
            encode_data_header(wire_block(abs), &mut self.packet);
            self.packet.extend_from_slice(&window[at..at + len]);
            if abs <= self.highest_sent {
                Counters::inc(&self.sh.counters.retransmits);
            }
            self.highest_sent = self.highest_sent.max(abs);
            if self.socket.send_to(&self.packet, self.peer).await.is_ok() {
                self.sh
                    .counters
                    .bytes_sent
                    .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
            }
        }
        self.window = window;
        Ok(())
    }
}

/// What the transfer loop does next.
enum Step {
    Wait,
    Send(Transmit),
    End(End),
}
