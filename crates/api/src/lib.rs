//! The Ferry REST API: axum handlers over the [`farm`] crate under `/api/v1`, bearer API
//! tokens with roles, JSON errors, and the OpenAPI 3 document at `/api/v1/openapi.json`.
//!
//! # Layout
//!
//! ```text
//! lib.rs      AppState, router(), the OpenAPI document, serve()
//! error.rs    ApiError {"error": "..."} and the one farm::Kind → status mapping
//! extract.rs  JSON/query/path extractors with JSON rejections; Reader/Operator/Admin callers
//! routes.rs   farm, tokens, audit, sites, servers, stores, collections, devices, sessions,
//!             login
//! vdisks.rs   vDisks and the version lifecycle
//! boot_sets.rs a version's boot set: summary, clear; a device fetches its own (session)
//! status.rs   the live status (devices, sessions, counters shared between APIs); reports
//! device_session.rs a device ends its own session (its machine shut down cleanly)
//! tls.rs      plain HTTP on loopback only (HTTPS and every listener bound: the budget crate)
//! boot.rs     the network boot routes (plain HTTP, no credentials, boot data only):
//!             boot::router (served behind a budget gate: `ferry server --boot-listen`),
//!             BootState, BootCounters
//! boot_script.rs  the iPXE scripts (pure): chain, per device, refusal
//! boot_cache.rs   DATA/boot-cache/: boot files per version file state
//! boot_versions.rs each version's located boot files, found once per version file state
//! boot_source.rs  the BootSource and Located traits, and BootfilesSource: boot files
//!                 through a version's chain (the bootfiles crate)
//! ```
//!
//! [`router`] returns a plain `axum::Router`, so `ferry server` can mount it beside its own
//! routes; [`serve_tls`] runs it alone over HTTPS, [`serve`] in plain HTTP on a loopback
//! address only, and [`serve_in`] either behind a given [`Listen`] (gate and timeouts).

#![warn(missing_docs)]

pub mod boot;
pub mod boot_cache;
pub mod boot_script;
pub mod boot_sets;
pub mod boot_source;
mod boot_versions;
pub mod console;
pub mod device_session;
pub mod error;
pub mod extract;
pub mod routes;
pub mod status;
pub mod tls;
pub mod vdisks;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{delete, get, post, put};
use utoipa::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};

use crate::error::ApiError;

/// The largest request body accepted, in bytes.
pub const BODY_BYTES_MAX: usize = 64 * 1024;

/// What every handler sees.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The farm.
    pub farm: Arc<farm::Farm>,
    /// The server this API runs in, when it is one of the farm's servers (its store path
    /// overrides apply to the sessions it grants).
    pub server_id: Option<i64>,
}

/// The OpenAPI document.
#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "Ferry farm API", description = "Manage a Ferry farm: sites, servers, \
        stores, device collections, devices, vDisks and their versions; device login."),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    paths(
        routes::get_farm, routes::patch_farm, routes::list_audit,
        routes::list_tokens, routes::create_token, routes::delete_token,
        routes::list_sites, routes::create_site, routes::get_site, routes::delete_site,
        routes::list_servers, routes::register_server, routes::get_server, routes::patch_server, routes::delete_server, routes::heartbeat,
        routes::list_stores, routes::create_store, routes::get_store, routes::delete_store,
        routes::list_store_paths, routes::set_store_path,
        routes::list_collections, routes::create_collection, routes::get_collection,
        routes::delete_collection,
        routes::list_devices, routes::create_device, routes::get_device, routes::patch_device,
        routes::delete_device, routes::reset_device_credential,
        routes::list_sessions, routes::end_session, routes::login_challenge, routes::login,
        routes::login_tpm,
        vdisks::list_vdisks, vdisks::create_vdisk, vdisks::get_vdisk, vdisks::patch_vdisk,
        vdisks::delete_vdisk, vdisks::list_versions, vdisks::new_version, vdisks::get_version,
        vdisks::promote, vdisks::revert, vdisks::delete_version, vdisks::merge,
        status::status, status::report, device_session::end,
        boot_sets::get_boot_set, boot_sets::clear_boot_set, boot_sets::device_boot_set,
    ),
    components(schemas(error::ErrorBody, status::ReportAnswer, boot_sets::BootSetInfo,
        contract::boot_set::BootSetRequest))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route")
}

/// The API's routes under `/api/v1`, with `state`.
pub fn router(state: AppState) -> Router {
    use routes as r;
    use vdisks as v;
    let api = Router::new()
        .route("/openapi.json", get(openapi_json))
        .route("/farm", get(r::get_farm).patch(r::patch_farm))
        .route("/audit", get(r::list_audit))
        .route("/tokens", get(r::list_tokens).post(r::create_token))
        .route("/tokens/{id}", delete(r::delete_token))
        .route("/sites", get(r::list_sites).post(r::create_site))
        .route("/sites/{id}", get(r::get_site).delete(r::delete_site))
        .route("/servers", get(r::list_servers).post(r::register_server))
        .route(
            "/servers/{id}",
            get(r::get_server)
                .patch(r::patch_server)
                .delete(r::delete_server),
        )
        .route("/servers/{id}/heartbeat", post(r::heartbeat))
        .route("/stores", get(r::list_stores).post(r::create_store))
        .route("/stores/{id}", get(r::get_store).delete(r::delete_store))
        .route("/stores/{id}/paths", get(r::list_store_paths))
        .route("/stores/{id}/paths/{server_id}", put(r::set_store_path))
        .route(
            "/collections",
            get(r::list_collections).post(r::create_collection),
        )
        .route(
            "/collections/{id}",
            get(r::get_collection).delete(r::delete_collection),
        )
        .route("/devices", get(r::list_devices).post(r::create_device))
        .route(
            "/devices/{id}",
            get(r::get_device)
                .patch(r::patch_device)
                .delete(r::delete_device),
        )
        .route("/devices/{id}/credential", post(r::reset_device_credential))
        .route("/sessions", get(r::list_sessions))
        .route("/sessions/{id}", delete(r::end_session))
        .route("/login/challenge", post(r::login_challenge))
        .route("/login", post(r::login))
        .route("/login/tpm", post(r::login_tpm))
        .route("/vdisks", get(v::list_vdisks).post(v::create_vdisk))
        .route(
            "/vdisks/{id}",
            get(v::get_vdisk)
                .patch(v::patch_vdisk)
                .delete(v::delete_vdisk),
        )
        .route(
            "/vdisks/{id}/versions",
            get(v::list_versions).post(v::new_version),
        )
        .route(
            "/vdisks/{id}/versions/{number}",
            get(v::get_version).delete(v::delete_version),
        )
        .route("/vdisks/{id}/versions/{number}/promote", post(v::promote))
        .route("/vdisks/{id}/versions/{number}/revert", post(v::revert))
        .route("/vdisks/{id}/merge", post(v::merge))
        .route(
            "/vdisks/{id}/versions/{number}/boot-set",
            get(boot_sets::get_boot_set).delete(boot_sets::clear_boot_set),
        )
        .route("/device/boot-set", post(boot_sets::device_boot_set))
        .route("/device/session/end", post(device_session::end))
        .merge(status::routes())
        .fallback(not_found)
        .with_state(state);
    Router::new()
        .nest("/api/v1", api)
        .merge(console::router())
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(BODY_BYTES_MAX))
}

/// How one HTTP listener is bounded: its gate (connections, per address) and its
/// timeouts (TLS handshake, request head, stalled reads and writes).
#[derive(Debug, Clone)]
pub struct Listen {
    /// The listener's gate.
    pub gate: Arc<budget::Gate>,
    /// Its timeouts.
    pub limits: budget::http::HttpLimits,
}

impl Listen {
    /// The API's defaults: [`budget::files::API_CONNECTIONS_MAX`] connections,
    /// [`budget::API_PER_ADDRESS_MAX`] per address (loopback included), default timeouts.
    pub fn api_default() -> Listen {
        Listen::api(
            budget::files::API_CONNECTIONS_MAX,
            budget::API_PER_ADDRESS_MAX,
            budget::http::HttpLimits::default(),
        )
    }

    /// The API's listener with these caps and timeouts.
    pub fn api(
        connections_max: usize,
        per_address_max: usize,
        limits: budget::http::HttpLimits,
    ) -> Listen {
        Listen {
            gate: budget::Gate::new(budget::GateConfig {
                name: "api",
                connections_max,
                per_address_max,
                loopback_exempt: false,
                evict_for_newcomers: true,
            }),
            limits,
        }
    }
}

/// Serves [`router`] in plain HTTP on `listener` until `shutdown` completes. Only on a
/// loopback address (see [`tls::check_plain_listen`]); use [`serve_tls`] for any other.
///
/// # Errors
/// I/O errors of the listener; `PermissionDenied` ([`tls::PlainHttpRefused`]) when the
/// listener is not on a loopback address.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_in(listener, state, None, Listen::api_default(), shutdown).await
}

/// Serves [`router`] over HTTPS with `tls` until `shutdown` completes; connections still
/// open then finish their requests first.
///
/// # Errors
/// I/O errors of the listener.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    state: AppState,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_in(listener, state, Some(tls), Listen::api_default(), shutdown).await
}

/// [`serve_tls`] with `tls`, else [`serve`] (plain HTTP, loopback only).
///
/// # Errors
/// As theirs.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: AppState,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_in(listener, state, tls, Listen::api_default(), shutdown).await
}

/// Serves [`router`] on `listener` behind `listen`'s gate and timeouts
/// ([`budget::http::serve`]): over HTTPS with `tls`, else in plain HTTP on a loopback
/// address only.
///
/// # Errors
/// The listener's address cannot be read; `PermissionDenied` ([`tls::PlainHttpRefused`])
/// for plain HTTP off loopback.
pub async fn serve_in(
    listener: tokio::net::TcpListener,
    state: AppState,
    tls: Option<Arc<rustls::ServerConfig>>,
    listen: Listen,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if tls.is_none() {
        tls::check_plain_listen(listener.local_addr()?)?;
    }
    let app = router(state);
    budget::http::serve(listener, app, listen.gate, listen.limits, tls, shutdown).await;
    Ok(())
}
