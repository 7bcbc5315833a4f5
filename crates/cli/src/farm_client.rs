//! The HTTP client of the farm commands: `--api URL` (env FERRY_API), `--token` (env
//! FERRY_TOKEN), `--farm-ca FILE` (env FERRY_FARM_CA), `--json`; JSON in, JSON out; an
//! error answer becomes `error: api: 409 Conflict: <message>`. Also the text rendering of
//! answers.
//!
//! An `https://` API is verified against the farm's CA (`--farm-ca`) and nothing else (no
//! built-in roots); plain `http://` is only for a loopback address, since the token would
//! otherwise cross the network in the clear.

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

/// The farm API address used when neither `--api` nor FERRY_API is given.
pub const API_DEFAULT: &str = "http://127.0.0.1:8080";
/// How long one API call may take (a merge of a large chain takes a while).
const TIMEOUT_SECS: u64 = 3600;

/// Where the farm API is, who calls it, and how to print answers.
#[derive(Debug, Clone, Args)]
pub struct Conn {
    /// The farm API's base URL.
    #[arg(long, env = "FERRY_API", default_value = API_DEFAULT, global = true,
          help_heading = "Farm API")]
    pub api: String,
    /// An API token (`ferry farm init` prints the first admin token).
    #[arg(
        long,
        env = "FERRY_TOKEN",
        hide_env_values = true,
        global = true,
        help_heading = "Farm API"
    )]
    pub token: Option<String>,
    /// The farm CA's certificate (PEM), which an https:// API's certificate must chain to.
    #[arg(
        long,
        env = "FERRY_FARM_CA",
        value_name = "FILE",
        global = true,
        help_heading = "Farm API"
    )]
    pub farm_ca: Option<std::path::PathBuf>,
    /// Print the API's answer as JSON on stdout.
    #[arg(long, global = true, help_heading = "Farm API")]
    pub json: bool,
}

/// Checks `api`'s scheme and returns the CA an https API must chain to: `https://` needs
/// `--farm-ca`; `http://` is allowed only to a loopback host (the token would cross the
/// network in the clear).
///
/// # Errors
/// Another scheme, plain HTTP to a remote host, https without a CA, an unreadable CA.
pub fn trusted_ca(
    api: &str,
    farm_ca: Option<&std::path::Path>,
) -> anyhow::Result<Option<reqwest::Certificate>> {
    let url = reqwest::Url::parse(api).with_context(|| format!("--api {api:?} is not a URL"))?;
    let ca = match farm_ca {
        Some(path) => {
            let pem = std::fs::read(path)
                .with_context(|| format!("--farm-ca: read {}", path.display()))?;
            Some(reqwest::Certificate::from_pem(&pem).with_context(|| {
                format!("--farm-ca {} is not a PEM certificate", path.display())
            })?)
        }
        None => None,
    };
    match url.scheme() {
        "https" if ca.is_none() => bail!(
            "--api {api}: https needs the farm's CA certificate (--farm-ca FILE or FERRY_FARM_CA)"
        ),
        "https" => Ok(ca),
        "http" if is_loopback(&url) => Ok(ca),
        "http" => bail!(
            "--api {api}: plain http only to a loopback address (the API token would cross \
             the network in the clear); use https:// with --farm-ca FILE"
        ),
        other => bail!("--api {api}: scheme {other:?} is neither https nor http"),
    }
}

/// True when `url`'s host is a loopback address or `localhost`.
fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A blocking client of the farm API.
#[derive(Debug)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::blocking::Client,
    /// `--json`.
    pub json: bool,
}

impl Client {
    /// A client for `conn`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(conn: &Conn) -> anyhow::Result<Client> {
        let mut builder = reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(TIMEOUT_SECS))
            .tls_built_in_root_certs(false);
        if let Some(ca) = trusted_ca(&conn.api, conn.farm_ca.as_deref())? {
            builder = builder.add_root_certificate(ca);
        }
        let http = builder.build().context("build HTTP client")?;
        Ok(Client {
            base: format!("{}/api/v1", conn.api.trim_end_matches('/')),
            token: conn.token.clone(),
            http,
            json: conn.json,
        })
    }

    /// Calls `method path` with an optional JSON body; returns the answer (`null` for 204).
    ///
    /// # Errors
    /// Connection errors; an error answer, with its status and message.
    pub fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method.clone(), &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().with_context(|| format!("{method} {url}"))?;
        let status = resp.status();
        let text = resp
            .text()
            .with_context(|| format!("read answer of {method} {url}"))?;
        if !status.is_success() {
            let msg = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(text);
            bail!("api: {status}: {msg}");
        }
        if text.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| format!("answer of {method} {url} is not JSON"))
    }

    /// GET.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, None)
    }

    /// POST.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub fn post(&self, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        self.call(reqwest::Method::POST, path, body)
    }

    /// Prints an answer: JSON with `--json`, else a table of `columns` for a list (an
    /// object with `items`) or `key: value` lines for one object.
    ///
    /// # Errors
    /// Serialization errors.
    pub fn show(&self, v: &Value, columns: &[&str]) -> anyhow::Result<()> {
        if self.json {
            return crate::print_json(v);
        }
        match v {
            Value::Null => {}
            Value::Object(o) if o.contains_key("items") => {
                let items = o["items"].as_array().cloned().unwrap_or_default();
                crate::print_text(&table(&items, columns));
                let total = o.get("total").and_then(Value::as_i64).unwrap_or(0);
                let n = i64::try_from(items.len()).unwrap_or(i64::MAX);
                if total > n {
                    outln!("({n} of {total}; use --limit/--offset)");
                }
            }
            Value::Object(o) => {
                for (k, val) in o {
                    outln!("{k}: {}", cell(val));
                }
            }
            other => outln!("{}", cell(other)),
        }
        Ok(())
    }

    /// Prints `msg` unless `--json`, where it prints `v`.
    ///
    /// # Errors
    /// Serialization errors.
    pub fn done(&self, v: &Value, msg: &str) -> anyhow::Result<()> {
        if self.json {
            crate::print_json(v)
        } else {
            outln!("{msg}");
            Ok(())
        }
    }
}

/// A JSON value as plain text (strings without quotes, null as "-").
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn table(items: &[Value], columns: &[&str]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|it| columns.iter().map(|c| cell(&it[*c])).collect())
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = line(columns.iter().map(|c| c.to_uppercase()).collect());
    for r in rows {
        out.push('\n');
        out.push_str(&line(r));
    }
    out
}

/// `?limit=&offset=` for a list.
#[derive(Debug, Clone, Args)]
pub struct Paging {
    /// Page size (1 to 1000).
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
    /// Items to skip.
    #[arg(long, default_value_t = 0)]
    pub offset: i64,
}

impl Paging {
    /// The query string.
    pub fn query(&self) -> String {
        format!("limit={}&offset={}", self.limit, self.offset)
    }
}

/// Resolves a vDisk given by id or by name to its id.
///
/// # Errors
/// API errors; no vDisk of that name.
pub fn vdisk_id(c: &Client, vdisk: &str) -> anyhow::Result<i64> {
    if let Ok(id) = vdisk.parse() {
        return Ok(id);
    }
    let mut offset = 0;
    loop {
        let page = c.get(&format!("/vdisks?limit=1000&offset={offset}"))?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if let Some(v) = items.iter().find(|v| v["name"] == vdisk) {
            return v["id"].as_i64().context("vdisk id");
        }
        if items.len() < 1000 {
            bail!("no vdisk named {vdisk:?} in the farm");
        }
        offset += 1000;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_for_loopback_only() {
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
        ] {
            assert!(trusted_ca(ok, None).unwrap().is_none(), "{ok}");
        }
        let e = trusted_ca("http://10.0.0.5:8080", None).unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
    }

    #[test]
    fn https_needs_the_farm_ca() {
        let e = trusted_ca("https://farm.example:8080", None).unwrap_err();
        assert!(e.to_string().contains("--farm-ca"), "{e}");
        let ca = pki::Authority::create("t", std::time::SystemTime::now()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca-cert.pem");
        std::fs::write(&path, ca.cert_pem()).unwrap();
        assert!(
            trusted_ca("https://farm.example:8080", Some(&path))
                .unwrap()
                .is_some()
        );
        let missing = dir.path().join("missing.pem");
        assert!(trusted_ca("https://farm.example:8080", Some(&missing)).is_err());
    }
}
