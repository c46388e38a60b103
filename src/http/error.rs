//! Errors as HTTP responses: one place maps every store error to the status
//! and code an S3 client would expect, with a message a person can act on.

use http::StatusCode;

use crate::store::StoreError;

/// An error answer: status, S3-style code, message.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The methods the resource takes, for a 405's `Allow`.
    pub allow: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), allow: None }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "InvalidRequest", message)
    }

    pub fn access_denied(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "AccessDenied", message)
    }

    /// 405, naming the methods that are allowed (RFC 9110 section 15.5.6).
    pub fn method_not_allowed(method: &http::Method, allow: &'static str) -> ApiError {
        let mut e =
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", format!("{method} is not allowed here"));
        e.allow = Some(allow);
        e
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        use StatusCode as S;
        let (status, code) = match &e {
            StoreError::InvalidBucketName(_) => (S::BAD_REQUEST, "InvalidBucketName"),
            StoreError::InvalidKey(_) | StoreError::KeyTooLong(_) => (S::BAD_REQUEST, "InvalidKey"),
            StoreError::NoSuchBucket(_) => (S::NOT_FOUND, "NoSuchBucket"),
            StoreError::NoSuchKey(_) => (S::NOT_FOUND, "NoSuchKey"),
            StoreError::NoSuchBlob(_) => (S::NOT_FOUND, "NoSuchBlob"),
            StoreError::BucketExists(_) => (S::CONFLICT, "BucketAlreadyOwnedByYou"),
            StoreError::BucketNotEmpty(_) => (S::CONFLICT, "BucketNotEmpty"),
            StoreError::PreconditionFailed => (S::PRECONDITION_FAILED, "PreconditionFailed"),
            StoreError::MetadataTooLarge(_) => (S::BAD_REQUEST, "MetadataTooLarge"),
            StoreError::HeadersTooLarge(_) => (S::BAD_REQUEST, "RequestHeaderSectionTooLarge"),
            StoreError::NoSuchUpload(_) => (S::NOT_FOUND, "NoSuchUpload"),
            StoreError::InvalidPart(_) => (S::BAD_REQUEST, "InvalidPart"),
            StoreError::InvalidPartOrder => (S::BAD_REQUEST, "InvalidPartOrder"),
            StoreError::EntityTooSmall(_) => (S::BAD_REQUEST, "EntityTooSmall"),
            StoreError::EntityTooLarge(_) => (S::BAD_REQUEST, "EntityTooLarge"),
            StoreError::BadDigest { .. } => (S::BAD_REQUEST, "BadDigest"),
            StoreError::IncompleteBody { .. } | StoreError::Body(_) => (S::BAD_REQUEST, "IncompleteBody"),
            StoreError::BadRequest(_) => (S::BAD_REQUEST, "InvalidRequest"),
            StoreError::InvalidArgument(_) => (S::BAD_REQUEST, "InvalidArgument"),
            StoreError::NoSpace | StoreError::LowSpace(_) => (S::INSUFFICIENT_STORAGE, "InsufficientStorage"),
            StoreError::WritesDisabled(_) | StoreError::Unavailable(_) => {
                (S::SERVICE_UNAVAILABLE, "ServiceUnavailable")
            }
            _ => (S::INTERNAL_SERVER_ERROR, "InternalError"),
        };
        if status.is_server_error() {
            tracing::error!(code, "{e}");
        }
        ApiError::new(status, code, e.to_string())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
