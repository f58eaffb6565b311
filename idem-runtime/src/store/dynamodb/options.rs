//! How to open a [`DynamoDbStore`]: the table, whether to create it, and where the service is.

use super::table::{self, Found};
use super::{DynamoDbStore, BACKEND};
use crate::error::Error;
use crate::store::{Migrated, DEFAULT_TABLE};
use aws_sdk_dynamodb::Client;
use std::str::FromStr;
use std::time::Duration;

/// How to open a [`DynamoDbStore`]: `DynamoDbOptions::new().table("t").connect().await`, or
/// `"dynamodb://t?region=eu-west-1".parse::<DynamoDbOptions>()?`.
///
/// Everything not set here comes from the AWS environment as the AWS SDK reads it
/// (`aws_config::load_defaults`): `AWS_REGION` / the profile's region, credentials from the
/// environment, profile files, web identity (EKS), ECS or the instance metadata, and the
/// endpoint from `AWS_ENDPOINT_URL_DYNAMODB` / `AWS_ENDPOINT_URL`.
#[derive(Debug, Clone)]
pub struct DynamoDbOptions {
    pub(super) table: String,
    pub(super) create_table: bool,
    region: Option<String>,
    endpoint: Option<String>,
    credentials: Option<(String, String)>,
    attempt_timeout: Option<Duration>,
    pub(super) clock_offset_ms: i64,
}

impl Default for DynamoDbOptions {
    fn default() -> Self {
        DynamoDbOptions {
            table: DEFAULT_TABLE.to_string(),
            create_table: true,
            region: None,
            endpoint: None,
            credentials: None,
            attempt_timeout: Some(Duration::from_secs(5)),
            clock_offset_ms: 0,
        }
    }
}

impl FromStr for DynamoDbOptions {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self, Error> {
        Self::from_url(url)
    }
}

fn bad_url(url: &str, why: &str) -> Error {
    Error::config(format!(
        "invalid DynamoDB URL `{url}` for idem ({why}); expected \
         dynamodb://TABLE?region=REGION&endpoint=URL&create_table=false (every part but the \
         scheme optional)"
    ))
}

impl DynamoDbOptions {
    /// The defaults: table `idem_records`, created when missing, region, credentials and
    /// endpoint from the AWS environment, each request attempt bounded by 5 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// Options from `dynamodb://TABLE?region=REGION&endpoint=URL&create_table=false`: the
    /// table (default `idem_records`), and optionally the region, the endpoint (DynamoDB
    /// Local: `endpoint=http://127.0.0.1:8000`) and whether to create a missing table
    /// (default `true`). Anything else is [`Error::Config`].
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let rest = url
            .strip_prefix("dynamodb://")
            .ok_or_else(|| bad_url(url, "it must start with dynamodb://"))?;
        let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
        let table = table.trim_end_matches('/');
        let mut options = DynamoDbOptions::default();
        if !table.is_empty() {
            options = options.table(table);
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad_url(url, &format!("`{pair}` has no value")))?;
            options = match k {
                "region" => options.region(v),
                "endpoint" => options.endpoint(v),
                "create_table" => options.create_table(match v {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => return Err(bad_url(url, "create_table is true or false")),
                }),
                _ => return Err(bad_url(url, &format!("unknown parameter `{k}`"))),
            };
        }
        Ok(options)
    }

    /// The table (default `idem_records`). DynamoDB's rules: 3 to 255 letters, digits, `_`,
    /// `-` and `.`; anything else is refused with `Error::Config` at open.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Create the table when it is missing (default `true`): on-demand billing, the key `pk`,
    /// TTL on the attribute `ttl`. With `false`, a missing table is an [`Error::Store`] of kind
    /// [`SchemaMissing`](crate::StoreErrorKind::SchemaMissing), for deployments whose role may
    /// not create tables (the table then comes from infrastructure code: see the README).
    pub fn create_table(mut self, yes: bool) -> Self {
        self.create_table = yes;
        self
    }

    /// The AWS region (default: the environment's).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// The endpoint (default: the environment's `AWS_ENDPOINT_URL_DYNAMODB`, else AWS's), such
    /// as DynamoDB Local's `http://127.0.0.1:8000`.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// Static credentials instead of the environment's chain: for DynamoDB Local, which takes
    /// any. On AWS, prefer the environment's (a role).
    pub fn credentials(mut self, access_key_id: &str, secret_access_key: &str) -> Self {
        self.credentials = Some((access_key_id.to_string(), secret_access_key.to_string()));
        self
    }

    /// How long one attempt of a request may take before it fails with kind
    /// [`Timeout`](crate::StoreErrorKind::Timeout) (default 5 s; `None`: the SDK's default,
    /// no limit). The SDK retries an attempt that failed transiently, by its retry settings.
    pub fn attempt_timeout(mut self, d: Option<Duration>) -> Self {
        self.attempt_timeout = d;
        self
    }

    /// Shifts the store's clock by `ms` milliseconds (positive: ahead), to test what a client
    /// with a skewed clock does.
    #[cfg(feature = "testkit")]
    #[doc(hidden)]
    pub fn clock_offset_ms(mut self, ms: i64) -> Self {
        self.clock_offset_ms = ms;
        self
    }

    fn check_table(&self) -> Result<(), Error> {
        let t = &self.table;
        let ok = (3..=255).contains(&t.len())
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if ok {
            Ok(())
        } else {
            Err(Error::config(format!(
                "invalid DynamoDB table name `{t}`: 3 to 255 letters, digits, `_`, `-` or `.`"
            )))
        }
    }

    /// The SDK client these options describe: the AWS environment, overridden by what is set
    /// here.
    pub async fn client(&self) -> Result<Client, Error> {
        // rustls on ring: the SDK's default client would bring aws-lc (see Cargo.toml).
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader =
            aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http);
        if let Some(region) = &self.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(endpoint) = &self.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some((id, secret)) = &self.credentials {
            loader = loader.credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                id.clone(),
                secret.clone(),
                None,
                None,
                "idem-static",
            ));
        }
        if let Some(t) = self.attempt_timeout {
            loader = loader.timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_attempt_timeout(t)
                    .connect_timeout(t.min(Duration::from_millis(3100)))
                    .build(),
            );
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(Error::config(
                "no AWS region for the DynamoDB store: set AWS_REGION (or the profile's \
                 region), or `region=` in the URL",
            ));
        }
        Ok(Client::new(&config))
    }

    /// Opens the store: builds the client, checks the table (creating it when missing, unless
    /// `create_table(false)`).
    pub async fn connect(self) -> Result<DynamoDbStore, Error> {
        self.check_table()?;
        let client = self.client().await?;
        DynamoDbStore::from_client(client, self).await
    }

    /// Creates the table when it is missing and says what it found (what `idem migrate` runs);
    /// keeps no store open. DynamoDB has no schema versions: a table is version 1.
    pub async fn migrate(self) -> Result<Migrated, Error> {
        self.check_table()?;
        let client = self.client().await?;
        let found = table::ensure(&client, &self.table, true).await?;
        let from = if found == Found::Created { 0 } else { 1 };
        Ok(Migrated::new(
            BACKEND,
            from,
            1,
            format!("table {}", self.table),
        ))
    }

    pub(super) fn checked(&self) -> Result<(), Error> {
        self.check_table()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let o = DynamoDbOptions::from_url(
            "dynamodb://orders?region=eu-west-1&endpoint=http://127.0.0.1:8000&create_table=false",
        )
        .unwrap();
        assert_eq!(o.table, "orders");
        assert_eq!(o.region.as_deref(), Some("eu-west-1"));
        assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
        assert!(!o.create_table);
        let o = DynamoDbOptions::from_url("dynamodb://").unwrap();
        assert_eq!(o.table, DEFAULT_TABLE);
        assert!(o.create_table);
        assert!(DynamoDbOptions::from_url("dynamodb://t?colour=red").is_err());
        assert!(DynamoDbOptions::from_url("mysql://x").is_err());
        assert!(DynamoDbOptions::new().table("a b").check_table().is_err());
        assert!(DynamoDbOptions::new().table("ab").check_table().is_err());
        assert!(DynamoDbOptions::new()
            .table("idem.records-1")
            .check_table()
            .is_ok());
    }
}
