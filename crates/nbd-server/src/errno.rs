//! The one place a disk error becomes an NBD error value. The spec allows only `NBD_EPERM`,
//! `NBD_EIO`, `NBD_ENOMEM`, `NBD_EINVAL`, `NBD_ENOSPC`, `NBD_EOVERFLOW`, `NBD_ENOTSUP` and
//! `NBD_ESHUTDOWN`.

use disk::ErrorKind;
use nbd_proto::{NBD_EINVAL, NBD_EIO, NBD_ENOMEM, NBD_ENOSPC, NBD_EPERM};

/// Maps a disk error to the NBD error value sent to the client.
pub fn to_nbd_errno(e: &disk::Error) -> u32 {
    match e.kind() {
        ErrorKind::OutOfBounds | ErrorKind::InvalidArgument => NBD_EINVAL,
        ErrorKind::ReadOnly => NBD_EPERM,
        ErrorKind::LimitExceeded => NBD_ENOSPC,
        ErrorKind::Io => io_errno(e),
        _ => NBD_EIO,
    }
}

/// `ENOSPC`, `EDQUOT` and `EFBIG` become `NBD_ENOSPC` (as the spec asks), `ENOMEM`
/// `NBD_ENOMEM`; any other I/O failure is `NBD_EIO`.
fn io_errno(e: &disk::Error) -> u32 {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = cur {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::StorageFull
                | std::io::ErrorKind::QuotaExceeded
                | std::io::ErrorKind::FileTooLarge => NBD_ENOSPC,
                std::io::ErrorKind::OutOfMemory => NBD_ENOMEM,
                _ => NBD_EIO,
            };
        }
        cur = s.source();
    }
    NBD_EIO
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_bounds_is_einval() {
        let e = disk::Error::new(ErrorKind::OutOfBounds, "past the end");
        assert_eq!(to_nbd_errno(&e), NBD_EINVAL);
    }

    #[test]
    fn read_only_is_eperm() {
        let e = disk::Error::new(ErrorKind::ReadOnly, "read-only");
        assert_eq!(to_nbd_errno(&e), NBD_EPERM);
    }

    #[test]
    fn disk_full_is_enospc() {
        let io = std::io::Error::from_raw_os_error(28); // ENOSPC on Linux
        let e = disk::Error::io("write", io);
        assert_eq!(to_nbd_errno(&e), NBD_ENOSPC);
    }

    #[test]
    fn poisoned_is_eio() {
        let e = disk::Error::new(ErrorKind::Poisoned, "earlier flush failed");
        assert_eq!(to_nbd_errno(&e), NBD_EIO);
    }
}
