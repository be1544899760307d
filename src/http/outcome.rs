//! What an endpoint decided for one request: answered (and whether the connection must
//! close), waiting for more of the body, or switching to WebSocket.

use super::response::{write_error, Extra};
use super::ApiError;
use crate::auth::ProjectState;
use crate::shard::ProjectSlot;
use std::sync::Arc;

pub(crate) enum Outcome {
    /// The whole answer is in the output; keep reading requests (unless `close`).
    Answered { close: bool },
    /// Need more bytes (the body is incomplete).
    NeedMore,
    /// Switch to WebSocket; the 101 answer is in the output.
    Upgrade(Upgrade),
}

/// An accepted upgrade, waiting for its 101 to be written.
pub(crate) struct Upgrade {
    /// The project whose channels the connection sees.
    pub project: Arc<ProjectState>,
    /// The key it was opened with (revocation closes it).
    pub key_id: Box<str>,
    /// Its place under the project's connection limit.
    pub slot: ProjectSlot,
}

/// Answer with an error from the table.
pub(crate) fn answer(out: &mut Vec<u8>, err: ApiError) -> Outcome {
    write_error(out, err, Extra::default());
    Outcome::Answered {
        close: err.closes_connection(),
    }
}
