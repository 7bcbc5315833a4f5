//! Errors of the API as HTTP answers: a status and `{"error": "message"}`. The mapping from
//! the farm's [`farm::Kind`] to a status lives here and nowhere else.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use contract::ErrorChain;
use serde::{Deserialize, Serialize};
use utoipa::{IntoResponses, ToSchema};

/// The `Retry-After` of a 503 (the farm database is down): seconds.
const RETRY_AFTER_SECS: &str = "10";

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong, lowercase, for a person.
    pub error: String,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// The status.
    pub status: StatusCode,
    /// The message.
    pub message: String,
}

/// The result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        r
    }
}

impl From<farm::FarmError> for ApiError {
    fn from(e: farm::FarmError) -> ApiError {
        let status = match e.kind() {
            farm::Kind::InvalidInput => StatusCode::BAD_REQUEST,
            farm::Kind::NotFound => StatusCode::NOT_FOUND,
            farm::Kind::Conflict => StatusCode::CONFLICT,
            farm::Kind::Unauthenticated => StatusCode::UNAUTHORIZED,
            farm::Kind::Forbidden => StatusCode::FORBIDDEN,
            farm::Kind::LimitReached => StatusCode::TOO_MANY_REQUESTS,
            farm::Kind::Bucket => StatusCode::BAD_GATEWAY,
            farm::Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        // An outage of the database is logged once by the farm, not once per request.
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(error = %ErrorChain(&e), "request failed");
        }
        ApiError::new(status, e.message())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        let status = match &r {
            JsonRejection::JsonDataError(_) => StatusCode::UNPROCESSABLE_ENTITY,
            JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            JsonRejection::BytesRejection(_) => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, r.body_text().to_lowercase())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, r.body_text().to_lowercase())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, r.body_text().to_lowercase())
    }
}

/// The error answers every route may give, for the OpenAPI document.
#[derive(Debug, IntoResponses)]
pub enum Errors {
    /// Malformed input: bad JSON, a bad path or query parameter, a bad value.
    #[response(status = 400, description = "malformed input")]
    BadRequest(ErrorBody),
    /// No or an unknown token.
    #[response(status = 401, description = "missing or unknown token")]
    Unauthorized(ErrorBody),
    /// The token's role may not do this.
    #[response(status = 403, description = "the token's role may not do this")]
    Forbidden(ErrorBody),
    /// No object with that id.
    #[response(status = 404, description = "no such object")]
    NotFound(ErrorBody),
    /// A forbidden transition, a duplicate, or an object in use.
    #[response(status = 409, description = "conflicts with the state")]
    Conflict(ErrorBody),
    /// The body is not JSON.
    #[response(status = 415, description = "the body is not application/json")]
    Unsupported(ErrorBody),
    /// The JSON does not fit the schema.
    #[response(status = 422, description = "the JSON does not fit the schema")]
    Unprocessable(ErrorBody),
    /// A limit was reached.
    #[response(status = 429, description = "a limit was reached")]
    TooMany(ErrorBody),
}
