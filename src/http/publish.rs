//! `POST /api/v1/publish` and `POST /api/v1/publish/batch` as HTTP: everything the head
//! decides, then the body handed to [`crate::publish::accept`] (or `accept_batch`) and
//! its [`Answer`] written with its rate headers (and, for a refused batch, the index of
//! the first invalid message in the error object).
//!
//! Order, so that the cheapest refusal comes first and a refused request costs no
//! quota: shutting down (503) → key (401) → Content-Type (415) → declared size (413),
//! all four from the head before the body is waited for (a refused request never makes
//! the server buffer its body; the connection then closes, see `conn`). Once the key is
//! known every answer carries the project's rate headers (peeked when nothing was
//! spent).

use std::rc::Rc;
use std::time::Instant;

use super::outcome::{answer, Outcome, Request};
use super::parse::is_json_media_type;
use super::response::{write_error, write_json, Extra, RateHeaders};
use super::{ApiError, Service};
use crate::apikey::KeyKind;
use crate::auth::ProjectState;
use crate::error::Unavailable;
use crate::metrics::Api;
use crate::publish::parse::BatchLimits;
use crate::publish::{Accepted, Answer, Decided, Keyed};
use std::sync::Arc;

/// Which publish endpoint a request is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `POST /api/v1/publish`: one message, to one or several channels.
    One,
    /// `POST /api/v1/publish/batch`: `{"messages": [...]}`.
    Batch,
}

/// Count one answered request of the native publish API (either endpoint).
pub(crate) fn count(status: u16) {
    crate::metrics::with(|m| m.publish_request(Api::Native, status));
}

pub(crate) fn handle(r: &Request<'_>, out: &mut Vec<u8>, endpoint: Endpoint) -> Outcome {
    let (svc, head) = (r.svc, r.head);
    let node = &svc.node;
    let refuse = |out: &mut Vec<u8>, err: ApiError| {
        count(err.status());
        answer(out, err)
    };
    if node.is_shutting_down() {
        return refuse(out, ApiError::Unavailable(Unavailable::ShuttingDown));
    }
    let keys = node.keys.load();
    let project = match keys.authenticate(r.api_key(), KeyKind::Secret) {
        Ok(entry) => &entry.project,
        Err(refusal) => return refuse(out, ApiError::Unauthorized(refusal)),
    };
    if !r.content_type().is_some_and(is_json_media_type) {
        return refuse_known(out, project, ApiError::UnsupportedMediaType);
    }
    let length = head.content_length.unwrap_or(0);
    let max_body = match endpoint {
        Endpoint::One => node.config.max_body_bytes,
        Endpoint::Batch => node.config.max_batch_body_bytes,
    };
    if length > max_body {
        return refuse_known(out, project, ApiError::PayloadTooLarge);
    }
    let Some(body) = r.body() else {
        // Authorized, body still arriving (the head is checked again when it has).
        return Outcome::NeedMore;
    };
    // The request is complete: the publish-duration histogram starts here. Two clock
    // reads per publish, only while metrics are served.
    let started = node.metrics_timing.then(Instant::now);
    if let Some(key) = r.part(&head.idempotency_key) {
        // A keyed request: claimed first (single node) or published by Redis' idempotent
        // script (cluster mode). Without the header, nothing of this is paid.
        let owned = Arc::clone(project);
        let run =
            move |svc: &Rc<Service>, body: &[u8], keyed: Option<&Keyed<'_>>, out: &mut Vec<u8>| {
                publish_body(svc, &owned, body, endpoint, started, keyed, out)
            };
        return super::idempotent::guard(svc, project, key, body, Api::Native, out, run);
    }
    publish_body(svc, project, body, endpoint, started, None, out)
}

/// Parse, validate and publish a complete body; write (or defer) the answer.
fn publish_body(
    svc: &Rc<Service>,
    project: &Arc<ProjectState>,
    body: &[u8],
    endpoint: Endpoint,
    started: Option<Instant>,
    keyed: Option<&Keyed<'_>>,
    out: &mut Vec<u8>,
) -> Outcome {
    let node = &svc.node;
    let decided = {
        let mut parser = svc.parser.borrow_mut();
        match endpoint {
            Endpoint::One => {
                crate::publish::accept(project, body, &mut parser, &svc.ids, &**node, keyed)
            }
            Endpoint::Batch => {
                let limits = BatchLimits {
                    max_messages: node.config.max_batch_messages,
                    max_message_bytes: node.config.max_body_bytes,
                };
                crate::publish::accept_batch(
                    project,
                    body,
                    limits,
                    &mut parser,
                    &svc.ids,
                    &**node,
                    keyed,
                )
            }
        }
    };
    match decided {
        Decided::Now(answer) => {
            finish(out, &answer, started);
            Outcome::Answered { close: false }
        }
        // Cluster mode, a history project or a keyed request: answered once Redis
        // answered.
        Decided::Later(later) => Outcome::Deferred(Box::pin(async move {
            let answer = later.wait().await;
            let mut out = Vec::new();
            finish(&mut out, &answer, started);
            out
        })),
    }
}

/// The metrics of an accepted publish (either API): its quota units and, while metrics
/// are served, its duration up to the hand-over.
pub(crate) fn record_accepted(answer: &Answer, started: Option<Instant>) {
    let elapsed = started.map(|t| t.elapsed());
    let units = u64::from(answer.units);
    crate::metrics::with(|m| {
        m.messages_published(units);
        if let Some(d) = elapsed {
            m.publish_duration(d);
        }
    });
}

/// Count an answer and write it.
fn finish(out: &mut Vec<u8>, answer: &Answer, started: Option<Instant>) {
    let status = match &answer.outcome {
        // Counted as a replay where Redis' answer was decoded.
        Ok(Accepted::Replayed(stored)) => stored.status,
        Ok(_) => {
            record_accepted(answer, started);
            202
        }
        Err(err) => err.status(),
    };
    count(status);
    write_answer(out, answer);
}

/// A refusal decided from the head once the project is known: its rate headers are
/// peeked, so the refusal spends nothing.
fn refuse_known(out: &mut Vec<u8>, project: &ProjectState, err: ApiError) -> Outcome {
    count(err.status());
    let extra = Extra {
        rate: Some(RateHeaders::peek(project)),
        ..Extra::default()
    };
    write_error(out, err, extra);
    Outcome::Answered {
        close: err.closes_connection(),
    }
}

/// The headers every publish answer carries, native or Pusher: the project's rate,
/// `Retry-After`, the failing batch index.
pub(super) fn answer_extra(answer: &Answer) -> Extra {
    Extra {
        rate: Some(RateHeaders::of(&answer.rate)),
        retry_after_s: answer.retry_after_s,
        error_index: answer.index,
        ..Extra::default()
    }
}

fn write_answer(out: &mut Vec<u8>, answer: &Answer) {
    let mut extra = answer_extra(answer);
    match &answer.outcome {
        Ok(Accepted::Replayed(stored)) => {
            extra.replayed = true;
            write_json(out, stored.status, &stored.body, extra);
        }
        Ok(Accepted::One(id, None)) => {
            // `{"id":"<20 hex>"}` without a formatter: this is every accepted publish.
            let mut body = [0u8; 32];
            let prefix = b"{\"id\":\"";
            let idb = id.as_str().as_bytes();
            let end = prefix.len() + idb.len();
            body[..prefix.len()].copy_from_slice(prefix);
            body[prefix.len()..end].copy_from_slice(idb);
            body[end..end + 2].copy_from_slice(b"\"}");
            write_json(out, 202, &body[..end + 2], extra);
        }
        // A batch, or a single-channel publish of a history project (its position too).
        Ok(accepted) => {
            let body = crate::publish::answer_body(accepted).unwrap_or_default();
            write_json(out, 202, &body, extra);
        }
        Err(err) => write_error(out, *err, extra),
    }
}
