//! Values larger than one item: stored in chunks, items of their own beside the record.
//!
//! A chunk's partition key is the record's digest, the completing attempt's token and the
//! chunk's index (32 + 8 + 4 bytes), so chunks of two attempts never mix and a record's 32-byte
//! key never meets one. The chunks are written before the fenced completion, which then records
//! their number (`chunks`) instead of the value; they carry the record's `ttl`, so DynamoDB
//! deletes them with it, and a purge that deletes the record deletes them too. They are read
//! back with `BatchGetItem` (one request for up to 100 chunks, again for any it leaves
//! unprocessed). The table has a partition key only, so one `Query` cannot read them.

use super::error::{corrupt, sdk_error};
use super::item::{b, ttl_of, Item, PK, TTL};
use super::DynamoDbStore;
use crate::error::Error;
use crate::key::Digest;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, KeysAndAttributes, WriteRequest};
use std::collections::HashMap;

/// The attribute of a completed item that says its value is in this many chunks.
pub(super) const CHUNKS: &str = "chunks";
/// A chunk item's bytes.
pub(super) const CHUNK: &str = "chunk";
/// The bytes of one chunk: well under the 400 KB item limit with the key and the `ttl`.
pub(super) const CHUNK_BYTES: usize = 384 * 1024;
/// Chunks written at once.
const IN_FLIGHT: usize = 8;

/// The key of chunk `index` of the value `token` stored for `key`.
fn chunk_key(key: &Digest, token: u64, index: usize) -> Item {
    let mut pk = Vec::with_capacity(44);
    pk.extend_from_slice(&key.0);
    pk.extend_from_slice(&token.to_be_bytes());
    pk.extend_from_slice(&u32::try_from(index).unwrap_or(u32::MAX).to_be_bytes());
    HashMap::from([(PK.to_string(), b(&pk))])
}

/// How many chunks a completed item's value is in (`None`: it holds its value itself).
pub(super) fn count(item: &Item) -> Option<usize> {
    match item.get(CHUNKS) {
        Some(AttributeValue::N(s)) => s.parse().ok(),
        _ => None,
    }
}

impl DynamoDbStore {
    /// Writes `value` in chunks for the completion by `token`, kept until `keep_until`;
    /// returns how many. Before the fenced completion: a completion that is refused leaves
    /// chunks nobody reads, deleted by [`Self::delete_chunks`] or their `ttl`.
    pub(super) async fn put_chunks(
        &self,
        key: &Digest,
        token: u64,
        value: &[u8],
        keep_until: i64,
    ) -> Result<usize, Error> {
        let parts: Vec<&[u8]> = value.chunks(CHUNK_BYTES).collect();
        let indexed: Vec<(usize, &[u8])> = parts.iter().copied().enumerate().collect();
        for batch in indexed.chunks(IN_FLIGHT) {
            let puts = batch.iter().map(|(i, part)| {
                let mut item = chunk_key(key, token, *i);
                item.insert(CHUNK.to_string(), b(part));
                item.insert(TTL.to_string(), ttl_of(keep_until));
                self.inner
                    .client
                    .put_item()
                    .table_name(&self.inner.table)
                    .set_item(Some(item))
                    .send()
            });
            for res in futures_util::future::join_all(puts).await {
                res.map_err(|e| sdk_error("complete", e))?;
            }
        }
        Ok(parts.len())
    }

    /// The value in the `n` chunks of the completion by `token`.
    pub(super) async fn read_chunks(
        &self,
        key: &Digest,
        token: u64,
        n: usize,
        op: &'static str,
    ) -> Result<Vec<u8>, Error> {
        let mut parts: Vec<Option<Vec<u8>>> = vec![None; n];
        let keys: Vec<Item> = (0..n).map(|i| chunk_key(key, token, i)).collect();
        for batch in keys.chunks(100) {
            let mut pending = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(batch.to_vec()))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| corrupt(op, e.to_string()))?,
            );
            while let Some(ask) = pending.take() {
                let out = self
                    .inner
                    .client
                    .batch_get_item()
                    .request_items(self.inner.table.clone(), ask)
                    .send()
                    .await
                    .map_err(|e| sdk_error(op, e))?;
                for item in out
                    .responses()
                    .and_then(|r| r.get(&self.inner.table))
                    .into_iter()
                    .flatten()
                {
                    let (index, bytes) = chunk_of(item, op)?;
                    if let Some(slot) = parts.get_mut(index) {
                        *slot = Some(bytes);
                    }
                }
                // A response holds at most 16 MB: the rest comes back as unprocessed keys.
                pending = out
                    .unprocessed_keys()
                    .and_then(|u| u.get(&self.inner.table))
                    .filter(|k| !k.keys().is_empty())
                    .cloned();
            }
        }
        let mut value = Vec::new();
        for (i, part) in parts.into_iter().enumerate() {
            let part = part.ok_or_else(|| {
                corrupt(
                    op,
                    format!("chunk {i} of {n} of key {key}'s value is missing"),
                )
            })?;
            value.extend_from_slice(&part);
        }
        Ok(value)
    }

    /// Deletes the `n` chunks of the completion by `token` (best effort: their `ttl` deletes
    /// any left).
    pub(super) async fn delete_chunks(&self, key: &Digest, token: u64, n: usize) {
        let keys: Vec<Item> = (0..n).map(|i| chunk_key(key, token, i)).collect();
        for batch in keys.chunks(25) {
            let requests = batch
                .iter()
                .filter_map(|k| {
                    let delete = DeleteRequest::builder()
                        .set_key(Some(k.clone()))
                        .build()
                        .ok()?;
                    Some(WriteRequest::builder().delete_request(delete).build())
                })
                .collect();
            let res = self
                .inner
                .client
                .batch_write_item()
                .request_items(self.inner.table.clone(), requests)
                .send()
                .await;
            if let Err(e) = res {
                tracing::debug!(key = %key, token, error = %e,
                    "idem: deleting a value's chunks failed; their ttl deletes them");
            }
        }
    }

    /// Fills in the value of a completed record whose item keeps it in chunks.
    pub(super) async fn with_chunks(
        &self,
        item: &Item,
        record: &mut crate::store::Record,
        op: &'static str,
    ) -> Result<(), Error> {
        if let (Some(n), None, crate::store::Status::Completed) =
            (count(item), &record.value, record.status)
        {
            if crate::protocol::is_live(record.expires_at, record.now) {
                record.value = Some(self.read_chunks(&record.key, record.token, n, op).await?);
            }
        }
        Ok(())
    }
}

/// A chunk's index (from its key) and bytes.
fn chunk_of(item: &Item, op: &'static str) -> Result<(usize, Vec<u8>), Error> {
    let index = match item.get(PK) {
        Some(AttributeValue::B(pk)) if pk.as_ref().len() == 44 => {
            let mut i = [0u8; 4];
            i.copy_from_slice(&pk.as_ref()[40..]);
            u32::from_be_bytes(i) as usize
        }
        _ => return Err(corrupt(op, "a chunk's key is not 44 bytes".into())),
    };
    match item.get(CHUNK) {
        Some(AttributeValue::B(bytes)) => Ok((index, bytes.as_ref().to_vec())),
        _ => Err(corrupt(op, "a chunk has no bytes".into())),
    }
}
