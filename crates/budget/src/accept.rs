//! The accept loop every TCP listener shares: accept, ask the gate, close a refused
//! connection at once, back off after a failed `accept`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::gate::{Gate, Ticket};

/// Pause after a failed `accept` (out of open files, ...), so the loop does not spin.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The next connection `gate` admits on `listener`, with its ticket. Connections the gate
/// refuses are closed here at once (counted and logged by the gate); failed accepts are
/// counted, logged (rate-limited) and retried after [`ACCEPT_BACKOFF`].
pub async fn accept(listener: &TcpListener, gate: &Arc<Gate>) -> (TcpStream, SocketAddr, Ticket) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => match gate.try_admit(Some(peer.ip())) {
                Ok(ticket) => return (stream, peer, ticket),
                Err(_) => drop(stream),
            },
            Err(e) => {
                gate.note_accept_error(&e);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}
