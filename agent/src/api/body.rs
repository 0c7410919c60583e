//! One shape for every refusal: request bodies, paths and queries read by extractors whose
//! rejections are [`ApiError`]s (`{"error": {"code", "message"}}`), never axum's plain text; a
//! body must be a JSON object (serde would take an array for a struct); unknown routes and
//! methods are answered in the same shape.

use super::ApiError;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, Uri};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

/// A JSON object body read into `T`; a refusal names the field (`deltas[1]: ...`).
pub struct Object<T>(pub T);

/// The most a route's body may hold, in bytes, as [`limited`] sets it: told in a refusal.
#[derive(Clone, Copy)]
pub struct BodyLimit(usize);

/// The layers that limit the bodies of a router's routes to `bytes`: axum's limit, and the
/// number a body over it is refused with (axum's own rejection does not say it).
pub fn limited(bytes: usize) -> (axum::extract::DefaultBodyLimit, axum::Extension<BodyLimit>) {
    (
        axum::extract::DefaultBodyLimit::max(bytes),
        axum::Extension(BodyLimit(bytes)),
    )
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Object<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        // The body's text, checked as `Json` checks it (its content type, its size, its syntax),
        // is read into `T` at once: no tree of values built and dropped on the way (a tenth of
        // an agent's instructions per observation went to that tree).
        let limit = request.extensions().get::<BodyLimit>().copied();
        let read = axum::Json::<Box<RawValue>>::from_request(request, state).await;
        let axum::Json(raw) = read.map_err(|rejection| match limit {
            Some(BodyLimit(bytes)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "PAYLOAD_TOO_LARGE",
                    format!("the body is larger than the {bytes} bytes this route takes"),
                )
            }
            _ => ApiError::from(rejection),
        })?;
        let text = raw.get();
        if !text.starts_with('{') {
            return Err(ApiError::bad_request(format!(
                "expected a JSON object, got {}",
                kind(text)
            )));
        }
        // The field's path is tracked only to name it in a refusal: read again for that.
        serde_json::from_str(text).map(Object).map_err(|first| {
            let mut read = serde_json::Deserializer::from_str(text);
            match serde_path_to_error::deserialize::<_, T>(&mut read) {
                Err(error) => ApiError::bad_request(named(&error)),
                // Never so for the bodies read here (one value, nothing after it); said as
                // serde_json says it, if it ever is.
                Ok(_) => ApiError::bad_request(first.to_string()),
            }
        })
    }
}

/// Path parameters; a refusal names what was expected.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

/// `404 UNKNOWN_ROUTE`, for a path nothing serves.
pub async fn unknown_route(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "UNKNOWN_ROUTE",
        format!(
            "nothing serves {method} {}; agent/openapi.yaml lists the routes",
            uri.path()
        ),
    )
}

/// `405 METHOD_NOT_ALLOWED`, for a route asked with a method it does not take.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "METHOD_NOT_ALLOWED",
        format!("{} does not take {method}", uri.path()),
    )
}

/// The refusal's text: the field's path and what was wrong with it. Without the reader's " at
/// line L column C": it counts from the value, not from the body's first byte.
fn named(error: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = error.path().to_string();
    let inner = error.inner();
    let said = inner.to_string();
    let position = format!(" at line {} column {}", inner.line(), inner.column());
    let said = said.strip_suffix(&position).unwrap_or(&said);
    if path == "." {
        said.to_owned()
    } else {
        format!("{path}: {said}")
    }
}

/// What the JSON value `text` (well-formed) is, from its first character.
fn kind(text: &str) -> &'static str {
    match text.as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}
