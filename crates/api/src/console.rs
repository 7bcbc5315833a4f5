//! The web console: the static files of `web/` (HTML, ES modules, CSS), compiled into the
//! binary and served as they are, at `/` and `/console/...`.
//!
//! The console is a client of the REST API like any other: it holds an API token in the
//! tab's session storage and sends it as a bearer token. Nothing here reads the farm, so the
//! router needs no state. Every answer carries a Content-Security-Policy that allows only
//! this server's own scripts, styles and API (`'self'`): no inline script, no other origin.
//! See docs/console.md.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// What the console's pages may load: only from this server.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";

/// A file of the console.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its path under `/console/`.
    pub path: &'static str,
    /// Its media type.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static str,
}

macro_rules! asset {
    ($path:literal, $type:literal) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_str!(concat!("../../../web/", $path)),
        }
    };
}

/// Every file of the console (`web/`, less the end-to-end test's `web/e2e/`).
pub const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("js/api.js", "text/javascript; charset=utf-8"),
    asset!("js/chart.js", "text/javascript; charset=utf-8"),
    asset!("js/devices.js", "text/javascript; charset=utf-8"),
    asset!("js/dom.js", "text/javascript; charset=utf-8"),
    asset!("js/main.js", "text/javascript; charset=utf-8"),
    asset!("js/tree.js", "text/javascript; charset=utf-8"),
    asset!("js/vdisks.js", "text/javascript; charset=utf-8"),
];

/// The asset at `path` (relative to `/console/`), if any.
pub fn asset(path: &str) -> Option<&'static Asset> {
    let path = if path.is_empty() { "index.html" } else { path };
    ASSETS.iter().find(|a| a.path == path)
}

/// The console's routes: `/` and `/console/` (the page), `/console/{*path}` (its files).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(index))
        .route("/console/{*path}", get(file))
}

async fn index() -> Response {
    serve(asset("index.html"))
}

async fn file(Path(path): Path<String>) -> Response {
    serve(asset(&path))
}

fn serve(a: Option<&'static Asset>) -> Response {
    let Some(a) = a else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such console file\n",
        )
            .into_response();
    };
    let mut r = a.body.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a.content_type),
    );
    // The files change only with the binary; revalidation keeps an upgrade visible.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_path_is_the_index() {
        assert_eq!(asset("").unwrap().path, "index.html");
    }

    #[test]
    fn path_outside_the_list_is_not_found() {
        assert!(asset("../Cargo.toml").is_none());
        assert!(asset("e2e/package.json").is_none());
    }

    #[test]
    fn every_module_the_page_imports_is_served() {
        // Each `from './x.js'` of each script and each /console/ reference of the page names
        // an asset, so a new module cannot be forgotten in ASSETS.
        for a in ASSETS {
            for part in a.body.split("from './").skip(1) {
                let name = part.split('\'').next().unwrap();
                assert!(
                    asset(&format!("js/{name}")).is_some(),
                    "{} imports {name}",
                    a.path
                );
            }
            for part in a.body.split("\"/console/").skip(1) {
                let name = part.split('"').next().unwrap();
                assert!(asset(name).is_some(), "{} references {name}", a.path);
            }
        }
    }
}
