//! One device of the devices section: a raw NBD connection (fixed newstyle handshake,
//! `NBD_OPT_GO`, simple replies) that reads 4 KiB blocks, written with `nbd_proto`'s codecs
//! over a tokio socket so one harness process holds thousands at once (nbdinfo or fio would
//! be a process each).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nbd_proto::client::OptionReplyHeader;
use nbd_proto::{
    ClientFlags, ClientOption, Command, CommandFlags, InfoRequest, NBD_FLAG_NO_ZEROES,
    NBD_INFO_EXPORT, NBD_REP_ACK, NBD_REP_INFO, Request, ServerGreeting, SimpleReply,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bytes of the server's greeting.
const GREETING_LEN: usize = 18;
/// Bytes of an option reply's header.
const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Bytes of a simple reply's header.
const SIMPLE_REPLY_LEN: usize = 16;
/// How long a disconnecting device waits for the server to close its side.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

/// An NBD connection in transmission.
#[derive(Debug)]
pub struct Device {
    stream: TcpStream,
    cookie: u64,
    /// The export's size, as the server told it.
    pub size: u64,
}

impl Device {
    /// Connects to `addr` and enters transmission on `export` with `NBD_OPT_GO`.
    ///
    /// # Errors
    /// The connection failing, the server refusing the export, or bytes that are not NBD.
    pub async fn connect(addr: SocketAddr, export: &str) -> Result<Device> {
        let mut s = TcpStream::connect(addr).await.context("connect")?;
        s.set_nodelay(true)?;
        let mut greeting = [0u8; GREETING_LEN];
        s.read_exact(&mut greeting).await.context("greeting")?;
        let g = ServerGreeting::parse(&greeting)?;
        let mut out = Vec::new();
        ClientFlags {
            fixed_newstyle: true,
            no_zeroes: g.handshake_flags & NBD_FLAG_NO_ZEROES != 0,
        }
        .encode(&mut out);
        ClientOption::Go(InfoRequest {
            name: export.to_string(),
            requests: Vec::new(),
        })
        .encode(&mut out);
        s.write_all(&out).await?;
        let mut size = None;
        loop {
            let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
            s.read_exact(&mut h).await.context("option reply")?;
            let head = OptionReplyHeader::parse(&h)?;
            let mut payload = vec![0u8; head.len as usize];
            s.read_exact(&mut payload).await?;
            match head.reply_type {
                NBD_REP_ACK => break,
                NBD_REP_INFO => {
                    if let (Some(kind), Some(sz)) = (payload.first_chunk::<2>(), payload.get(2..10))
                        && u16::from_be_bytes(*kind) == NBD_INFO_EXPORT
                    {
                        size = Some(u64::from_be_bytes(sz.try_into()?));
                    }
                }
                t => bail!(
                    "NBD_OPT_GO refused ({t:#x}): {}",
                    String::from_utf8_lossy(&payload)
                ),
            }
        }
        Ok(Device {
            stream: s,
            cookie: 0,
            size: size.context("no NBD_INFO_EXPORT before the ACK")?,
        })
    }

    /// Reads `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// The connection failing, or an error reply.
    pub async fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.cookie += 1;
        let mut out = Vec::with_capacity(nbd_proto::REQUEST_LEN);
        Request {
            flags: CommandFlags(0),
            command: Command::Read,
            cookie: self.cookie,
            offset,
            len: u32::try_from(buf.len())?,
        }
        .encode(&mut out);
        self.stream.write_all(&out).await?;
        let mut head = [0u8; SIMPLE_REPLY_LEN];
        self.stream.read_exact(&mut head).await?;
        let r = SimpleReply::parse(&head)?;
        if r.cookie != self.cookie || r.error != 0 {
            bail!("read at {offset}: reply {r:?}");
        }
        self.stream.read_exact(buf).await?;
        Ok(())
    }

    /// Sends `NBD_CMD_DISC` and waits (at most [`CLOSE_WAIT`]) for the server to close.
    ///
    /// # Errors
    /// The server not closing in time.
    pub async fn disconnect(mut self) -> Result<()> {
        let mut out = Vec::with_capacity(nbd_proto::REQUEST_LEN);
        Request {
            flags: CommandFlags(0),
            command: Command::Disc,
            cookie: self.cookie + 1,
            offset: 0,
            len: 0,
        }
        .encode(&mut out);
        // A server that already closed is as good as one that closes now.
        let _ = self.stream.write_all(&out).await;
        let _ = self.stream.shutdown().await;
        let mut sink = [0u8; 512];
        tokio::time::timeout(CLOSE_WAIT, async {
            loop {
                match self.stream.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .context("the server did not close the connection")
    }
}
