//! The process's open files, shared out among its listeners.
//!
//! # Design notes
//!
//! Every accepted connection costs the process at least one open file. When any listener
//! can take files until `accept` fails with `EMFILE`, one port flooded by idle clients (the
//! HTTP boot port, say) stops every other listener too, NBD and the API included, and the
//! devices already booted lose their disks at their next reconnect. So the files are
//! planned at start, once:
//!
//! ```text
//!   RLIMIT_NOFILE (soft, raised to the hard limit)
//!   ├── reserve: FILES_RESERVED + other_files (images, caches, database, listeners,
//!   │            runtime, TFTP transfers, one file per listener for an accept it refuses)
//!   └── shares, each a listener's gate cap × its files per connection:
//!       ├── metrics  ≤ METRICS_CONNECTIONS_MAX
//!       ├── api      ≤ API_CONNECTIONS_MAX,  at most 1/HTTP_SHARE_DIVISOR of the rest
//!       ├── boot     ≤ BOOT_CONNECTIONS_MAX, at most 1/HTTP_SHARE_DIVISOR of the rest
//!       └── nbd      what is left, at most nbd.max_connections
//! ```
//!
//! A listener's gate ([`crate::Gate`]) closes an accept past its share at once, so a listener
//! can never take another's files, and the reserve stays free for what established devices
//! need. The simpler design (raise the limit and hope) was what let 1,600 idle boot-port
//! clients stop NBD and the API (issue 30, H1).

/// Files the process keeps open besides its listeners' connections: store images and
/// their chains, write caches, the database, the listeners themselves, the runtime's
/// epoll and event files, logs, and the file each accept loop holds for the instant it
/// takes to close a refused connection.
pub const FILES_RESERVED: u64 = 256;
/// Files one NBD connection holds: its socket and the export's write cache or image file.
pub const FILES_PER_NBD_CONNECTION: u64 = 2;
/// Files one boot-port connection holds: its socket and the boot file it is sending.
pub const FILES_PER_BOOT_CONNECTION: u64 = 2;
/// Most connections the API holds at once, whatever the file limit.
pub const API_CONNECTIONS_MAX: usize = 256;
/// Most connections the boot port holds at once, whatever the file limit.
pub const BOOT_CONNECTIONS_MAX: usize = 512;
/// Most connections the metrics endpoint holds at once.
pub const METRICS_CONNECTIONS_MAX: usize = 16;
/// The API and the boot port each take at most 1/`HTTP_SHARE_DIVISOR` of the files left
/// after the reserve.
pub const HTTP_SHARE_DIVISOR: u64 = 8;
/// The fewest connections a listener is given, even when the file limit is too low for
/// its share (the plan is then `short`, and the server says so).
pub const CONNECTIONS_MIN: usize = 4;
/// The highest soft limit asked for when the hard limit is unlimited.
pub const NOFILE_CEILING: u64 = 1 << 20;

/// What the process would like to serve.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wants {
    /// NBD connections asked for (`nbd.max_connections`); 0 when there is no NBD listener.
    pub nbd_connections: usize,
    /// Whether the API listens.
    pub api: bool,
    /// Whether the boot port listens.
    pub boot: bool,
    /// Whether the metrics endpoint listens.
    pub metrics: bool,
    /// Files reserved for something else besides [`FILES_RESERVED`] (TFTP transfers).
    pub other_files: u64,
}

/// Each listener's connection cap, from the file limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    /// The soft file limit planned for.
    pub files: u64,
    /// Files kept out of every listener's share.
    pub reserved: u64,
    /// NBD connections.
    pub nbd: usize,
    /// API connections.
    pub api: usize,
    /// Boot-port connections.
    pub boot: usize,
    /// Metrics connections.
    pub metrics: usize,
    /// Whether the limit is too low for what was asked (NBD got fewer connections than
    /// `nbd.max_connections`, or a listener had to be given [`CONNECTIONS_MIN`]).
    pub short: bool,
}

fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Shares `files` out among the listeners of `w` (pure; see the module's design notes).
pub fn plan(files: u64, w: &Wants) -> Plan {
    let reserved = FILES_RESERVED.saturating_add(w.other_files);
    let left = files.saturating_sub(reserved);
    let share = left / HTTP_SHARE_DIVISOR;
    let mut short = false;
    let mut cap = |on: bool, max: usize, fit: u64| -> usize {
        if !on {
            return 0;
        }
        let n = max.min(usize_of(fit));
        if n < CONNECTIONS_MIN {
            short = true;
        }
        n.max(CONNECTIONS_MIN)
    };
    let metrics = cap(w.metrics, METRICS_CONNECTIONS_MAX, share);
    let api = cap(w.api, API_CONNECTIONS_MAX, share);
    let boot = cap(
        w.boot,
        BOOT_CONNECTIONS_MAX,
        share / FILES_PER_BOOT_CONNECTION,
    );
    let http_files = (metrics + api) as u64 + boot as u64 * FILES_PER_BOOT_CONNECTION;
    let nbd_fit = left.saturating_sub(http_files) / FILES_PER_NBD_CONNECTION;
    let nbd = cap(w.nbd_connections > 0, w.nbd_connections, nbd_fit);
    if usize_of(nbd_fit) < w.nbd_connections {
        short = true;
    }
    Plan {
        files,
        reserved,
        nbd,
        api,
        boot,
        metrics,
        short,
    }
}

/// The open-file limit before and after [`raise_open_files`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit (`None`: unlimited).
    pub hard: Option<u64>,
    /// Why raising failed, if it did (the limit is then `before`).
    pub error: Option<rustix::io::Errno>,
}

/// Raises the soft open-file limit as far as the hard limit (and the kernel's `nr_open`,
/// or [`NOFILE_CEILING`] when both are unlimited) allows; never lowers it.
pub fn raise_open_files() -> FileLimit {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    let before = lim.current.unwrap_or(u64::MAX);
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(NOFILE_CEILING);
    let want = lim.maximum.unwrap_or(nr_open).min(nr_open);
    let mut out = FileLimit {
        before,
        soft: before,
        hard: lim.maximum,
        error: None,
    };
    if before >= want {
        return out;
    }
    let raised = Rlimit {
        current: Some(want),
        maximum: lim.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => out.soft = want,
        Err(e) => out.error = Some(e),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn everything(nbd_connections: usize) -> Wants {
        Wants {
            nbd_connections,
            api: true,
            boot: true,
            metrics: true,
            other_files: 0,
        }
    }

    /// The shares and the reserve never add up to more than the limit.
    fn fits(p: &Plan) -> bool {
        let used = p.reserved
            + (p.metrics + p.api) as u64
            + p.boot as u64 * FILES_PER_BOOT_CONNECTION
            + p.nbd as u64 * FILES_PER_NBD_CONNECTION;
        used <= p.files
    }

    #[test]
    fn a_large_limit_gives_every_listener_its_full_cap() {
        let p = plan(524_288, &everything(1024));
        assert_eq!((p.nbd, p.api, p.boot, p.metrics), (1024, 256, 512, 16));
        assert!(!p.short);
        assert!(fits(&p));
    }

    /// 1,024 files: 768 after the reserve; the API and the boot port take an eighth each
    /// (96 files: 96 API and 48 boot connections), metrics 16, NBD the rest at two files a
    /// connection.
    #[test]
    fn a_1024_file_limit_is_shared_and_short_for_nbd() {
        let p = plan(1024, &everything(1024));
        assert_eq!((p.api, p.boot, p.metrics), (96, 48, 16));
        assert_eq!(p.nbd, (768 - 96 - 96 - 16) / 2);
        assert!(p.short);
        assert!(fits(&p));
    }

    #[test]
    fn listeners_that_are_off_get_nothing() {
        let w = Wants {
            nbd_connections: 8,
            ..Wants::default()
        };
        let p = plan(1024, &w);
        assert_eq!((p.nbd, p.api, p.boot, p.metrics), (8, 0, 0, 0));
        assert!(!p.short);
    }

    #[test]
    fn other_files_are_kept_out_of_the_shares() {
        let w = Wants {
            other_files: 256,
            ..everything(1024)
        };
        let p = plan(1024, &w);
        assert_eq!(p.reserved, FILES_RESERVED + 256);
        assert!(fits(&p));
    }

    #[test]
    fn a_tiny_limit_still_gives_each_listener_a_few_and_says_it_is_short() {
        let p = plan(64, &everything(1024));
        assert_eq!((p.nbd, p.api, p.boot, p.metrics), (4, 4, 4, 4));
        assert!(p.short);
    }
}
