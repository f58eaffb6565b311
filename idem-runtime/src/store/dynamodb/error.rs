//! How the SDK's failures become [`Error`]s: by the SDK's error variant and the service's error
//! code, never by the text of a message (one exception, the item size limit, which DynamoDB
//! reports only as a `ValidationException` message).

use super::BACKEND;
use crate::error::{Error, StoreErrorKind};
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// The kind of a failed request: the transport's failures by the SDK's variant, the service's
/// by its error code.
pub(super) fn kind_of<E, R>(e: &SdkError<E, R>) -> StoreErrorKind
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    match e {
        SdkError::TimeoutError(_) => StoreErrorKind::Timeout,
        SdkError::DispatchFailure(d) if d.is_timeout() => StoreErrorKind::Timeout,
        // No credentials, or credentials that could not be loaded: the request was never sent.
        SdkError::DispatchFailure(_) if is_credentials_error(e) => StoreErrorKind::Authentication,
        // Connection refused or reset, DNS, TLS; and a response cut off mid-way.
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => StoreErrorKind::Unreachable,
        SdkError::ServiceError(_) => code_kind(e.code().unwrap_or_default(), e.message()),
        // No credentials, no region: the request was never sent.
        SdkError::ConstructionFailure(_) => StoreErrorKind::Authentication,
        _ => StoreErrorKind::Query,
    }
}

/// Whether a credential provider's failure is in the error's chain of sources.
fn is_credentials_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err
            .downcast_ref::<aws_credential_types::provider::error::CredentialsError>()
            .is_some()
        {
            return true;
        }
        next = err.source();
    }
    false
}

/// The kind of a service error code.
fn code_kind(code: &str, message: Option<&str>) -> StoreErrorKind {
    match code {
        "ResourceNotFoundException" => StoreErrorKind::SchemaMissing,
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "RequestLimitExceeded"
        | "LimitExceededException" => StoreErrorKind::Throttled,
        "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "MissingAuthenticationToken"
        | "MissingAuthenticationTokenException"
        | "IncompleteSignature"
        | "IncompleteSignatureException"
        | "ExpiredTokenException"
        | "InvalidClientTokenId" => StoreErrorKind::Authentication,
        "AccessDeniedException" => StoreErrorKind::Permission,
        "ItemCollectionSizeLimitExceededException" => StoreErrorKind::Capacity,
        // DynamoDB gives the 400 KB item limit no code of its own.
        "ValidationException" if message.is_some_and(is_size_message) => StoreErrorKind::Capacity,
        "InternalServerError" | "ServiceUnavailable" | "InternalFailure" => {
            StoreErrorKind::Unreachable
        }
        _ => StoreErrorKind::Query,
    }
}

fn is_size_message(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("item size") || m.contains("maximum allowed size")
}

/// A failed request as an [`Error::Store`] of step `op`, with the SDK's whole error chain as the
/// message (its `Display` alone says only "service error").
pub(super) fn sdk_error<E, R>(op: &'static str, e: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let kind = kind_of(&e);
    let mut message = DisplayErrorContext(&e).to_string();
    if kind == StoreErrorKind::SchemaMissing {
        message.push_str(
            "; the table does not exist: create it (`idem migrate`, or open with \
             `create_table(true)`)",
        );
    }
    Error::store_kind(BACKEND, op, kind, message)
}

/// An item or an answer that is not what idem writes.
pub(super) fn corrupt(op: &'static str, what: String) -> Error {
    Error::store_kind(BACKEND, op, StoreErrorKind::Corrupt, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(
            code_kind("ProvisionedThroughputExceededException", None),
            StoreErrorKind::Throttled
        );
        assert!(code_kind("ThrottlingException", None).is_transient());
        assert_eq!(
            code_kind("ResourceNotFoundException", None),
            StoreErrorKind::SchemaMissing
        );
        assert_eq!(
            code_kind(
                "ValidationException",
                Some("Item size has exceeded the maximum allowed size")
            ),
            StoreErrorKind::Capacity
        );
        assert_eq!(
            code_kind("ValidationException", Some("bad expression")),
            StoreErrorKind::Query
        );
        assert_eq!(
            code_kind("UnrecognizedClientException", None),
            StoreErrorKind::Authentication
        );
    }
}
