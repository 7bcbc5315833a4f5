//! Boot sets over the API (issue 21): an operator sees and clears a version's boot set; a
//! logged-in device fetches the set of the version its session boots.
//!
//! ```text
//!   GET    /api/v1/vdisks/{id}/versions/{number}/boot-set   Reader    BootSetInfo | 404
//!   DELETE /api/v1/vdisks/{id}/versions/{number}/boot-set   Operator  204 (audited)
//!   POST   /api/v1/device/boot-set  BootSetRequest          session   octet-stream | 204
//! ```
//!
//! The sets are recorded by the servers and kept in the farm (`farm::boot_sets`); the API
//! decodes nothing but the summary it answers with.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use contract::ExportName;
use contract::boot_set::{BOOT_SET_CONTENT_TYPE, BootSetRequest};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::error::{ApiError, ApiResult, Errors};
use crate::extract::{ApiJson, ApiPath, Operator, Reader};

/// A version's boot set, summarised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BootSetInfo {
    /// The vDisk's id.
    pub vdisk_id: i64,
    /// The version number.
    pub number: i64,
    /// Boots merged into the set.
    pub boots: i64,
    /// Its extents (runs of blocks, in boot order).
    pub extents: i64,
    /// Its 4 KiB blocks.
    pub blocks: i64,
    /// The bytes it covers.
    pub bytes: i64,
    /// Its encoded size.
    pub encoded_bytes: i64,
    /// When a server last saved it (ms since the epoch).
    pub recorded_at_ms: i64,
}

/// A version's boot set.
#[utoipa::path(get, path = "/api/v1/vdisks/{id}/versions/{number}/boot-set", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id"),
           ("number" = i64, Path, description = "version number")),
    responses((status = 200, body = BootSetInfo), Errors))]
pub async fn get_boot_set(
    _: Reader,
    State(s): State<AppState>,
    ApiPath((id, n)): ApiPath<(i64, i64)>,
) -> ApiResult<Json<BootSetInfo>> {
    let (summary, encoded) = s.farm.boot_set(id, n).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("vdisk {id} version {n} has no boot set yet"),
        )
    })?;
    let blocks = bootset::BootSet::decode(&encoded).map_or(0, |b| b.pages());
    Ok(Json(BootSetInfo {
        vdisk_id: id,
        number: n,
        boots: summary.boots,
        extents: summary.extents,
        blocks: i64::try_from(blocks).unwrap_or(i64::MAX),
        bytes: summary.bytes,
        encoded_bytes: i64::try_from(encoded.len()).unwrap_or(i64::MAX),
        recorded_at_ms: summary.recorded_at_ms,
    }))
}

/// Clears a version's boot set: the next boots record a new one.
#[utoipa::path(delete, path = "/api/v1/vdisks/{id}/versions/{number}/boot-set", tag = "versions",
    params(("id" = i64, Path, description = "vdisk id"),
           ("number" = i64, Path, description = "version number")),
    responses((status = 204, description = "cleared (or there was none)"), Errors))]
pub async fn clear_boot_set(
    Operator(c): Operator,
    State(s): State<AppState>,
    ApiPath((id, n)): ApiPath<(i64, i64)>,
) -> ApiResult<StatusCode> {
    s.farm.clear_boot_set(id, n, &c.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The boot set of the version a device's session boots: the body names the session by its
/// export name (no API token, as for status reports).
#[utoipa::path(post, path = "/api/v1/device/boot-set", tag = "status",
    request_body = BootSetRequest, security(()),
    responses((status = 200, description = "the encoded boot set", content_type = "application/octet-stream"),
        (status = 204, description = "the version has no boot set yet"), Errors))]
pub async fn device_boot_set(
    State(s): State<AppState>,
    ApiJson(r): ApiJson<BootSetRequest>,
) -> ApiResult<Response> {
    let unknown = || ApiError::new(StatusCode::UNAUTHORIZED, "no live session of that name");
    if !matches!(r.export_name.parse(), Ok(ExportName::Session(_))) {
        return Err(unknown());
    }
    let session = s
        .farm
        .session_by_export(&r.export_name)
        .await?
        .ok_or_else(unknown)?;
    match s
        .farm
        .boot_set(session.vdisk_id, session.version_number)
        .await?
    {
        Some((_, encoded)) => {
            Ok(([(header::CONTENT_TYPE, BOOT_SET_CONTENT_TYPE)], encoded).into_response())
        }
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}
