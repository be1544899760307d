//! The publish endpoint's work once the HTTP layer has authenticated the key and read
//! the body: parse and validate ([`parse`]), apply the quota, encode once ([`encode`])
//! and hand the one encoded frame to the mailbox of every worker that has subscribers
//! of the channel ([`Fanout`]).
//!
//! Order of checks, so that the cheapest refusal comes first: body parse and validation
//! (400) → quota (429) → shutting down / mailboxes (503). The answer is a value
//! ([`Answer`]); writing it as HTTP is the caller's job. Nothing here blocks or
//! allocates per subscriber: the frame is one `Bytes`.

pub(crate) mod encode;
pub(crate) mod parse;

use std::sync::Arc;

use crate::auth::ProjectState;
use crate::error::{ApiError, Unavailable};
use crate::ids::{Id, IdGen};
use crate::quota::{now_ns, Decision};
use crate::shard::mailbox::Broadcast;

pub(crate) use parse::PublishParser;

/// The outcome of one publish, for the caller to write.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The accepted message's id, or why it was refused.
    pub outcome: Result<Id, ApiError>,
    /// The project's quota after this request (taken on success, peeked on a refusal
    /// that spent nothing).
    pub rate: Decision,
    /// `Retry-After` for a 429.
    pub retry_after_s: Option<u64>,
}

/// What the caller needs to broadcast an accepted publish.
pub(crate) trait Fanout {
    /// Hand one encoded message to every worker; `false` when any mailbox is full.
    fn broadcast(&self, msg: Arc<Broadcast>) -> bool;
    /// Whether the service is shutting down.
    fn shutting_down(&self) -> bool;
}

/// Handle a publish whose body has been read, for an authenticated project.
pub(crate) fn accept(
    project: &ProjectState,
    body: &[u8],
    parser: &mut PublishParser,
    ids: &IdGen,
    fanout: &dyn Fanout,
) -> Answer {
    let refused = |error, rate| Answer {
        outcome: Err(error),
        rate,
        retry_after_s: None,
    };
    let msg = match parser.parse(body) {
        Ok(msg) => msg,
        Err(error) => return refused(error, project.quota.peek(now_ns())),
    };
    let decision = project.quota.check(now_ns());
    if !decision.allowed {
        return Answer {
            outcome: Err(ApiError::RateLimited),
            retry_after_s: Some(decision.retry_after_s.max(1)),
            rate: decision,
        };
    }
    if fanout.shutting_down() {
        return refused(ApiError::Unavailable(Unavailable::ShuttingDown), decision);
    }
    let id = ids.next_id();
    let frame = encode::message_frame(msg.channel, msg.event, msg.data, id.as_str());
    let broadcast = Arc::new(Broadcast {
        project: project.index,
        channel: msg.channel.into(),
        frame,
    });
    if !fanout.broadcast(broadcast) {
        return refused(ApiError::Unavailable(Unavailable::QueueFull), decision);
    }
    Answer {
        outcome: Ok(id),
        rate: decision,
        retry_after_s: None,
    }
}
