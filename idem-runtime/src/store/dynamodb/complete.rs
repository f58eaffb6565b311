//! A completion: the value in the record's item, or in chunks beside it (`chunks.rs`) when it
//! does not fit; a record over the item limit all the same is refused and its key released.

use super::*;

impl DynamoDbStore {
    pub(super) async fn complete_now(&self, done: Complete<'_>) -> Result<bool, Error> {
        let now = self.now();
        // The namespace is not at hand here: room for a long one (a longer one meets DynamoDB's
        // own refusal, mapped to the same outcome). A handle has refused such a value already;
        // a store used directly has not.
        let expires_at = now.saturating_add(ms(done.ttl));
        let keep = crate::protocol::completed_keep_until(expires_at, done.tombstone).min(MAX_MS);
        // A value that does not fit in the record's item goes in chunks first
        // (`chunks.rs`); the completion then records how many instead of the value.
        let chunked = match item::completed_size(NAME_ALLOWANCE, done.value.len()) {
            size if size <= MAX_ITEM_BYTES => None,
            _ => Some(
                self.put_chunks(done.key, done.token, done.value, keep)
                    .await?,
            ),
        };
        let mut names = holds_names().unwrap_or_default();
        names.insert("#z".into(), VALUE_SIZE.into());
        names.insert("#k".into(), KEEP_UNTIL.into());
        let mut vals = vec![
            (":t", n(done.token)),
            (":running", n(Status::InProgress.as_i16())),
            (":done", n(Status::Completed.as_i16())),
            (":now", n(now)),
            (":z", n(done.value.len())),
            (":exp", n(expires_at)),
            (":keep", n(keep)),
            (":ttl", ttl_of(keep)),
        ];
        let set = match chunked {
            None => {
                names.insert("#v".into(), VALUE.into());
                vals.push((":v", b(done.value)));
                "SET #s = :done, #v = :v, #z = :z, #e = :exp, #k = :keep, #ttl = :ttl"
            }
            Some(count) => {
                names.insert("#c".into(), chunks::CHUNKS.into());
                vals.push((":c", n(count)));
                "SET #s = :done, #c = :c, #z = :z, #e = :exp, #k = :keep, #ttl = :ttl"
            }
        };
        let res = self
            .inner
            .client
            .update_item()
            .table_name(&self.inner.table)
            .set_key(Some(item::key_of(done.key)))
            .update_expression(set)
            .condition_expression(HOLDS)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(values(vals))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) => {
                use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
                match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                        // The SDK retries an attempt whose answer was lost; if the lost one
                        // had landed, the retry finds our own completion: that is a success.
                        let ours = match c.item() {
                            Some(old) => {
                                item::token_of(old, "complete")? == done.token
                                    && item::status(old, "complete")? == Status::Completed
                                    && item::number(old, EXPIRES_AT, "complete")? == expires_at
                            }
                            None => false,
                        };
                        if let (false, Some(count)) = (ours, chunked) {
                            self.delete_chunks(done.key, done.token, count).await;
                        }
                        Ok(ours)
                    }
                    _ if error::kind_of(&e) == StoreErrorKind::Capacity => {
                        Err(self.too_large(done.key, done.token, done.value.len()).await)
                    }
                    _ => Err(sdk_error("complete", e)),
                }
            }
        }
    }

    /// A result too large for an item: the key is released (nothing of the result was
    /// written), and the call fails with kind `Capacity`.
    pub(super) async fn too_large(&self, key: &Digest, token: u64, len: usize) -> Error {
        if let Err(e) = self.release_now(key, token).await {
            tracing::warn!(key = %key, token, error = %e,
                "idem: release after a too-large result failed; the key lapses after its lease");
        }
        Error::store_kind(
            BACKEND,
            "complete",
            StoreErrorKind::Capacity,
            format!(
                "the result of key {key} is {len} bytes: with its record it exceeds DynamoDB's \
                 {MAX_ITEM_BYTES}-byte item limit; the key was released. Return less (an id of \
                 the result stored elsewhere)"
            ),
        )
    }
}
