//! An outbox's messages as an operator lists them (`Outbox::list`, `idem outbox list`): their
//! state, what is known of each, and the filter that selects them. Each database's dialect
//! builds them from its columns.

use super::schema::{DEAD, DELIVERED, PENDING};
use crate::error::{Error, StoreErrorKind};
use crate::store::Backend;
use std::time::Duration;

/// The state of an outbox message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageState {
    /// Waiting for (another) delivery attempt, backing off after a failure or not.
    Pending,
    /// Accepted by the publisher; deleted after the relays' retention (or `purge_delivered`).
    Delivered,
    /// Failed `max_attempts` times: kept, no longer tried, until
    /// [`Outbox::retry_dead`](super::Outbox::retry_dead).
    Dead,
}

impl MessageState {
    /// `pending`, `delivered` or `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Pending => "pending",
            MessageState::Delivered => "delivered",
            MessageState::Dead => "dead",
        }
    }

    fn code(self) -> i16 {
        match self {
            MessageState::Pending => PENDING,
            MessageState::Delivered => DELIVERED,
            MessageState::Dead => DEAD,
        }
    }

    pub(super) fn from_code(c: i16) -> Option<MessageState> {
        match c {
            PENDING => Some(MessageState::Pending),
            DELIVERED => Some(MessageState::Delivered),
            DEAD => Some(MessageState::Dead),
            _ => None,
        }
    }
}

/// One message as [`Outbox::list`](super::Outbox::list) shows it (without its payload).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageInfo {
    /// The message id.
    pub id: String,
    /// The topic.
    pub topic: String,
    /// The ordering key.
    pub ordering_key: String,
    /// Its state.
    pub state: MessageState,
    /// Delivery attempts so far (failed ones, plus the successful one of a delivered message).
    pub attempts: u32,
    /// How long ago it was enqueued.
    pub age: Duration,
    /// A pending message backing off: how long until its next attempt (`None`: due now).
    pub next_attempt_in: Option<Duration>,
    /// The error of its last failed attempt.
    pub last_error: Option<String>,
    /// The payload's size in bytes.
    pub payload_len: u64,
}

/// Which messages [`Outbox::list`](super::Outbox::list) returns: by default pending and dead
/// ones (not the delivered ones awaiting purge), oldest first, at most 100.
#[derive(Debug, Clone)]
pub struct ListFilter {
    states: Vec<MessageState>,
    pub(super) topic: Option<String>,
    pub(super) ordering_key: Option<String>,
    pub(super) limit: i64,
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            states: vec![MessageState::Pending, MessageState::Dead],
            topic: None,
            ordering_key: None,
            limit: 100,
        }
    }
}

impl ListFilter {
    /// Pending and dead messages, at most 100.
    pub fn new() -> ListFilter {
        ListFilter::default()
    }
    /// Only messages in `state`.
    pub fn state(mut self, state: MessageState) -> ListFilter {
        self.states = vec![state];
        self
    }
    /// Only messages of this topic.
    pub fn topic(mut self, topic: impl Into<String>) -> ListFilter {
        self.topic = Some(topic.into());
        self
    }
    /// Only messages of this ordering key.
    pub fn ordering_key(mut self, key: impl Into<String>) -> ListFilter {
        self.ordering_key = Some(key.into());
        self
    }
    /// At most `n` messages (at least 1).
    pub fn limit(mut self, n: usize) -> ListFilter {
        self.limit = n.clamp(1, i64::MAX as usize) as i64;
        self
    }

    /// The `status` codes of the selected states.
    pub(super) fn codes(&self) -> Vec<i16> {
        self.states.iter().map(|s| s.code()).collect()
    }
}

/// One listed message from its columns: id, topic, ordering key, status, attempts, age (ms),
/// time to the next attempt (ms), last error, payload length. An unknown status is `Corrupt`.
#[allow(clippy::too_many_arguments)]
pub(super) fn message_info(
    backend: Backend,
    id: String,
    topic: String,
    ordering_key: String,
    status: i16,
    attempts: i32,
    age_ms: i64,
    next_ms: i64,
    last_error: Option<String>,
    payload_len: i64,
) -> Result<MessageInfo, Error> {
    let state = MessageState::from_code(status).ok_or_else(|| {
        Error::store_kind(
            backend,
            "outbox.list",
            StoreErrorKind::Corrupt,
            format!("outbox message with unknown status {status}"),
        )
    })?;
    Ok(MessageInfo {
        id,
        topic,
        ordering_key,
        state,
        attempts: attempts.max(0) as u32,
        age: Duration::from_millis(age_ms.max(0) as u64),
        next_attempt_in: (state == MessageState::Pending && next_ms > 0)
            .then(|| Duration::from_millis(next_ms as u64)),
        last_error,
        payload_len: payload_len.max(0) as u64,
    })
}
