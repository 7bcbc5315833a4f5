//! A request checked against its export, once: [`Valid::check`] is the one place a request's
//! command, flags, permissions and bounds are validated (bad ones get an error reply), and a
//! [`Valid`] is the proof it passed. The layers below (`execution`, `block_status`) take a
//! `Valid` and only assert what the check established ([`Valid::assert_on`]), as nbdkit's
//! server/protocol.c validates a request and server/backend.c asserts its bounds.
//!
//! The reader checks a request where it first parses it: in its batch (`serve_buffered`) or,
//! for a request the batch did not reach, on the slow path (`admit`). A request the batch
//! checked but left to the slow path carries its check there (`transmission::Left`).

use std::ops::Deref;

use nbd_proto::{Command, NBD_EINVAL, NBD_ENOSPC, NBD_EOVERFLOW, NBD_EPERM, Request};

use crate::config::MAX_PAYLOAD;
use crate::conn::Export;
use crate::frame::{Frame, error};

/// A request that passed [`Valid::check`] against the export it runs on. Reads as the
/// [`Request`] it wraps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Valid(Request);

impl Deref for Valid {
    type Target = Request;

    fn deref(&self) -> &Request {
        &self.0
    }
}

/// Whether `cmd` changes the export's bytes.
fn writes(cmd: Command) -> bool {
    matches!(cmd, Command::Write | Command::Trim | Command::WriteZeroes)
}

impl Valid {
    /// Checks `req` against the export `e` before any disk call.
    ///
    /// # Errors
    /// The error reply to send instead: an unknown command or flag (`NBD_EINVAL`), a write
    /// to a read-only export (`NBD_EPERM`), a read over [`MAX_PAYLOAD`] (`NBD_EOVERFLOW`),
    /// block status without a context, or a range past the end (`NBD_EINVAL`, `NBD_ENOSPC`
    /// for writes).
    pub(crate) fn check(req: Request, e: &Export) -> Result<Valid, Frame> {
        let cmd = req.command;
        if let Command::Unknown(c) = cmd {
            return Err(error(NBD_EINVAL, format!("unknown command {c}")));
        }
        let bad = req.unknown_flags();
        if bad != 0 || (req.flags.df() && !e.structured) || req.flags.fast_zero() {
            return Err(error(
                NBD_EINVAL,
                format!("flags {:#x} not valid for {}", req.flags.0, cmd.name()),
            ));
        }
        if writes(cmd) && !e.writable {
            return Err(error(NBD_EPERM, "export is read-only"));
        }
        match cmd {
            Command::Read | Command::Cache if req.len > MAX_PAYLOAD => {
                return Err(error(
                    NBD_EOVERFLOW,
                    format!("{} of {} bytes over {MAX_PAYLOAD}", cmd.name(), req.len),
                ));
            }
            Command::BlockStatus if e.meta_context.is_none() => {
                return Err(error(NBD_EINVAL, "no metadata context negotiated"));
            }
            Command::BlockStatus if req.len == 0 => {
                return Err(error(NBD_EINVAL, "zero-length block status"));
            }
            Command::Flush => return Ok(Valid(req)),
            _ => {}
        }
        match req.end() {
            Some(end) if end <= e.size => Ok(Valid(req)),
            _ => {
                let errno = if matches!(cmd, Command::Write | Command::WriteZeroes) {
                    NBD_ENOSPC
                } else {
                    NBD_EINVAL
                };
                Err(error(
                    errno,
                    format!(
                        "{} at {:#x}+{:#x} past the end ({:#x})",
                        cmd.name(),
                        req.offset,
                        req.len,
                        e.size
                    ),
                ))
            }
        }
    }

    /// Asserts (in debug builds) what [`Valid::check`] established, on the export `e` the
    /// request is about to run on: a known command with documented flags, a range inside the
    /// export, a read within [`MAX_PAYLOAD`], a write only to a writable export, block status
    /// only with a context. A failure is a bug of this crate (a request run on an export it
    /// was not checked against), never a client's error.
    #[inline]
    pub(crate) fn assert_on(&self, e: &Export) {
        let req = &self.0;
        debug_assert!(
            !matches!(req.command, Command::Unknown(_) | Command::Disc),
            "{:?} is never run",
            req.command
        );
        debug_assert_eq!(req.unknown_flags(), 0, "undocumented flags on {req:?}");
        debug_assert!(
            !writes(req.command) || e.writable,
            "{req:?} on a read-only export"
        );
        debug_assert!(
            req.command == Command::Flush || req.end().is_some_and(|end| end <= e.size),
            "{req:?} past the end ({:#x})",
            e.size
        );
        debug_assert!(
            !matches!(req.command, Command::Read | Command::Cache) || req.len <= MAX_PAYLOAD,
            "{req:?} over MAX_PAYLOAD"
        );
        debug_assert!(
            req.command != Command::BlockStatus || (e.meta_context.is_some() && req.len > 0),
            "{req:?} without a context or length"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nbd_proto::CommandFlags;

    use super::*;

    /// A device of zeros: the check never calls it.
    #[derive(Debug)]
    struct Zeros;

    impl disk::BlockDevice for Zeros {
        fn geometry(&self) -> disk::device::Geometry {
            disk::device::Geometry {
                size: 1 << 20,
                logical_sector_size: 512,
                physical_sector_size: 4096,
                block_size: 1 << 20,
            }
        }

        fn format(&self) -> &'static str {
            "zeros"
        }

        fn read_at(&self, buf: &mut [u8], _offset: u64) -> disk::Result<()> {
            buf.fill(0);
            Ok(())
        }

        fn fast_path(&self) -> Option<&dyn disk::FastPath> {
            None
        }
    }

    /// A read-only export of 1 MiB with no metadata context.
    fn export() -> Export {
        Export {
            device: Arc::new(Zeros),
            size: 1 << 20,
            writable: false,
            structured: true,
            meta_context: None,
        }
    }

    fn req(command: Command, offset: u64, len: u32) -> Request {
        Request {
            flags: CommandFlags(0),
            command,
            cookie: 1,
            offset,
            len,
        }
    }

    #[test]
    fn a_read_inside_the_export_is_valid_and_passes_its_assertions() {
        let e = export();
        let v = Valid::check(req(Command::Read, (1 << 20) - 4096, 4096), &e).unwrap();
        v.assert_on(&e);
        assert_eq!(v.len, 4096);
    }

    #[test]
    fn a_read_past_the_end_is_einval() {
        let r = Valid::check(req(Command::Read, (1 << 20) - 512, 4096), &export());
        assert!(matches!(
            r,
            Err(Frame::Error {
                errno: NBD_EINVAL,
                ..
            })
        ));
    }

    #[test]
    fn a_write_to_a_read_only_export_is_eperm() {
        let r = Valid::check(req(Command::Write, 0, 512), &export());
        assert!(matches!(
            r,
            Err(Frame::Error {
                errno: NBD_EPERM,
                ..
            })
        ));
    }

    #[test]
    fn block_status_without_a_context_is_einval() {
        let r = Valid::check(req(Command::BlockStatus, 0, 512), &export());
        assert!(matches!(
            r,
            Err(Frame::Error {
                errno: NBD_EINVAL,
                ..
            })
        ));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "past the end")]
    fn a_valid_request_run_on_a_smaller_export_fails_its_assertion() {
        let e = export();
        let v = Valid::check(req(Command::Read, (1 << 20) - 4096, 4096), &e).unwrap();
        let smaller = Export { size: 1 << 19, ..e };
        v.assert_on(&smaller);
    }
}
