//! `s3://BUCKET[/PREFIX]`: where a bucket store keeps its vDisks. Parsed once here so the
//! farm (which stores it) and the bucket crate (which connects to it) agree on what is valid.

use std::fmt;

/// The longest bucket URL accepted.
pub const BUCKET_URL_BYTES_MAX: usize = 1024;

/// What is wrong with a bucket URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bucket URL {url:?}: {why}")]
pub struct BucketUrlError {
    /// The text given (its first 200 characters).
    pub url: String,
    /// What is wrong.
    pub why: &'static str,
}

/// A bucket and a prefix inside it (no leading or trailing `/`; empty for the root).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketUrl {
    /// The bucket: 3 to 63 of `a-z 0-9 . -`.
    pub bucket: String,
    /// The prefix, `a/b` style.
    pub prefix: String,
}

impl BucketUrl {
    /// Parses `s3://BUCKET[/PREFIX]`; a trailing `/` is dropped.
    ///
    /// # Errors
    /// [`BucketUrlError`] naming what is wrong.
    pub fn parse(url: &str) -> Result<BucketUrl, BucketUrlError> {
        let bad = |why| BucketUrlError {
            url: url.chars().take(200).collect(),
            why,
        };
        if url.len() > BUCKET_URL_BYTES_MAX {
            return Err(bad("longer than the limit of 1024 bytes"));
        }
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("does not start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(bad("a bucket name is 3..=63 of a-z 0-9 . -"));
        }
        let prefix = prefix.trim_matches('/');
        for part in prefix.split('/').filter(|p| !p.is_empty()) {
            if part == "." || part == ".." || part.chars().any(char::is_control) {
                return Err(bad("the prefix has a . or .. part or a control character"));
            }
        }
        if prefix.contains("//") {
            return Err(bad("the prefix has an empty part"));
        }
        Ok(BucketUrl {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// True when `s` names a bucket store rather than a directory.
    pub fn is_bucket(s: &str) -> bool {
        s.starts_with("s3://")
    }
}

impl fmt::Display for BucketUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_normal_form() {
        let u = BucketUrl::parse("s3://vdisks/site-a/gold/").unwrap();
        assert_eq!(
            (u.bucket.as_str(), u.prefix.as_str()),
            ("vdisks", "site-a/gold")
        );
        assert_eq!(u.to_string(), "s3://vdisks/site-a/gold");
        assert_eq!(
            BucketUrl::parse("s3://abc").unwrap().to_string(),
            "s3://abc"
        );
    }

    #[test]
    fn refuses_what_is_not_a_bucket_url() {
        for bad in [
            "vdisks",
            "http://vdisks",
            "s3://ab",
            "s3://Upper",
            "s3://b_c",
            "s3://abc/../x",
            "s3://abc/a//b",
            "s3://abc/a\u{1}b",
        ] {
            assert!(BucketUrl::parse(bad).is_err(), "{bad}");
        }
        let long = format!("s3://abc/{}", "x".repeat(BUCKET_URL_BYTES_MAX));
        assert!(BucketUrl::parse(&long).unwrap_err().why.contains("1024"));
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_round_trips(s in "\\PC{0,80}") {
            if let Ok(u) = BucketUrl::parse(&s) {
                proptest::prop_assert_eq!(BucketUrl::parse(&u.to_string()).unwrap(), u);
            }
        }
    }
}
