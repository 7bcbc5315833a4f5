//! A vDisk object's manifest: its size, a chunk size, one BLAKE3 hash per chunk and a
//! BLAKE3 digest of the whole object. Any two servers or stores holding the same manifest
//! can prove they hold the same bytes; a reader of a remote object checks every chunk
//! against it before the bytes are used.
//!
//! The codec is pure (no I/O): [`Manifest::encode`] writes the text form, [`Manifest::parse`]
//! reads it strictly (fixed field order, no extra lines, every count bounded by a named
//! limit), and [`Builder`] hashes an object fed to it piece by piece.
//!
//! The text form, one field a line, LF-terminated:
//!
//! ```text
//! ferry-manifest 1
//! object NAME
//! size BYTES
//! chunk-size BYTES
//! algorithm blake3
//! digest HEX64
//! chunks N
//! HEX64            (N lines, chunk 0 first)
//! ```

#![warn(missing_docs)]

use std::fmt::Write as _;

/// The chunk size new manifests use: the unit of a ranged GET and of verification.
pub const CHUNK_SIZE: u64 = 1 << 20;
/// The smallest chunk size a manifest may name.
pub const MIN_CHUNK_SIZE: u64 = 4 << 10;
/// The largest chunk size a manifest may name.
pub const MAX_CHUNK_SIZE: u64 = 64 << 20;
/// The most chunks one manifest lists (4 TiB at [`CHUNK_SIZE`]).
pub const MAX_CHUNKS: u64 = 1 << 22;
/// The longest object name.
pub const MAX_NAME_LEN: usize = 255;
/// The first line of every manifest.
pub const MAGIC: &str = "ferry-manifest 1";
/// The name of the hash algorithm.
pub const ALGORITHM: &str = "blake3";
/// Bytes of one hash.
pub const HASH_LEN: usize = 32;
/// The largest manifest text accepted: the header plus [`MAX_CHUNKS`] hash lines.
pub const MAX_MANIFEST_BYTES: usize = 1024 + MAX_CHUNKS as usize * (HASH_LEN * 2 + 1);

/// A BLAKE3 hash.
pub type Hash = [u8; HASH_LEN];

/// Errors of parsing or building a manifest.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManifestError {
    /// The text is longer than [`MAX_MANIFEST_BYTES`].
    #[error("manifest of {0} bytes is longer than the limit of {MAX_MANIFEST_BYTES}")]
    TooLong(usize),
    /// The text is not UTF-8.
    #[error("manifest is not UTF-8 text")]
    NotText,
    /// A line is missing or is not the expected field.
    #[error("manifest line {line}: expected {expected}")]
    Field {
        /// 1-based line number.
        line: usize,
        /// What was expected there.
        expected: &'static str,
    },
    /// A number does not parse or is out of range.
    #[error("manifest line {line}: bad {what}: {value:?}")]
    Number {
        /// 1-based line number.
        line: usize,
        /// Which field.
        what: &'static str,
        /// The text found (cut to 64 characters).
        value: String,
    },
    /// The algorithm is not [`ALGORITHM`].
    #[error("manifest algorithm {0:?} is not supported (only {ALGORITHM})")]
    Algorithm(String),
    /// An object name that is empty, too long, or has a character outside the allowed set.
    #[error("bad object name {0:?} (1..={MAX_NAME_LEN} of A-Z a-z 0-9 . _ -, not starting with .)")]
    Name(String),
    /// A chunk size that is not a power of two in range.
    #[error("chunk size {0} is not a power of two between {MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE}")]
    ChunkSize(u64),
    /// More chunks than [`MAX_CHUNKS`].
    #[error("object of {0} bytes needs more than {MAX_CHUNKS} chunks")]
    TooLarge(u64),
    /// The chunk count does not match the size.
    #[error("manifest lists {found} chunks; an object of its size has {expected}")]
    ChunkCount {
        /// Chunks the size implies.
        expected: u64,
        /// Chunks listed.
        found: u64,
    },
    /// A hash is not 64 lowercase hex digits.
    #[error("manifest line {0}: a hash is 64 lowercase hex digits")]
    Hash(usize),
    /// Text after the last chunk line.
    #[error("manifest line {0}: unexpected text after the last chunk")]
    Trailing(usize),
}

/// A parsed or built manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The object's file name (e.g. `win11.2.avhdx`).
    pub name: String,
    /// The object's size in bytes.
    pub size: u64,
    /// The chunk size.
    pub chunk_size: u64,
    /// BLAKE3 of the whole object.
    pub digest: Hash,
    /// BLAKE3 of each chunk, chunk 0 first (the last may be short).
    pub chunks: Vec<Hash>,
}

/// Checks an object name: 1..=[`MAX_NAME_LEN`] of `A-Z a-z 0-9 . _ -`, not starting with `.`.
///
/// # Errors
/// [`ManifestError::Name`].
pub fn check_name(name: &str) -> Result<(), ManifestError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ManifestError::Name(name.chars().take(64).collect()))
    }
}

fn check_chunk_size(c: u64) -> Result<(), ManifestError> {
    if c.is_power_of_two() && (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&c) {
        Ok(())
    } else {
        Err(ManifestError::ChunkSize(c))
    }
}

/// The number of chunks of an object of `size` bytes.
pub fn chunk_count(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size)
}

impl Manifest {
    /// The byte range `[start, end)` of chunk `i`.
    pub fn chunk_range(&self, i: u64) -> (u64, u64) {
        let start = i * self.chunk_size;
        (start, (start + self.chunk_size).min(self.size))
    }

    /// The number of chunks.
    pub fn chunk_count(&self) -> u64 {
        self.chunks.len() as u64
    }

    /// Checks `bytes` as chunk `i`: `Ok(())` or the hash they have.
    ///
    /// # Errors
    /// The actual hash when it differs (or `bytes` has the wrong length, hashed anyway).
    pub fn check_chunk(&self, i: u64, bytes: &[u8]) -> Result<(), Hash> {
        let got = *blake3::hash(bytes).as_bytes();
        let (s, e) = self.chunk_range(i);
        match self.chunks.get(i as usize) {
            Some(want) if *want == got && bytes.len() as u64 == e - s => Ok(()),
            _ => Err(got),
        }
    }

    /// The chunks whose hashes differ between two manifests of the same chunk size (every
    /// chunk past the shorter one counts as different).
    pub fn differing_chunks(&self, other: &Manifest) -> Vec<u64> {
        let n = self.chunks.len().max(other.chunks.len());
        (0..n)
            .filter(|&i| {
                self.chunk_size != other.chunk_size || self.chunks.get(i) != other.chunks.get(i)
            })
            .map(|i| i as u64)
            .collect()
    }

    /// The text form.
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(256 + self.chunks.len() * (HASH_LEN * 2 + 1));
        let _ = writeln!(s, "{MAGIC}");
        let _ = writeln!(s, "object {}", self.name);
        let _ = writeln!(s, "size {}", self.size);
        let _ = writeln!(s, "chunk-size {}", self.chunk_size);
        let _ = writeln!(s, "algorithm {ALGORITHM}");
        let _ = writeln!(s, "digest {}", hex::encode(self.digest));
        let _ = writeln!(s, "chunks {}", self.chunks.len());
        for c in &self.chunks {
            let _ = writeln!(s, "{}", hex::encode(c));
        }
        s
    }

    /// Parses the text form strictly.
    ///
    /// # Errors
    /// [`ManifestError`] naming the line.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLong(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| ManifestError::NotText)?;
        let body = text.strip_suffix('\n').ok_or(ManifestError::Field {
            line: text.split('\n').count(),
            expected: "a final newline",
        })?;
        let mut lines = body.split('\n').enumerate().map(|(i, l)| (i + 1, l));
        let mut field = |key: &'static str| -> Result<(usize, &str), ManifestError> {
            let (n, l) = lines.next().ok_or(ManifestError::Field {
                line: 0,
                expected: key,
            })?;
            if key == MAGIC {
                return if l == MAGIC {
                    Ok((n, ""))
                } else {
                    Err(ManifestError::Field {
                        line: n,
                        expected: MAGIC,
                    })
                };
            }
            l.strip_prefix(key)
                .and_then(|r| r.strip_prefix(' '))
                .map(|v| (n, v))
                .ok_or(ManifestError::Field {
                    line: n,
                    expected: key,
                })
        };
        field(MAGIC)?;
        let (_, name) = field("object")?;
        check_name(name)?;
        let name = name.to_string();
        let (n, v) = field("size")?;
        let size = number(n, "size", v)?;
        let (n, v) = field("chunk-size")?;
        let chunk_size = number(n, "chunk-size", v)?;
        check_chunk_size(chunk_size)?;
        let expected = chunk_count(size, chunk_size);
        if expected > MAX_CHUNKS {
            return Err(ManifestError::TooLarge(size));
        }
        let (_, alg) = field("algorithm")?;
        if alg != ALGORITHM {
            return Err(ManifestError::Algorithm(alg.chars().take(64).collect()));
        }
        let (n, v) = field("digest")?;
        let digest = hash(n, v)?;
        let (n, v) = field("chunks")?;
        let found = number(n, "chunks", v)?;
        if found != expected {
            return Err(ManifestError::ChunkCount { expected, found });
        }
        let mut chunks = Vec::with_capacity(found as usize);
        for _ in 0..found {
            let (n, l) = lines.next().ok_or(ManifestError::ChunkCount {
                expected,
                found: chunks.len() as u64,
            })?;
            chunks.push(hash(n, l)?);
        }
        if let Some((n, _)) = lines.next() {
            return Err(ManifestError::Trailing(n));
        }
        Ok(Manifest {
            name,
            size,
            chunk_size,
            digest,
            chunks,
        })
    }
}

fn number(line: usize, what: &'static str, v: &str) -> Result<u64, ManifestError> {
    let bad = || ManifestError::Number {
        line,
        what,
        value: v.chars().take(64).collect(),
    };
    // Plain decimal only: no sign, no leading zero (but "0"), at most 20 digits.
    if v.is_empty() || v.len() > 20 || (v.len() > 1 && v.starts_with('0')) {
        return Err(bad());
    }
    if !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    v.parse().map_err(|_| bad())
}

fn hash(line: usize, v: &str) -> Result<Hash, ManifestError> {
    if v.len() != HASH_LEN * 2 || !v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(ManifestError::Hash(line));
    }
    let mut out = [0u8; HASH_LEN];
    hex::decode_to_slice(v, &mut out).map_err(|_| ManifestError::Hash(line))?;
    Ok(out)
}

/// Builds a manifest from an object's bytes fed in order, in pieces of any size.
#[derive(Debug)]
pub struct Builder {
    name: String,
    chunk_size: u64,
    whole: blake3::Hasher,
    chunk: blake3::Hasher,
    in_chunk: u64,
    size: u64,
    chunks: Vec<Hash>,
}

impl Builder {
    /// A builder for object `name` with `chunk_size` chunks.
    ///
    /// # Errors
    /// A bad name or chunk size.
    pub fn new(name: &str, chunk_size: u64) -> Result<Builder, ManifestError> {
        check_name(name)?;
        check_chunk_size(chunk_size)?;
        Ok(Builder {
            name: name.to_string(),
            chunk_size,
            whole: blake3::Hasher::new(),
            chunk: blake3::Hasher::new(),
            in_chunk: 0,
            size: 0,
            chunks: Vec::new(),
        })
    }

    /// Feeds the next bytes of the object.
    ///
    /// # Errors
    /// [`ManifestError::TooLarge`] past [`MAX_CHUNKS`] chunks.
    pub fn update(&mut self, mut bytes: &[u8]) -> Result<(), ManifestError> {
        self.whole.update(bytes);
        while !bytes.is_empty() {
            let room = (self.chunk_size - self.in_chunk) as usize;
            let n = room.min(bytes.len());
            self.chunk.update(&bytes[..n]);
            self.in_chunk += n as u64;
            self.size += n as u64;
            bytes = &bytes[n..];
            if self.in_chunk == self.chunk_size {
                self.push_chunk()?;
            }
        }
        Ok(())
    }

    fn push_chunk(&mut self) -> Result<(), ManifestError> {
        if self.chunks.len() as u64 >= MAX_CHUNKS {
            return Err(ManifestError::TooLarge(self.size));
        }
        self.chunks.push(*self.chunk.finalize().as_bytes());
        self.chunk.reset();
        self.in_chunk = 0;
        Ok(())
    }

    /// The manifest of the bytes fed.
    ///
    /// # Errors
    /// [`ManifestError::TooLarge`].
    pub fn finish(mut self) -> Result<Manifest, ManifestError> {
        if self.in_chunk > 0 {
            self.push_chunk()?;
        }
        Ok(Manifest {
            name: self.name,
            size: self.size,
            chunk_size: self.chunk_size,
            digest: *self.whole.finalize().as_bytes(),
            chunks: self.chunks,
        })
    }
}

/// The manifest of `bytes` held in memory.
///
/// # Errors
/// As [`Builder`].
pub fn of_bytes(name: &str, chunk_size: u64, bytes: &[u8]) -> Result<Manifest, ManifestError> {
    let mut b = Builder::new(name, chunk_size)?;
    b.update(bytes)?;
    b.finish()
}

#[cfg(test)]
mod tests;
