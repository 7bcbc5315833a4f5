//! Where a bucket store is and how to reach it: `s3://BUCKET[/PREFIX]`, an endpoint for
//! S3-compatible servers, a region, and credentials from the standard AWS variables or a
//! credentials file that only its owner may read.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjPath;

use crate::BucketError;

/// How long one connection attempt may take before the endpoint counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take in all.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Retries of a failed request (server errors and dropped connections).
pub const MAX_RETRIES: usize = 2;
/// How long a request is retried in all.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest credentials file read.
pub const MAX_CREDENTIALS_BYTES: u64 = 64 << 10;

/// A bucket and a prefix inside it: [`contract::BucketUrl`] (parsed there, shared with the
/// farm), with the object keys it makes here.
pub use contract::BucketUrl;

/// The keys of a bucket store's objects.
pub trait Keys {
    /// The key of object `name` under the prefix.
    fn key(&self, name: &str) -> ObjPath;
    /// The prefix as a key (for listing); `None` for the bucket's root.
    fn prefix_key(&self) -> Option<ObjPath>;
    /// `s3://BUCKET/KEY` of object `name`, for messages.
    fn url_of(&self, name: &str) -> String;
}

/// Parses `s3://BUCKET[/PREFIX]`.
///
/// # Errors
/// [`BucketError::Url`].
pub fn parse_url(url: &str) -> Result<BucketUrl, BucketError> {
    BucketUrl::parse(url).map_err(|e| BucketError::Url {
        url: e.url,
        why: e.why,
    })
}

impl Keys for BucketUrl {
    fn key(&self, name: &str) -> ObjPath {
        if self.prefix.is_empty() {
            ObjPath::from(name)
        } else {
            ObjPath::from(format!("{}/{name}", self.prefix))
        }
    }

    fn prefix_key(&self) -> Option<ObjPath> {
        (!self.prefix.is_empty()).then(|| ObjPath::from(self.prefix.as_str()))
    }

    fn url_of(&self, name: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(name))
    }
}

/// How to reach a bucket.
#[derive(Debug, Clone, Default)]
pub struct S3Config {
    /// The endpoint of an S3-compatible server (`http://127.0.0.1:9000`); AWS when `None`.
    pub endpoint: Option<String>,
    /// The region (`us-east-1` when `None`).
    pub region: Option<String>,
    /// A credentials file (`AWS_ACCESS_KEY_ID=…` and `AWS_SECRET_ACCESS_KEY=…` lines, or
    /// the AWS CLI's `aws_access_key_id = …` form), mode 0600 or stricter; when `None`, the
    /// standard `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`
    /// variables are used.
    pub credentials_file: Option<PathBuf>,
}

/// An access key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The key id.
    pub key_id: String,
    /// The secret.
    pub secret: String,
    /// A session token, if any.
    pub token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// Parses a credentials file's text: `KEY=VALUE` or `key = value` lines, `#` comments and
/// `[section]` lines ignored; keys are matched without case.
///
/// # Errors
/// [`BucketError::Credentials`] when the key id or secret is missing.
pub fn parse_credentials(text: &str) -> Result<Credentials, BucketError> {
    let (mut id, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"').to_string();
        match k.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => id = Some(v),
            "aws_secret_access_key" => secret = Some(v),
            "aws_session_token" => token = Some(v),
            _ => {}
        }
    }
    match (id, secret) {
        (Some(key_id), Some(secret)) if !key_id.is_empty() && !secret.is_empty() => {
            Ok(Credentials {
                key_id,
                secret,
                token,
            })
        }
        _ => Err(BucketError::Credentials(
            "no aws_access_key_id and aws_secret_access_key".into(),
        )),
    }
}

/// Reads a credentials file, refusing one that others may read.
///
/// # Errors
/// [`BucketError::Credentials`] or [`BucketError::Io`].
pub fn read_credentials(path: &Path) -> Result<Credentials, BucketError> {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    let f = std::fs::File::open(path).map_err(BucketError::io("open", path))?;
    let meta = f.metadata().map_err(BucketError::io("stat", path))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(BucketError::Credentials(format!(
            "{}: others may read it (mode {:o}); chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        )));
    }
    let mut text = String::new();
    f.take(MAX_CREDENTIALS_BYTES)
        .read_to_string(&mut text)
        .map_err(BucketError::io("read", path))?;
    parse_credentials(&text)
        .map_err(|e| BucketError::Credentials(format!("{}: {e}", path.display())))
}

fn env_credentials() -> Option<Credentials> {
    let key_id = std::env::var("AWS_ACCESS_KEY_ID").ok()?;
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").ok()?;
    Some(Credentials {
        key_id,
        secret,
        token: std::env::var("AWS_SESSION_TOKEN").ok(),
    })
}

/// The client of `url`'s bucket.
///
/// # Errors
/// Credentials or client-building errors.
pub fn connect(url: &BucketUrl, config: &S3Config) -> Result<Arc<dyn ObjectStore>, BucketError> {
    let creds = match &config.credentials_file {
        Some(p) => Some(read_credentials(p)?),
        None => env_credentials(),
    };
    let client = object_store::ClientOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_allow_http(
            config
                .endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://")),
        );
    let retry = object_store::RetryConfig {
        max_retries: MAX_RETRIES,
        retry_timeout: RETRY_TIMEOUT,
        ..Default::default()
    };
    let mut b = AmazonS3Builder::new()
        .with_bucket_name(&url.bucket)
        .with_region(config.region.as_deref().unwrap_or("us-east-1"))
        .with_client_options(client)
        .with_retry(retry);
    if let Some(e) = &config.endpoint {
        b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
    }
    match creds {
        Some(c) => {
            b = b
                .with_access_key_id(c.key_id)
                .with_secret_access_key(c.secret);
            if let Some(t) = c.token {
                b = b.with_token(t);
            }
        }
        None => {
            return Err(BucketError::Credentials(
                "none: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or pass a credentials file"
                    .into(),
            ));
        }
    }
    let store = b
        .build()
        .map_err(BucketError::store("connect to", url.to_string()))?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_strictly() {
        let u = BucketUrl::parse("s3://vdisks/farm/a/").unwrap();
        assert_eq!(u.bucket, "vdisks");
        assert_eq!(u.prefix, "farm/a");
        assert_eq!(u.key("w.vhdx").as_ref(), "farm/a/w.vhdx");
        assert_eq!(BucketUrl::parse("s3://vdisks").unwrap().prefix, "");
        for bad in [
            "vdisks",
            "s3://",
            "s3://Up",
            "s3://ab",
            "s3://b-b/../x",
            "s3://bbb/a//b",
        ] {
            assert!(BucketUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_files_in_both_forms() {
        let a = parse_credentials("AWS_ACCESS_KEY_ID=k\nAWS_SECRET_ACCESS_KEY=s\n").unwrap();
        let b = parse_credentials("[default]\naws_access_key_id = k\naws_secret_access_key = s\n")
            .unwrap();
        assert_eq!(a, b);
        assert!(parse_credentials("aws_access_key_id = k\n").is_err());
    }

    #[test]
    fn credentials_readable_by_others_are_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("creds");
        std::fs::write(&p, "AWS_ACCESS_KEY_ID=k\nAWS_SECRET_ACCESS_KEY=s\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            read_credentials(&p)
                .unwrap_err()
                .to_string()
                .contains("chmod 600")
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_credentials(&p).unwrap().key_id, "k");
    }
}
