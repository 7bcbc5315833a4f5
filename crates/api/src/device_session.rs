//! A device ends its own session (issue 31): the boot agent of a machine that shuts down
//! cleanly says so once the machine's last write is done (systemd's shutdown hook), so the
//! farm need not wait for the session to go silent: a maintenance version is promotable
//! as soon as its machine is off. The body names the session by its export name, the
//! session's secret, as status reports do (no API token).
//!
//! ```text
//!   machine: poweroff ─► systemd-shutdown: root read-only ─► hook ─► boot agent
//!   boot agent ── POST /api/v1/device/session/end {export_name} ──► Farm::end_session_by_export
//! ```

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use contract::ExportName;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::error::{ApiError, ApiResult, Errors};
use crate::extract::ApiJson;

/// The session a device ends.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionEnd {
    /// The session's export name, as login gave it (`ferry-s-…`): the credential.
    pub export_name: String,
}

/// What was ended.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionEnded {
    /// The session's id.
    pub session_id: String,
    /// The version it booted.
    pub version: i64,
}

/// Ends the session the body names: its machine shut down cleanly.
#[utoipa::path(post, path = "/api/v1/device/session/end", tag = "status",
    request_body = SessionEnd, security(()),
    responses((status = 200, body = SessionEnded), Errors))]
pub async fn end(
    State(s): State<AppState>,
    ApiJson(r): ApiJson<SessionEnd>,
) -> ApiResult<Json<SessionEnded>> {
    let unknown = || ApiError::new(StatusCode::UNAUTHORIZED, "no live session of that name");
    if !matches!(r.export_name.parse(), Ok(ExportName::Session(_))) {
        return Err(unknown());
    }
    match s.farm.end_session_by_export(&r.export_name).await {
        Ok(session) => {
            tracing::info!(session = %session.id, device = session.device_id,
                "session ended by its machine (clean shutdown)");
            Ok(Json(SessionEnded {
                session_id: session.id,
                version: session.version_number,
            }))
        }
        Err(e) if e.kind() == farm::Kind::NotFound => Err(unknown()),
        Err(e) => Err(e.into()),
    }
}
