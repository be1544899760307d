//! An endpoint's contract: the [`Request`] it is handed (the worker's service, the
//! parsed head and the bytes it indexes, the client) and the [`Outcome`] it decided:
//! answered (and whether the connection must close), waiting for more of the body, or
//! switching to WebSocket.

use std::net::IpAddr;
use std::ops::Range;
use std::rc::Rc;

use super::parse::RequestHead;
use super::response::{write_error, Extra};
use super::{ApiError, Service};
use crate::apikey::KeyKind;
use crate::auth::ProjectState;
use crate::client::user::ConnUser;
use crate::dialect::Dialect;
use crate::shard::ProjectSlot;
use std::sync::Arc;

/// One request as every endpoint sees it. `bytes` starts at the head; the body may not
/// have arrived whole yet ([`Request::body`] says).
pub(crate) struct Request<'a> {
    pub svc: &'a Rc<Service>,
    pub head: &'a RequestHead,
    pub bytes: &'a [u8],
    /// The client's address (the TCP peer's, or what a trusted proxy named).
    pub peer: Option<IpAddr>,
}

impl<'a> Request<'a> {
    /// The bytes of one part of the head the parser located.
    pub(crate) fn part(&self, range: &Option<Range<usize>>) -> Option<&'a [u8]> {
        range.as_ref().map(|r| &self.bytes[r.clone()])
    }

    pub(crate) fn path(&self) -> &'a [u8] {
        &self.bytes[self.head.path.clone()]
    }

    /// The query string without its `?` (empty when there is none).
    pub(crate) fn query(&self) -> &'a [u8] {
        self.part(&self.head.query).unwrap_or_default()
    }

    /// The key the request presents (`Authorization: Bearer` or `X-Api-Key`).
    pub(crate) fn api_key(&self) -> Option<&'a [u8]> {
        self.part(&self.head.api_key)
    }

    pub(crate) fn content_type(&self) -> Option<&'a [u8]> {
        self.part(&self.head.content_type)
    }

    /// The project whose secret key the request presents, or the 401 to answer. (The
    /// publish endpoints check the key themselves: they borrow the project from the
    /// snapshot instead of taking a reference count.)
    pub(crate) fn secret_project(&self) -> Result<Arc<ProjectState>, ApiError> {
        let keys = self.svc.node.keys.load();
        keys.authenticate(self.api_key(), KeyKind::Secret)
            .map(|entry| Arc::clone(&entry.project))
            .map_err(ApiError::Unauthorized)
    }

    /// The whole body, or `None` while some of it is still to be read.
    pub(crate) fn body(&self) -> Option<&'a [u8]> {
        let start = self.head.head_len;
        let end = start + self.head.content_length.unwrap_or(0);
        self.bytes.get(start..end)
    }
}

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
