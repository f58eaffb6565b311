//! The operator's queries on the DynamoDB store ([`Inspect`]): a `Scan` of the table, judged
//! at one instant of this process's clock, filtered and counted client side (DynamoDB has no
//! `ORDER BY` or `GROUP BY`). A listing reads every item but the stored values (their size is
//! an attribute of its own), so it costs read units in proportion to the table.

use super::error::sdk_error;
use super::item::{
    self, Item, ATTEMPT, CREATED_AT, EXPIRES_AT, FINGERPRINT, KEEP_UNTIL, NAME, PK, STATUS, TOKEN,
    VALUE_SIZE,
};
use super::{names, DynamoDbStore};
use crate::error::Error;
use crate::store::{
    count_states, finish_listing, BoxFuture, Filter, Inspect, KeyInfo, Stat, State,
};

impl DynamoDbStore {
    /// Every item of the table, with only the attributes `projection` names.
    pub(super) async fn scan_all(
        &self,
        op: &'static str,
        projection: &[&str],
    ) -> Result<Vec<Item>, Error> {
        let placeholders: Vec<(String, &str)> = projection
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("#a{i}"), *a))
            .collect();
        let expression = placeholders
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let mut pairs: Vec<(&str, &str)> =
            placeholders.iter().map(|(p, a)| (p.as_str(), *a)).collect();
        // Records only: not the chunks of large values (`chunks.rs`).
        pairs.push(("#chunk", super::chunks::CHUNK));
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let page = self
                .inner
                .client
                .scan()
                .table_name(&self.inner.table)
                .consistent_read(true)
                .projection_expression(&expression)
                .filter_expression("attribute_not_exists(#chunk)")
                .set_expression_attribute_names(names(&pairs))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| sdk_error(op, e))?;
            items.extend(page.items().iter().cloned());
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return Ok(items);
            }
        }
    }
}

impl Inspect for DynamoDbStore {
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            let items = self
                .scan_all(
                    "list",
                    &[
                        PK,
                        NAME,
                        FINGERPRINT,
                        TOKEN,
                        STATUS,
                        VALUE_SIZE,
                        CREATED_AT,
                        EXPIRES_AT,
                        ATTEMPT,
                        KEEP_UNTIL,
                    ],
                )
                .await?;
            let now = self.now();
            let mut rows = Vec::new();
            for it in &items {
                let record = item::record(it, now, "list")?;
                let value_size = match it.get(VALUE_SIZE) {
                    Some(_) => Some(item::number(it, VALUE_SIZE, "list")? as u64),
                    None => None,
                };
                let info = KeyInfo {
                    value_size,
                    ..KeyInfo::from(&record)
                };
                if filter.matches(&info) {
                    rows.push(info);
                }
            }
            Ok(finish_listing(rows, filter))
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>> {
        Box::pin(async move {
            let items = self
                .scan_all("stats", &[NAME, STATUS, EXPIRES_AT, KEEP_UNTIL])
                .await?;
            let now = self.now();
            let states = items
                .iter()
                .map(|it| {
                    let status = item::status(it, "stats")?;
                    let expires_at = item::number(it, EXPIRES_AT, "stats")?;
                    // An item written before `keep_until`: kept until its end, never abandoned.
                    let keep_until = match it.get(KEEP_UNTIL) {
                        Some(_) => item::number(it, KEEP_UNTIL, "stats")?,
                        None => expires_at.saturating_sub(1),
                    };
                    Ok((
                        item::name(it, "stats")?,
                        State::of(status, expires_at, keep_until, now),
                    ))
                })
                .collect::<Result<Vec<_>, Error>>()?;
            Ok(count_states(states))
        })
    }
}
