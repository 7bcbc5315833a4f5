//! The handlers: parse (extractors) → call the farm → render JSON. Each carries its
//! OpenAPI description; [`crate::ApiDoc`] lists them all.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use farm::credentials::DeviceCredential;
use farm::input::{
    DevicePatch, NewCollection, NewDevice, NewServer, NewSite, NewStore, NewToken, ServerPatch,
    SettingsPatch, StorePath,
};
use farm::login::{Challenge, ChallengeRequest, DeviceTls, LoginGrant, LoginRequest, LoginServer};
use farm::model::{
    AccessMode, AuditEntry, CacheMode, Collection, Device, FarmSettings, Page, Role, Server,
    Session, Site, Store, StorePathOverride, Token, Version,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AppState;
use crate::error::{ApiResult, Errors};
use crate::extract::{Admin, ApiJson, ApiPath, ApiQuery, Operator, Reader};

/// Paging of a list.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Items to skip (default 0).
    #[param(minimum = 0)]
    pub offset: Option<i64>,
}

/// Paging of the device list, with an optional collection filter.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeviceQuery {
    /// Only the devices of this collection.
    pub collection_id: Option<i64>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Items to skip (default 0).
    #[param(minimum = 0)]
    pub offset: Option<i64>,
}

/// A token made: its secret (shown once) and its public part.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NewTokenAnswer {
    /// The secret: `Authorization: Bearer SECRET`.
    pub secret: String,
    /// The token.
    pub token: Token,
}

/// The versions of a vDisk, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionList {
    /// The versions.
    pub items: Vec<Version>,
}

/// The per-server paths of a store.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StorePathList {
    /// The overrides.
    pub items: Vec<StorePathOverride>,
}

type Created<T> = (StatusCode, Json<T>);

fn created<T>(t: T) -> Created<T> {
    (StatusCode::CREATED, Json(t))
}

// ---- farm, tokens, audit ---------------------------------------------------------------

/// The farm settings.
#[utoipa::path(get, path = "/api/v1/farm", tag = "farm",
    responses((status = 200, body = FarmSettings), Errors))]
pub async fn get_farm(_: Reader, State(s): State<AppState>) -> ApiResult<Json<FarmSettings>> {
    Ok(Json(s.farm.settings().await?))
}

/// Changes the farm settings.
#[utoipa::path(patch, path = "/api/v1/farm", tag = "farm", request_body = SettingsPatch,
    responses((status = 200, body = FarmSettings), Errors))]
pub async fn patch_farm(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiJson(p): ApiJson<SettingsPatch>,
) -> ApiResult<Json<FarmSettings>> {
    Ok(Json(s.farm.update_settings(&p, &c.name).await?))
}

/// API tokens (never their secrets).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", params(PageQuery),
    responses((status = 200, body = Page<Token>), Errors))]
pub async fn list_tokens(
    _: Admin,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<Token>>> {
    Ok(Json(s.farm.list_tokens(q.limit, q.offset).await?))
}

/// Makes an API token; the answer holds its secret, shown only this once.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens", request_body = NewToken,
    responses((status = 201, body = NewTokenAnswer), Errors))]
pub async fn create_token(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiJson(t): ApiJson<NewToken>,
) -> ApiResult<Created<NewTokenAnswer>> {
    let (secret, token) = s.farm.create_token(&t, &c.name).await?;
    Ok(created(NewTokenAnswer { secret, token }))
}

/// Deletes an API token.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tokens",
    params(("id" = i64, Path, description = "token id")),
    responses((status = 204, description = "deleted"), Errors))]
pub async fn delete_token(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    s.farm.delete_token(id, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The audit log, newest first.
#[utoipa::path(get, path = "/api/v1/audit", tag = "farm", params(PageQuery),
    responses((status = 200, body = Page<AuditEntry>), Errors))]
pub async fn list_audit(
    _: Reader,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<AuditEntry>>> {
    Ok(Json(s.farm.list_audit(q.limit, q.offset).await?))
}

// ---- sites and servers -----------------------------------------------------------------

/// Sites.
#[utoipa::path(get, path = "/api/v1/sites", tag = "sites", params(PageQuery),
    responses((status = 200, body = Page<Site>), Errors))]
pub async fn list_sites(
    _: Reader,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<Site>>> {
    Ok(Json(s.farm.list_sites(q.limit, q.offset).await?))
}

/// Creates a site.
#[utoipa::path(post, path = "/api/v1/sites", tag = "sites", request_body = NewSite,
    responses((status = 201, body = Site), Errors))]
pub async fn create_site(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiJson(b): ApiJson<NewSite>,
) -> ApiResult<Created<Site>> {
    Ok(created(s.farm.create_site(&b, &c.name).await?))
}

/// One site.
#[utoipa::path(get, path = "/api/v1/sites/{id}", tag = "sites",
    params(("id" = i64, Path, description = "site id")),
    responses((status = 200, body = Site), Errors))]
pub async fn get_site(
    _: Reader,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Site>> {
    Ok(Json(s.farm.site(id).await?))
}

/// Deletes a site without servers and collections.
#[utoipa::path(delete, path = "/api/v1/sites/{id}", tag = "sites",
    params(("id" = i64, Path, description = "site id")),
    responses((status = 204, description = "deleted"), Errors))]
pub async fn delete_site(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    s.farm.delete_site(id, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Servers.
#[utoipa::path(get, path = "/api/v1/servers", tag = "servers", params(PageQuery),
    responses((status = 200, body = Page<Server>), Errors))]
pub async fn list_servers(
    _: Reader,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<Server>>> {
    Ok(Json(s.farm.list_servers(q.limit, q.offset).await?))
}

/// Registers a server: by its uid (a name another uid holds is refused, 409), or, without
/// one, by its name.
#[utoipa::path(post, path = "/api/v1/servers", tag = "servers", request_body = NewServer,
    responses((status = 200, body = Server), Errors))]
pub async fn register_server(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiJson(b): ApiJson<NewServer>,
) -> ApiResult<Json<Server>> {
    Ok(Json(s.farm.register_server(&b, &c.name).await?))
}

/// One server.
#[utoipa::path(get, path = "/api/v1/servers/{id}", tag = "servers",
    params(("id" = i64, Path, description = "server id")),
    responses((status = 200, body = Server), Errors))]
pub async fn get_server(
    _: Reader,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Server>> {
    Ok(Json(s.farm.server(id).await?))
}

/// Changes a server's rating or draining flag (load balancing at login).
#[utoipa::path(patch, path = "/api/v1/servers/{id}", tag = "servers",
    params(("id" = i64, Path, description = "server id")), request_body = ServerPatch,
    responses((status = 200, body = Server), Errors))]
pub async fn patch_server(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiJson(b): ApiJson<ServerPatch>,
) -> ApiResult<Json<Server>> {
    Ok(Json(s.farm.set_server(id, &b, &c.name).await?))
}

/// Removes a server that is gone (no heartbeat for a minute; a running one is refused,
/// 409): it leaves every device's server list.
#[utoipa::path(delete, path = "/api/v1/servers/{id}", tag = "servers",
    params(("id" = i64, Path, description = "server id")),
    responses((status = 204, description = "removed"), Errors))]
pub async fn delete_server(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    s.farm.remove_server(id, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A server's heartbeat.
#[utoipa::path(post, path = "/api/v1/servers/{id}/heartbeat", tag = "servers",
    params(("id" = i64, Path, description = "server id")),
    responses((status = 200, body = Server), Errors))]
pub async fn heartbeat(
    _: Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Server>> {
    Ok(Json(s.farm.heartbeat(id).await?))
}

// ---- stores ----------------------------------------------------------------------------

/// Stores.
#[utoipa::path(get, path = "/api/v1/stores", tag = "stores", params(PageQuery),
    responses((status = 200, body = Page<Store>), Errors))]
pub async fn list_stores(
    _: Reader,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<Store>>> {
    Ok(Json(s.farm.list_stores(q.limit, q.offset).await?))
}

/// Creates a store: a directory under the store root (a path that escapes it is refused).
#[utoipa::path(post, path = "/api/v1/stores", tag = "stores", request_body = NewStore,
    responses((status = 201, body = Store), Errors))]
pub async fn create_store(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiJson(b): ApiJson<NewStore>,
) -> ApiResult<Created<Store>> {
    Ok(created(s.farm.create_store(&b, &c.name).await?))
}

/// One store.
#[utoipa::path(get, path = "/api/v1/stores/{id}", tag = "stores",
    params(("id" = i64, Path, description = "store id")),
    responses((status = 200, body = Store), Errors))]
pub async fn get_store(
    _: Reader,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Store>> {
    Ok(Json(s.farm.store(id).await?))
}

/// Deletes a store that holds no vDisk (its directory stays).
#[utoipa::path(delete, path = "/api/v1/stores/{id}", tag = "stores",
    params(("id" = i64, Path, description = "store id")),
    responses((status = 204, description = "deleted"), Errors))]
pub async fn delete_store(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    s.farm.delete_store(id, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The per-server paths of a store.
#[utoipa::path(get, path = "/api/v1/stores/{id}/paths", tag = "stores",
    params(("id" = i64, Path, description = "store id")),
    responses((status = 200, body = StorePathList), Errors))]
pub async fn list_store_paths(
    _: Reader,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<StorePathList>> {
    Ok(Json(StorePathList {
        items: s.farm.store_paths(id).await?,
    }))
}

/// Sets the path of a store on one server.
#[utoipa::path(put, path = "/api/v1/stores/{id}/paths/{server_id}", tag = "stores",
    params(("id" = i64, Path, description = "store id"),
           ("server_id" = i64, Path, description = "server id")),
    request_body = StorePath,
    responses((status = 200, body = StorePathOverride), Errors))]
pub async fn set_store_path(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiPath((id, server_id)): ApiPath<(i64, i64)>,
    ApiJson(b): ApiJson<StorePath>,
) -> ApiResult<Json<StorePathOverride>> {
    Ok(Json(
        s.farm.set_store_path(id, server_id, &b, &c.name).await?,
    ))
}

// ---- collections and devices -----------------------------------------------------------

/// Device collections.
#[utoipa::path(get, path = "/api/v1/collections", tag = "collections", params(PageQuery),
    responses((status = 200, body = Page<Collection>), Errors))]
pub async fn list_collections(
    _: Reader,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<Collection>>> {
    Ok(Json(s.farm.list_collections(q.limit, q.offset).await?))
}

/// Creates a device collection.
#[utoipa::path(post, path = "/api/v1/collections", tag = "collections",
    request_body = NewCollection, responses((status = 201, body = Collection), Errors))]
pub async fn create_collection(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiJson(b): ApiJson<NewCollection>,
) -> ApiResult<Created<Collection>> {
    Ok(created(s.farm.create_collection(&b, &c.name).await?))
}

/// One collection.
#[utoipa::path(get, path = "/api/v1/collections/{id}", tag = "collections",
    params(("id" = i64, Path, description = "collection id")),
    responses((status = 200, body = Collection), Errors))]
pub async fn get_collection(
    _: Reader,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Collection>> {
    Ok(Json(s.farm.collection(id).await?))
}

/// Deletes a collection without devices.
#[utoipa::path(delete, path = "/api/v1/collections/{id}", tag = "collections",
    params(("id" = i64, Path, description = "collection id")),
    responses((status = 204, description = "deleted"), Errors))]
pub async fn delete_collection(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    s.farm.delete_collection(id, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Devices, optionally of one collection.
#[utoipa::path(get, path = "/api/v1/devices", tag = "devices", params(DeviceQuery),
    responses((status = 200, body = Page<Device>), Errors))]
pub async fn list_devices(
    _: Reader,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<DeviceQuery>,
) -> ApiResult<Json<Page<Device>>> {
    Ok(Json(
        s.farm
            .list_devices(q.collection_id, q.limit, q.offset)
            .await?,
    ))
}

/// Creates a device.
#[utoipa::path(post, path = "/api/v1/devices", tag = "devices", request_body = NewDevice,
    responses((status = 201, body = Device), Errors))]
pub async fn create_device(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiJson(b): ApiJson<NewDevice>,
) -> ApiResult<Created<Device>> {
    Ok(created(s.farm.create_device(&b, &c.name).await?))
}

/// One device.
#[utoipa::path(get, path = "/api/v1/devices/{id}", tag = "devices",
    params(("id" = i64, Path, description = "device id")),
    responses((status = 200, body = Device), Errors))]
pub async fn get_device(
    _: Reader,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Device>> {
    Ok(Json(s.farm.device(id).await?))
}

/// Changes a device (absent fields stay; `null` clears an override).
#[utoipa::path(patch, path = "/api/v1/devices/{id}", tag = "devices",
    params(("id" = i64, Path, description = "device id")), request_body = DevicePatch,
    responses((status = 200, body = Device), Errors))]
pub async fn patch_device(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiJson(b): ApiJson<DevicePatch>,
) -> ApiResult<Json<Device>> {
    Ok(Json(s.farm.update_device(id, &b, &c.name).await?))
}

/// Deletes a device and its session.
#[utoipa::path(delete, path = "/api/v1/devices/{id}", tag = "devices",
    params(("id" = i64, Path, description = "device id")),
    responses((status = 204, description = "deleted"), Errors))]
pub async fn delete_device(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    s.farm.delete_device(id, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Gives a device a new credential: its next secret, shown once; the old one stops working.
#[utoipa::path(post, path = "/api/v1/devices/{id}/credential", tag = "devices",
    params(("id" = i64, Path, description = "device id")),
    responses((status = 200, body = DeviceCredential), Errors))]
pub async fn reset_device_credential(
    Admin(c): Admin,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<DeviceCredential>> {
    Ok(Json(s.farm.reset_device_credential(id, &c.name).await?))
}

// ---- sessions and login ----------------------------------------------------------------

/// Live device sessions. A token below operator gets them without their export names
/// (`export_name` is empty): a maintenance session's export is writable.
#[utoipa::path(get, path = "/api/v1/sessions", tag = "sessions", params(PageQuery),
    responses((status = 200, body = Page<Session>), Errors))]
pub async fn list_sessions(
    Reader(c): Reader,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<Session>>> {
    let mut page = s.farm.list_sessions(q.limit, q.offset).await?;
    if !c.role.allows(Role::Operator) {
        for x in &mut page.items {
            x.export_name.clear();
        }
    }
    Ok(Json(page))
}

/// Ends a device session.
#[utoipa::path(delete, path = "/api/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "session id")),
    responses((status = 204, description = "ended"), Errors))]
pub async fn end_session(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    s.farm.end_session(&id, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Device login, step 1: a one-time nonce for the device's MAC (no token needed). Each
/// client address holds a few outstanding nonces at most (429 past that), so one address
/// cannot hold every other device's login back.
#[utoipa::path(post, path = "/api/v1/login/challenge", tag = "login",
    request_body = ChallengeRequest, security(()),
    responses((status = 200, body = Challenge), Errors))]
pub async fn login_challenge(
    State(s): State<AppState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    ApiJson(b): ApiJson<ChallengeRequest>,
) -> ApiResult<Json<Challenge>> {
    let peer = peer.map(|axum::Extension(axum::extract::ConnectInfo(p))| p.ip());
    Ok(Json(s.farm.challenge(&b, peer).await?))
}

/// Device login, step 2: the proof, HMAC-SHA256(key, nonce ‖ mac) in hex, under the
/// device's own key; or a diskless machine's one-time login ticket from its boot script
/// (that grant then carries the device's new key, once).
#[utoipa::path(post, path = "/api/v1/login", tag = "login", request_body = LoginRequest,
    security(()), responses((status = 200, body = LoginGrantSchema), Errors))]
pub async fn login(
    State(s): State<AppState>,
    ApiJson(b): ApiJson<LoginRequest>,
) -> ApiResult<Json<LoginGrant>> {
    Ok(Json(s.farm.login(&b, s.server_id).await?))
}

/// A device says it keeps its key in its TPM, proving with that key (a challenge's nonce
/// and HMAC, as at login): the farm then issues and accepts no login ticket for it, until
/// an administrator resets its credential.
#[utoipa::path(post, path = "/api/v1/login/tpm", tag = "login", request_body = LoginRequest,
    security(()), responses((status = 204, description = "bound"), Errors))]
pub async fn login_tpm(
    State(s): State<AppState>,
    ApiJson(b): ApiJson<LoginRequest>,
) -> ApiResult<StatusCode> {
    s.farm.bind_tpm(&b).await?;
    Ok(StatusCode::NO_CONTENT)
}

// The OpenAPI schema of the login answer. The answer itself is `farm::login::LoginGrant`,
// i.e. `contract::login::LoginGrant<Device>`, generic over the device record so that a
// target reads it with only the fields it needs. utoipa names a generic schema
// `LoginGrant_Device` and inlines the device, so the document describes the answer with
// this twin under its old name and shape; `login_grant_schema_has_the_answer_s_fields`
// checks that the two keep the same fields.
/// What a device gets at login.
#[derive(Debug, ToSchema)]
#[schema(as = LoginGrant)]
#[allow(dead_code, reason = "only its OpenAPI schema is used")]
pub struct LoginGrantSchema {
    /// The session's id.
    session_id: String,
    /// The session token (bearer), shown once.
    session_token: String,
    /// The session-scoped NBD export name.
    export_name: String,
    /// When the session ends.
    expires_at_ms: i64,
    /// The device (created now when its collection allows auto-add).
    device: Device,
    /// The servers of its site, alive ones first.
    servers: Vec<LoginServer>,
    /// The vDisk's id.
    vdisk_id: i64,
    /// The vDisk's name.
    vdisk_name: String,
    /// The vDisk's virtual size.
    size_bytes: i64,
    /// The version the device boots.
    version: i64,
    /// When that version was made (Unix ms): a version deleted and made again under its
    /// number has another.
    version_created_at_ms: i64,
    /// That version's access mode.
    access: AccessMode,
    /// Where the device's writes go.
    cache_mode: CacheMode,
    /// The RAM cache size.
    ram_bytes: i64,
    /// True in private mode (maintenance): the export writes to the version itself.
    writable: bool,
    /// The device's new secret (64 hex digits), only in the grant of a ticket login: keep
    /// it; later logins of this boot prove with it.
    device_secret: Option<String>,
    /// The device's client certificate for the NBD servers, when the farm has a CA.
    tls: Option<DeviceTls>,
}

#[cfg(test)]
mod tests {
    use farm::model::{DeviceType, OptCacheMode};
    use utoipa::PartialSchema as _;
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::Schema;

    use super::*;

    fn grant() -> LoginGrant {
        LoginGrant {
            session_id: "s".into(),
            session_token: "fs_1".into(),
            export_name: "ferry-s-00".into(),
            expires_at_ms: 1,
            device: Device {
                id: 1,
                collection_id: 1,
                mac: "aa:bb:cc:00:00:01".into(),
                name: "pc1".into(),
                device_type: DeviceType::Production,
                vdisk_id: Some(1),
                cache_mode: OptCacheMode(None),
                ram_bytes: None,
                pinned_version: None,
                created_at_ms: 1,
                changed_at_ms: 1,
                diskless: farm::model::Flag(false),
            },
            servers: Vec::new(),
            vdisk_id: 1,
            vdisk_name: "golden".into(),
            size_bytes: 512,
            version: 0,
            version_created_at_ms: 0,
            access: AccessMode::Production,
            cache_mode: CacheMode::Ram,
            ram_bytes: 512,
            writable: false,
            device_secret: Some("00".into()),
            tls: Some(DeviceTls {
                ca_pem: String::new(),
                cert_pem: String::new(),
                key_pem: String::new(),
                not_after_ms: 1,
            }),
        }
    }

    #[test]
    fn login_grant_schema_has_the_answer_s_fields() {
        let RefOr::T(Schema::Object(schema)) = LoginGrantSchema::schema() else {
            panic!("the grant's schema is an object");
        };
        let documented: Vec<&String> = schema.properties.keys().collect();
        let json = serde_json::to_value(grant()).unwrap();
        let mut sent: Vec<&String> = json.as_object().unwrap().keys().collect();
        sent.sort();
        assert_eq!(documented, sent);
        // All but the two optional ones (device_secret and tls) are always sent.
        assert_eq!(schema.required.len(), sent.len() - 2);
    }
}
