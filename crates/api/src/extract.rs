//! Extractors: JSON, query and path whose rejections are [`ApiError`]s (JSON bodies, right
//! statuses), and the bearer-token callers [`Reader`], [`Operator`], [`Admin`].

use axum::extract::{FromRequest, FromRequestParts};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use farm::model::Role;

use crate::AppState;
use crate::error::ApiError;

/// A JSON body.
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// A query string.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// Path parameters.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// Who made a request: the token's name (the actor in the audit log) and role.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

async fn caller(parts: &Parts, state: &AppState, needed: Role) -> Result<Caller, ApiError> {
    let header = parts
        .headers
        .get(AUTHORIZATION)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "missing bearer token"))?;
    let secret = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authorization must be 'Bearer TOKEN'",
            )
        })?;
    let token = state
        .farm
        .authenticate(secret)
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unknown token"))?;
    if !token.role.allows(needed) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("a {} token may not do this; {needed} is needed", token.role),
        ));
    }
    Ok(Caller {
        name: token.name,
        role: token.role,
    })
}

macro_rules! role_extractor {
    ($(#[$m:meta])* $name:ident, $role:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone)]
        pub struct $name(pub Caller);

        impl FromRequestParts<AppState> for $name {
            type Rejection = ApiError;

            async fn from_request_parts(
                parts: &mut Parts,
                state: &AppState,
            ) -> Result<Self, Self::Rejection> {
                caller(parts, state, $role).await.map($name)
            }
        }
    };
}

role_extractor!(
    /// A caller with any valid token.
    Reader,
    Role::ReadOnly
);
role_extractor!(
    /// A caller with an operator or admin token.
    Operator,
    Role::Operator
);
role_extractor!(
    /// A caller with an admin token.
    Admin,
    Role::Admin
);
