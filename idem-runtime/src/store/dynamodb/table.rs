//! The table: checked on open, created when missing (on-demand billing, TTL on `ttl`) unless
//! the options say not to.

use super::error::sdk_error;
use super::item::{PK, TTL};
use super::BACKEND;
use crate::error::{Error, StoreErrorKind};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;
use std::time::Duration;

/// How long open waits for a table it created (or found being created) to become active.
const ACTIVE_WITHIN: Duration = Duration::from_secs(60);

/// What [`ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// The table was there.
    Existing,
    /// The table was missing and this call created it.
    Created,
}

fn schema_error(kind: StoreErrorKind, message: String) -> Error {
    Error::store_kind(BACKEND, "open", kind, message)
}

/// Checks that `table` exists with idem's key schema (a binary partition key `pk`, no sort
/// key); creates it when it is missing and `create` is set.
pub(super) async fn ensure(client: &Client, table: &str, create: bool) -> Result<Found, Error> {
    match client.describe_table().table_name(table).send().await {
        Ok(out) => {
            let desc = out.table();
            let keys = desc.map(|t| t.key_schema()).unwrap_or_default();
            let is_ours = keys.len() == 1
                && keys[0].attribute_name() == PK
                && keys[0].key_type() == &KeyType::Hash;
            if !is_ours {
                return Err(schema_error(
                    StoreErrorKind::SchemaOutdated,
                    format!(
                        "the DynamoDB table `{table}` exists but its key is not idem's (a \
                         binary partition key `{PK}` and no sort key): use another table"
                    ),
                ));
            }
            if desc.and_then(|t| t.table_status()) != Some(&TableStatus::Active) {
                wait_active(client, table).await?;
            }
            Ok(Found::Existing)
        }
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            if !create {
                return Err(schema_error(
                    StoreErrorKind::SchemaMissing,
                    format!(
                        "the DynamoDB table `{table}` does not exist, and table creation is \
                         off: create it (`idem migrate dynamodb://{table}`, or open with \
                         `create_table(true)`)"
                    ),
                ));
            }
            create_table(client, table).await?;
            Ok(Found::Created)
        }
        Err(e) => Err(sdk_error("open", e)),
    }
}

async fn create_table(client: &Client, table: &str) -> Result<(), Error> {
    let build = |e: aws_sdk_dynamodb::error::BuildError| {
        Error::store_kind(BACKEND, "open", StoreErrorKind::Query, e.to_string())
    };
    let created = client
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(PK)
                .attribute_type(ScalarAttributeType::B)
                .build()
                .map_err(build)?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(PK)
                .key_type(KeyType::Hash)
                .build()
                .map_err(build)?,
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    match created {
        Ok(_) => {}
        // Another process created it meanwhile: wait for it like for our own.
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) => {}
        Err(e) => return Err(sdk_error("open", e)),
    }
    wait_active(client, table).await?;
    let ttl = client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(TTL)
                .build()
                .map_err(build)?,
        )
        .send()
        .await;
    match ttl {
        Ok(_) => Ok(()),
        // Already enabled (by a concurrent creator): what we wanted.
        Err(e) if is_ttl_already_on(&e) => Ok(()),
        Err(e) => Err(sdk_error("open", e)),
    }
}

fn is_ttl_already_on<R>(
    e: &aws_sdk_dynamodb::error::SdkError<
        aws_sdk_dynamodb::operation::update_time_to_live::UpdateTimeToLiveError,
        R,
    >,
) -> bool {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    e.code() == Some("ValidationException")
        && e.message()
            .is_some_and(|m| m.to_ascii_lowercase().contains("already enabled"))
}

async fn wait_active(client: &Client, table: &str) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + ACTIVE_WITHIN;
    let mut pause = Duration::from_millis(50);
    loop {
        let out = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| sdk_error("open", e))?;
        if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(schema_error(
                StoreErrorKind::Timeout,
                format!(
                    "the DynamoDB table `{table}` did not become active within {ACTIVE_WITHIN:?}"
                ),
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
