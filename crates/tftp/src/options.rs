//! TFTP options: the option list of a request or an OACK (RFC 2347), the options Ferry knows
//! (blksize RFC 2348, timeout and tsize RFC 2349, windowsize RFC 7440), and the server's
//! choice of values ([`negotiate`]). Pure.
//!
//! Option names compare case-insensitively; an option Ferry does not know is skipped, as
//! RFC 2347 §2 asks. A known option with a value that is not a decimal number in its RFC's
//! range, or named twice, makes the whole packet invalid ([`OptionsError`]); the server
//! answers that with ERROR 8.

/// Smallest block size (RFC 2348).
pub const BLKSIZE_MIN: u16 = 8;
/// Largest block size (RFC 2348).
pub const BLKSIZE_MAX: u16 = 65464;
/// Block size without the option (RFC 1350).
pub const BLKSIZE_DEFAULT: u16 = 512;
/// Smallest timeout in seconds (RFC 2349).
pub const TIMEOUT_MIN: u8 = 1;
/// Smallest window size (RFC 7440); the largest is `u16::MAX`.
pub const WINDOWSIZE_MIN: u16 = 1;
/// Most options in one packet, known or not.
pub const MAX_OPTIONS: usize = 16;
/// Longest option name.
pub const MAX_OPTION_NAME_LEN: usize = 32;
/// Longest option value (u64::MAX has 20 digits).
pub const MAX_OPTION_VALUE_LEN: usize = 20;

/// The known options of a request or OACK; `None` means not present.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Block size in bytes, [`BLKSIZE_MIN`]..=[`BLKSIZE_MAX`].
    pub blksize: Option<u16>,
    /// Retransmission timeout in seconds, [`TIMEOUT_MIN`]..=255.
    pub timeout: Option<u8>,
    /// Transfer size in bytes (0 in a read request: "tell me").
    pub tsize: Option<u64>,
    /// Blocks sent per acknowledgement, [`WINDOWSIZE_MIN`]..=65535.
    pub windowsize: Option<u16>,
}

/// Why an option list is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// A known option appears twice.
    #[error("option {name} given twice")]
    Duplicate {
        /// The option (lowercase).
        name: &'static str,
    },
    /// An option name or value longer than its limit.
    #[error("{field} of {len} bytes is longer than {max}")]
    FieldTooLong {
        /// "option name" or "option value".
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A known option's value is not a decimal number in range.
    #[error("option {name} has invalid value {value:?}")]
    InvalidValue {
        /// The option (lowercase).
        name: &'static str,
        /// The value (clipped to [`MAX_OPTION_VALUE_LEN`] bytes, lossy UTF-8).
        value: String,
    },
    /// An option name without a value.
    #[error("option name without a value")]
    MissingValue,
    /// A string with no terminating NUL.
    #[error("{field} is not NUL-terminated")]
    MissingNul {
        /// "option name" or "option value".
        field: &'static str,
    },
    /// More than [`MAX_OPTIONS`] options.
    #[error("more than {max} options")]
    TooMany {
        /// [`MAX_OPTIONS`].
        max: usize,
    },
}

fn take<'a>(
    buf: &'a [u8],
    field: &'static str,
    max: usize,
) -> Result<(&'a [u8], &'a [u8]), OptionsError> {
    match buf.iter().position(|&b| b == 0) {
        Some(n) if n <= max => Ok((&buf[..n], &buf[n + 1..])),
        Some(n) => Err(OptionsError::FieldTooLong { field, len: n, max }),
        None if buf.len() > max => Err(OptionsError::FieldTooLong {
            field,
            len: buf.len(),
            max,
        }),
        None => Err(OptionsError::MissingNul { field }),
    }
}

/// A decimal number of at most [`MAX_OPTION_VALUE_LEN`] digits, in `min..=max`.
fn number(name: &'static str, v: &[u8], min: u64, max: u64) -> Result<u64, OptionsError> {
    let invalid = || OptionsError::InvalidValue {
        name,
        value: String::from_utf8_lossy(v).into_owned(),
    };
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return Err(invalid());
    }
    let n = v.iter().try_fold(0u64, |acc, &d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    });
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(invalid()),
    }
}

fn set<T>(slot: &mut Option<T>, name: &'static str, v: T) -> Result<(), OptionsError> {
    if slot.is_some() {
        return Err(OptionsError::Duplicate { name });
    }
    *slot = Some(v);
    Ok(())
}

impl Options {
    /// True when no known option is present.
    pub fn is_empty(&self) -> bool {
        *self == Options::default()
    }

    /// Parses an option list (`name NUL value NUL`, repeated) that fills `buf` exactly.
    ///
    /// # Errors
    /// [`OptionsError`] for the first problem found.
    pub fn parse(mut buf: &[u8]) -> Result<Options, OptionsError> {
        let mut o = Options::default();
        let mut count = 0;
        while !buf.is_empty() {
            count += 1;
            if count > MAX_OPTIONS {
                return Err(OptionsError::TooMany { max: MAX_OPTIONS });
            }
            let (name, rest) = take(buf, "option name", MAX_OPTION_NAME_LEN)?;
            if rest.is_empty() {
                return Err(OptionsError::MissingValue);
            }
            let (value, rest) = take(rest, "option value", MAX_OPTION_VALUE_LEN)?;
            buf = rest;
            if name.eq_ignore_ascii_case(b"blksize") {
                let n = number("blksize", value, BLKSIZE_MIN.into(), BLKSIZE_MAX.into())?;
                set(&mut o.blksize, "blksize", narrow(n))?;
            } else if name.eq_ignore_ascii_case(b"timeout") {
                let n = number("timeout", value, TIMEOUT_MIN.into(), u8::MAX.into())?;
                set(&mut o.timeout, "timeout", narrow(n))?;
            } else if name.eq_ignore_ascii_case(b"tsize") {
                let n = number("tsize", value, 0, u64::MAX)?;
                set(&mut o.tsize, "tsize", n)?;
            } else if name.eq_ignore_ascii_case(b"windowsize") {
                let n = number("windowsize", value, WINDOWSIZE_MIN.into(), u16::MAX.into())?;
                set(&mut o.windowsize, "windowsize", narrow(n))?;
            }
            // Anything else: unknown, skipped (RFC 2347 §2).
        }
        Ok(o)
    }

    /// Appends the present options, lowercase, in a fixed order.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut put = |name: &str, v: Option<u64>| {
            if let Some(v) = v {
                out.extend_from_slice(name.as_bytes());
                out.push(0);
                out.extend_from_slice(v.to_string().as_bytes());
                out.push(0);
            }
        };
        put("blksize", self.blksize.map(u64::from));
        put("timeout", self.timeout.map(u64::from));
        put("tsize", self.tsize);
        put("windowsize", self.windowsize.map(u64::from));
    }
}

/// A value already checked to fit the narrower type.
fn narrow<T: TryFrom<u64> + Default>(n: u64) -> T {
    // `number` checked the range against T's bounds.
    T::try_from(n).unwrap_or_default()
}

/// The server's bounds on negotiated values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Largest block size granted (a larger request gets this, RFC 2348 §2).
    pub max_blksize: u16,
    /// Largest window size granted.
    pub max_windowsize: u16,
    /// Largest window in bytes (`blksize * windowsize`), what one retransmission re-reads.
    pub max_window_bytes: usize,
}

/// The values of a transfer: what the server answers in its OACK and then uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The OACK's options; empty means no OACK (RFC 1350 behaviour).
    pub oack: Options,
    /// Block size used.
    pub blksize: u16,
    /// Window size used.
    pub windowsize: u16,
    /// Retransmission timeout in seconds, if the client set one.
    pub timeout: Option<u8>,
}

/// Chooses the values for a read of a file of `file_size` bytes: blksize is capped at
/// `max_blksize`, windowsize at `max_windowsize` and so that a window is at most
/// `max_window_bytes` (at least one block), tsize answers the file size, and timeout is
/// granted as asked.
///
/// tsize is left out of the OACK for an empty file: curl (7.88 at least) takes `tsize 0` in
/// an OACK as an illegal operation, and RFC 2347 lets a server leave any option out.
pub fn negotiate(req: &Options, file_size: u64, b: &Bounds) -> Negotiated {
    let max_blksize = b.max_blksize.clamp(BLKSIZE_MIN, BLKSIZE_MAX);
    let blksize = req.blksize.map(|n| n.min(max_blksize));
    let bs = blksize.unwrap_or(BLKSIZE_DEFAULT);
    let by_bytes = u16::try_from(b.max_window_bytes / usize::from(bs)).unwrap_or(u16::MAX);
    let windowsize = req
        .windowsize
        .map(|n| n.min(b.max_windowsize).min(by_bytes).max(WINDOWSIZE_MIN));
    let oack = Options {
        blksize,
        timeout: req.timeout,
        tsize: req.tsize.filter(|_| file_size > 0).map(|_| file_size),
        windowsize,
    };
    let n = Negotiated {
        oack,
        blksize: bs,
        windowsize: windowsize.unwrap_or(1),
        timeout: req.timeout,
    };
    debug_assert!(
        n.blksize >= 1 && n.windowsize >= 1,
        "negotiated {} × {}: at least one byte per block and one block per window",
        n.blksize,
        n.windowsize
    );
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(opts: &[(&str, &str)]) -> Vec<u8> {
        let mut b = Vec::new();
        for (k, v) in opts {
            b.extend_from_slice(k.as_bytes());
            b.push(0);
            b.extend_from_slice(v.as_bytes());
            b.push(0);
        }
        b
    }

    #[test]
    fn parses_known_options_in_any_case_and_skips_others() {
        let o = Options::parse(&list(&[
            ("WindowSize", "8"),
            ("blkSIZE", "65464"),
            ("x-vendor", "whatever"),
            ("timeout", "255"),
            ("tsize", "18446744073709551615"),
        ]))
        .unwrap();
        assert_eq!(
            o,
            Options {
                blksize: Some(65464),
                timeout: Some(255),
                tsize: Some(u64::MAX),
                windowsize: Some(8),
            }
        );
        let mut b = Vec::new();
        o.encode(&mut b);
        assert_eq!(Options::parse(&b).unwrap(), o);
        assert!(Options::parse(&[]).unwrap().is_empty());
    }

    #[test]
    fn refuses_out_of_range_and_malformed_values() {
        for (name, v) in [
            ("blksize", "7"),
            ("blksize", "65465"),
            ("blksize", "-1"),
            ("blksize", ""),
            ("blksize", " 512"),
            ("timeout", "0"),
            ("timeout", "256"),
            ("windowsize", "0"),
            ("windowsize", "65536"),
            ("tsize", "18446744073709551616"),
        ] {
            assert!(
                matches!(
                    Options::parse(&list(&[(name, v)])),
                    Err(OptionsError::InvalidValue { .. })
                ),
                "{name}={v}"
            );
        }
        assert_eq!(
            Options::parse(&list(&[("blksize", "512"), ("BLKSIZE", "1024")])),
            Err(OptionsError::Duplicate { name: "blksize" })
        );
        assert_eq!(
            Options::parse(b"blksize\0"),
            Err(OptionsError::MissingValue)
        );
        assert_eq!(
            Options::parse(b"blksize\x00512"),
            Err(OptionsError::MissingNul {
                field: "option value"
            })
        );
        let many: Vec<(String, String)> = (0..=MAX_OPTIONS)
            .map(|i| (format!("x{i}"), "1".to_string()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(a, b)| (&a[..], &b[..])).collect();
        assert_eq!(
            Options::parse(&list(&many)),
            Err(OptionsError::TooMany { max: MAX_OPTIONS })
        );
        let long = "y".repeat(MAX_OPTION_NAME_LEN + 1);
        assert!(matches!(
            Options::parse(&list(&[(&long, "1")])),
            Err(OptionsError::FieldTooLong { .. })
        ));
    }

    const BOUNDS: Bounds = Bounds {
        max_blksize: 1468,
        max_windowsize: 64,
        max_window_bytes: 64 << 10,
    };

    #[test]
    fn negotiation_caps_and_answers_tsize() {
        let n = negotiate(
            &Options {
                blksize: Some(9000),
                timeout: Some(2),
                tsize: Some(0),
                windowsize: Some(1000),
            },
            12345,
            &BOUNDS,
        );
        assert_eq!(n.blksize, 1468);
        assert_eq!(n.windowsize, 44); // 65536 / 1468
        assert_eq!(
            n.oack,
            Options {
                blksize: Some(1468),
                timeout: Some(2),
                tsize: Some(12345),
                windowsize: Some(44),
            }
        );
        let empty = negotiate(
            &Options {
                tsize: Some(0),
                ..Options::default()
            },
            0,
            &BOUNDS,
        );
        assert!(empty.oack.is_empty());
        let plain = negotiate(&Options::default(), 7, &BOUNDS);
        assert!(plain.oack.is_empty());
        assert_eq!((plain.blksize, plain.windowsize), (512, 1));
        let tiny = Bounds {
            max_window_bytes: 1,
            ..BOUNDS
        };
        let w = negotiate(
            &Options {
                windowsize: Some(8),
                ..Options::default()
            },
            0,
            &tiny,
        );
        assert_eq!(w.windowsize, 1);
    }
}
