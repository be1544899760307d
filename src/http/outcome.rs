//! What an endpoint decided for one request: answered (and whether the connection must
//! close), waiting for more of the body, or switching to WebSocket.

use super::response::{write_error, Extra};
use super::ApiError;
use crate::auth::ProjectState;
use crate::client::user::ConnUser;
use crate::dialect::Dialect;
use crate::shard::ProjectSlot;
use std::sync::Arc;

pub(crate) enum Outcome {
    /// The whole answer is in the output; keep reading requests (unless `close`).
    Answered { close: bool },
    /// Need more bytes (the body is incomplete).
    NeedMore,
    /// Switch to WebSocket; the 101 answer is in the output.
    Upgrade(Upgrade),
    /// The answer comes later (cluster mode: a history publish or read waits for
    /// Redis on the cluster's thread): the future gives its bytes. The request was
    /// read whole; the connection serves nothing else until it is written, so answers
    /// keep request order.
    Deferred(Deferred),
}

/// An answer being prepared off the worker; awaiting it never blocks the worker.
pub(crate) type Deferred = std::pin::Pin<Box<dyn std::future::Future<Output = Vec<u8>>>>;

/// An accepted upgrade, waiting for its 101 to be written.
pub(crate) struct Upgrade {
    /// The project whose channels the connection sees.
    pub project: Arc<ProjectState>,
    /// The key it was opened with (revocation closes it).
    pub key_id: Box<str>,
    /// Its place under the project's connection limit.
    pub slot: ProjectSlot,
    /// The client protocol it speaks (`/api/v1/ws` native, `/app/{key}` Pusher).
    pub dialect: Dialect,
    /// permessage-deflate was agreed in the 101 (`ws::deflate`), with this server
    /// window in bits.
    pub deflate: Option<u8>,
    /// The user its connection token named (native `?token=`; `None` without one).
    pub user: Option<ConnUser>,
}

/// Answer with an error from the table.
pub(crate) fn answer(out: &mut Vec<u8>, err: ApiError) -> Outcome {
    write_error(out, err, Extra::default());
    Outcome::Answered {
        close: err.closes_connection(),
    }
}
