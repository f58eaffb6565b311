//! `purge_expired`: a `Scan` for forgettable records, then a conditional `DeleteItem` each (and
//! the chunks of a value stored in chunks).

use super::*;

impl DynamoDbStore {
    pub(super) async fn purge_now(&self, limit: usize) -> Result<u64, Error> {
        use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
        let now = self.now();
        let mut candidates: Vec<(Item, u64, Option<usize>)> = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let page = self
                .inner
                .client
                .scan()
                .table_name(&self.inner.table)
                .projection_expression("#pk, #t, #e, #k, #c")
                .filter_expression(FORGETTABLE)
                .set_expression_attribute_names(names(&[
                    ("#pk", PK),
                    ("#t", TOKEN),
                    ("#e", EXPIRES_AT),
                    ("#k", KEEP_UNTIL),
                    ("#c", chunks::CHUNKS),
                ]))
                .set_expression_attribute_values(values(vec![(":now", n(now))]))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| sdk_error("purge_expired", e))?;
            for it in page.items() {
                let key = it
                    .get(PK)
                    .cloned()
                    .ok_or_else(|| corrupt("purge_expired", "an item has no key".into()))?;
                let token = item::token_of(it, "purge_expired")?;
                let chunked = chunks::count(it);
                candidates.push((HashMap::from([(PK.to_string(), key)]), token, chunked));
            }
            start = page.last_evaluated_key().cloned();
            if candidates.len() >= limit || start.is_none() {
                break;
            }
        }
        candidates.truncate(limit);
        let mut deleted = 0;
        // A few deletes in flight at a time: each is one small request.
        for chunk in candidates.chunks(16) {
            let runs = chunk.iter().map(|(key, token, _)| {
                self.inner
                    .client
                    .delete_item()
                    .table_name(&self.inner.table)
                    .set_key(Some(key.clone()))
                    // Only the ended item it saw: not one a claim took over meanwhile.
                    .condition_expression(format!("#t = :t AND {FORGETTABLE}"))
                    .set_expression_attribute_names(names(&[
                        ("#t", TOKEN),
                        ("#e", EXPIRES_AT),
                        ("#k", KEEP_UNTIL),
                    ]))
                    .set_expression_attribute_values(values(vec![
                        (":t", n(*token)),
                        (":now", n(now)),
                    ]))
                    .send()
            });
            let results = futures_util::future::join_all(runs).await;
            for (res, (key, token, chunked)) in results.into_iter().zip(chunk) {
                match res {
                    Ok(_) => {
                        deleted += 1;
                        // The value's chunks go with the record.
                        if let Some(count) = chunked {
                            let digest = item::digest(key, PK, "purge_expired")?;
                            self.delete_chunks(&digest, *token, *count).await;
                        }
                    }
                    Err(e)
                        if matches!(
                            e.as_service_error(),
                            Some(DeleteItemError::ConditionalCheckFailedException(_))
                        ) => {}
                    Err(e) => return Err(sdk_error("purge_expired", e)),
                }
            }
        }
        Ok(deleted)
    }
}
