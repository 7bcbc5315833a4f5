//! The vDisk and version handlers (the lifecycle).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use farm::input::{MergeRequest, NewVDisk, VDiskPatch};
use farm::model::{Page, VDisk, Version};

use crate::AppState;
use crate::error::{ApiResult, Errors};
use crate::extract::{ApiJson, ApiPath, ApiQuery, Operator, Reader};
use crate::routes::{PageQuery, VersionList};

/// vDisks.
#[utoipa::path(get, path = "/api/v1/vdisks", tag = "vdisks", params(PageQuery),
    responses((status = 200, body = Page<VDisk>), Errors))]
pub async fn list_vdisks(
    _: Reader,
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<VDisk>>> {
    Ok(Json(s.farm.list_vdisks(q.limit, q.offset).await?))
}

/// Adds a vDisk: imports NAME.vhdx from the store, or creates it with `size_bytes`.
#[utoipa::path(post, path = "/api/v1/vdisks", tag = "vdisks", request_body = NewVDisk,
    responses((status = 201, body = VDisk), Errors))]
pub async fn create_vdisk(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiJson(b): ApiJson<NewVDisk>,
) -> ApiResult<(StatusCode, Json<VDisk>)> {
    Ok((
        StatusCode::CREATED,
        Json(s.farm.create_vdisk(&b, &c.name).await?),
    ))
}

/// One vDisk.
#[utoipa::path(get, path = "/api/v1/vdisks/{id}", tag = "vdisks",
    params(("id" = i64, Path, description = "vdisk id")),
    responses((status = 200, body = VDisk), Errors))]
pub async fn get_vdisk(
    _: Reader,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<VDisk>> {
    Ok(Json(s.farm.vdisk(id).await?))
}

/// Changes a vDisk's properties.
#[utoipa::path(patch, path = "/api/v1/vdisks/{id}", tag = "vdisks",
    params(("id" = i64, Path, description = "vdisk id")), request_body = VDiskPatch,
    responses((status = 200, body = VDisk), Errors))]
pub async fn patch_vdisk(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiJson(b): ApiJson<VDiskPatch>,
) -> ApiResult<Json<VDisk>> {
    Ok(Json(s.farm.update_vdisk(id, &b, &c.name).await?))
}

/// Removes a vDisk from the farm (its files stay).
#[utoipa::path(delete, path = "/api/v1/vdisks/{id}", tag = "vdisks",
    params(("id" = i64, Path, description = "vdisk id")),
    responses((status = 204, description = "deleted"), Errors))]
pub async fn delete_vdisk(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    s.farm.delete_vdisk(id, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The versions of a vDisk, oldest first.
#[utoipa::path(get, path = "/api/v1/vdisks/{id}/versions", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id")),
    responses((status = 200, body = VersionList), Errors))]
pub async fn list_versions(
    _: Reader,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<VersionList>> {
    Ok(Json(VersionList {
        items: s.farm.versions(id).await?,
    }))
}

/// `new`: a new version NAME.N.avhdx on the newest, in maintenance.
#[utoipa::path(post, path = "/api/v1/vdisks/{id}/versions", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id")),
    responses((status = 201, body = Version), Errors))]
pub async fn new_version(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<(StatusCode, Json<Version>)> {
    Ok((
        StatusCode::CREATED,
        Json(s.farm.new_version(id, &c.name).await?),
    ))
}

/// One version.
#[utoipa::path(get, path = "/api/v1/vdisks/{id}/versions/{number}", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id"),
           ("number" = i64, Path, description = "version number")),
    responses((status = 200, body = Version), Errors))]
pub async fn get_version(
    _: Reader,
    State(s): State<AppState>,
    ApiPath((id, n)): ApiPath<(i64, i64)>,
) -> ApiResult<Json<Version>> {
    Ok(Json(s.farm.version(id, n).await?))
}

/// `promote`: maintenance → test → production.
#[utoipa::path(post, path = "/api/v1/vdisks/{id}/versions/{number}/promote", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id"),
           ("number" = i64, Path, description = "version number")),
    responses((status = 200, body = Version), Errors))]
pub async fn promote(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath((id, n)): ApiPath<(i64, i64)>,
) -> ApiResult<Json<Version>> {
    Ok(Json(s.farm.promote(id, n, &c.name).await?))
}

/// `revert`: one step back, while no device of the higher type is booted from it.
#[utoipa::path(post, path = "/api/v1/vdisks/{id}/versions/{number}/revert", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id"),
           ("number" = i64, Path, description = "version number")),
    responses((status = 200, body = Version), Errors))]
pub async fn revert(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath((id, n)): ApiPath<(i64, i64)>,
) -> ApiResult<Json<Version>> {
    Ok(Json(s.farm.revert(id, n, &c.name).await?))
}

/// `delete`: the newest version only, when no device boots it or is pinned to it.
#[utoipa::path(delete, path = "/api/v1/vdisks/{id}/versions/{number}", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id"),
           ("number" = i64, Path, description = "version number")),
    responses((status = 204, description = "deleted"), Errors))]
pub async fn delete_version(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath((id, n)): ApiPath<(i64, i64)>,
) -> ApiResult<StatusCode> {
    s.farm.delete_version(id, n, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `merge`: merged updates or merged base of the newest chain, as a new version.
#[utoipa::path(post, path = "/api/v1/vdisks/{id}/merge", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id")), request_body = MergeRequest,
    responses((status = 201, body = Version), Errors))]
pub async fn merge(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiJson(b): ApiJson<MergeRequest>,
) -> ApiResult<(StatusCode, Json<Version>)> {
    Ok((
        StatusCode::CREATED,
        Json(s.farm.merge(id, &b, &c.name).await?),
    ))
}
