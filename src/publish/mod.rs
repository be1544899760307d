//! The publish endpoint: parse ([`parse`]), validate, authenticate, apply the quota,
//! encode once ([`encode`]) and hand the one encoded frame to the mailbox of every worker
//! that has subscribers of the channel.
//!
//! Order of checks, so that the cheapest refusal comes first and a refused request costs
//! no quota: shutting down (503) → key (401) → Content-Type (415) → declared size (413)
//! — all four from the head, before the body is waited for — then body parse and
//! validation (400) → quota (429) → mailboxes (503). Nothing here blocks or allocates per subscriber: the frame is one `Bytes`.

pub mod encode;
pub mod parse;

use std::sync::Arc;

use crate::auth::{KeyEntry, KeyKind};
use crate::http::response::{write_error, write_json, Extra, RateHeaders};
use crate::http::ApiError;
use crate::quota::{now_ns, Decision};
use crate::shard::mailbox::Broadcast;

pub use parse::{Publish, PublishParser};

/// The project a request was authenticated for, kept between the head and the body.
pub struct Authorized {
    pub entry: KeyEntryRef,
}

/// A cheap handle to the authenticated key's project.
pub type KeyEntryRef = Arc<crate::auth::ProjectState>;

/// A refusal decided from the head; `project` is set once the key was recognised, so
/// the answer can still carry the project's rate headers.
pub struct Refusal {
    pub error: ApiError,
    pub project: Option<KeyEntryRef>,
}

impl Refusal {
    /// Append the answer, with rate headers when the project is known (peeked, so a
    /// refused request spends nothing).
    pub fn write(&self, out: &mut Vec<u8>) {
        let rate = self
            .project
            .as_ref()
            .map(|p| rate_headers(&p.quota.peek(now_ns())));
        write_error(
            out,
            self.error,
            Extra {
                rate,
                ..Extra::default()
            },
        );
    }
}

/// Check everything that the head alone decides. On success the body may be read.
pub fn authorize(
    keys: &crate::auth::KeySnapshot,
    api_key: Option<&[u8]>,
    content_type: Option<&[u8]>,
    content_length: Option<usize>,
    max_body: usize,
) -> Result<Authorized, Refusal> {
    let refuse = |error| Refusal {
        error,
        project: None,
    };
    let key = match api_key {
        None => {
            return Err(refuse(ApiError::Unauthorized(
                "the X-Api-Key header is missing",
            )))
        }
        Some(raw) => std::str::from_utf8(raw)
            .map_err(|_| refuse(ApiError::Unauthorized("the API key is not valid")))?,
    };
    let public =
        ApiError::Unauthorized("a public key cannot publish; use the project's secret key");
    let entry: &KeyEntry = match KeyKind::of_key(key) {
        Some(KeyKind::Secret) => keys.lookup(key).ok_or(refuse(ApiError::Unauthorized(
            "the API key is unknown or revoked",
        )))?,
        Some(KeyKind::Public) => return Err(refuse(public)),
        None => {
            return Err(refuse(ApiError::Unauthorized(
                "the API key is not a secret key (sk_...)",
            )))
        }
    };
    if entry.kind != KeyKind::Secret {
        return Err(refuse(public));
    }
    let known = |error| Refusal {
        error,
        project: Some(entry.project.clone()),
    };
    match content_type {
        Some(ct) if crate::http::parse::is_json_media_type(ct) => {}
        _ => return Err(known(ApiError::UnsupportedMediaType)),
    }
    match content_length {
        Some(n) if n > max_body => return Err(known(ApiError::PayloadTooLarge)),
        _ => {}
    }
    Ok(Authorized {
        entry: entry.project.clone(),
    })
}

fn rate_headers(d: &Decision) -> RateHeaders {
    RateHeaders {
        limit: d.limit,
        remaining: d.remaining,
        reset_s: d.reset_s,
    }
}

/// What the caller needs to broadcast an accepted publish.
pub trait Fanout {
    /// Hand one encoded message to every worker; `false` when any mailbox is full.
    fn broadcast(&self, msg: Arc<Broadcast>) -> bool;
    /// Whether the service is shutting down.
    fn shutting_down(&self) -> bool;
}

/// Handle a publish whose body has been read; the answer is appended to `out`.
pub fn accept(
    auth: &Authorized,
    body: &[u8],
    parser: &mut PublishParser,
    ids: &crate::ids::IdGen,
    fanout: &dyn Fanout,
    out: &mut Vec<u8>,
) {
    let msg = match parser.parse(body) {
        Ok(msg) => msg,
        Err(error) => {
            return Refusal {
                error,
                project: Some(auth.entry.clone()),
            }
            .write(out)
        }
    };
    let decision = auth.entry.quota.check(now_ns());
    let rate = Some(rate_headers(&decision));
    if !decision.allowed {
        return write_error(
            out,
            ApiError::RateLimited,
            Extra {
                rate,
                retry_after_s: Some(decision.retry_after_s.max(1)),
                close: false,
            },
        );
    }
    if fanout.shutting_down() {
        return write_error(
            out,
            ApiError::Unavailable("the service is shutting down"),
            Extra {
                rate,
                ..Extra::default()
            },
        );
    }
    let id = ids.next_id();
    let frame = encode::message_frame(msg.channel, msg.event, msg.data, id.as_str());
    let broadcast = Arc::new(Broadcast {
        project: auth.entry.index,
        channel: msg.channel.into(),
        frame,
    });
    if !fanout.broadcast(broadcast) {
        return write_error(
            out,
            ApiError::Unavailable("a shard queue is full; retry shortly"),
            Extra {
                rate,
                ..Extra::default()
            },
        );
    }
    let mut body = [0u8; 32];
    let n = {
        let prefix = b"{\"id\":\"";
        body[..prefix.len()].copy_from_slice(prefix);
        let idb = id.as_str().as_bytes();
        body[prefix.len()..prefix.len() + idb.len()].copy_from_slice(idb);
        let end = prefix.len() + idb.len();
        body[end..end + 2].copy_from_slice(b"\"}");
        end + 2
    };
    write_json(
        out,
        202,
        &body[..n],
        Extra {
            rate,
            ..Extra::default()
        },
    );
}
