//! The `Idempotency-Key` header on the publish endpoints (native `publish`,
//! `publish/batch`, Pusher `events`, `batch_events`), around the endpoint's own work.
//!
//! Reached only when the header is present: an unkeyed publish never comes here. Order:
//! the endpoint's head checks (shutdown, key, Content-Type, size) ran before; then the
//! key is validated (400 `invalid_idempotency_key`), then:
//! - single node: the key is claimed on its owner worker
//!   ([`crate::publish::idempotency`]). A replay is answered with the stored status
//!   and body, `Idempotent-Replayed: true` and the project's rate headers as they are
//!   (peeked: a replay spends no quota); another body gets 422, a request still being
//!   processed 409 with `Retry-After: 1`. A fresh claim runs the endpoint; its answer
//!   is read back from the bytes it wrote: a 2xx is stored (status and body), anything
//!   else releases the key;
//! - cluster mode: the endpoint runs with the key ([`Keyed`]) and Redis' idempotent
//!   script decides (`cluster::idempotency`); nothing is kept on the node.

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use super::outcome::Outcome;
use super::response::{write_error, write_json, Extra, RateHeaders};
use super::{ApiError, Service};
use crate::auth::ProjectState;
use crate::history::backend::KeyTerms;
use crate::metrics::Api;
use crate::publish::idempotency::{self, Claim, Limits, Pending, Stored, Ticket};
use crate::publish::Keyed;

/// Run `run` (the endpoint's publish of a complete body) under `key`.
pub(crate) fn guard<F>(
    svc: &Rc<Service>,
    project: &Arc<ProjectState>,
    key: &[u8],
    body: &[u8],
    api: Api,
    out: &mut Vec<u8>,
    run: F,
) -> Outcome
where
    F: FnOnce(&Rc<Service>, &[u8], Option<&Keyed<'_>>, &mut Vec<u8>) -> Outcome + 'static,
{
    if !idempotency::valid_key(key) {
        return refuse(out, project, api, ApiError::IdempotencyKeyInvalid);
    }
    let cfg = svc.config();
    let hash = idempotency::body_hash(body);
    if svc.node.backend.decides_keys() {
        let keyed = Keyed {
            terms: KeyTerms {
                key,
                body_hash: hash,
                window_ms: cfg.idempotency_window_s.saturating_mul(1000),
                max_keys: cfg.idempotency_max_keys_per_project,
            },
            pusher: api == Api::Pusher,
        };
        return run(svc, body, Some(&keyed), out);
    }
    let limits = Limits::new(
        cfg.idempotency_window_s,
        cfg.idempotency_max_keys_per_project,
        svc.node.mailboxes.workers(),
    );
    let here = svc.shard.index();
    match idempotency::claim(&svc.node.mailboxes, here, limits, project.index, key, hash) {
        Pending::Now(claim, ticket) => {
            let endpoint = Endpoint {
                svc,
                project,
                api,
                run,
            };
            decide(endpoint, claim, ticket, body, out)
        }
        pending => {
            // The key's owner is another worker: answer once it answered (the request
            // was read whole; the body is copied for later).
            let (svc, project, body) = (Rc::clone(svc), Arc::clone(project), body.to_vec());
            Outcome::Deferred(Box::pin(async move {
                let (claim, ticket) = pending.wait().await;
                let mut out = Vec::new();
                let endpoint = Endpoint {
                    svc: &svc,
                    project: &project,
                    api,
                    run,
                };
                match decide(endpoint, claim, ticket, &body, &mut out) {
                    Outcome::Deferred(answer) => answer.await,
                    _ => out,
                }
            }))
        }
    }
}

/// The endpoint a keyed request is for: its worker, its project, its REST dialect and
/// its publish of a complete body.
struct Endpoint<'a, F> {
    svc: &'a Rc<Service>,
    project: &'a Arc<ProjectState>,
    api: Api,
    run: F,
}

/// Answer a claim: the stored answer, a refusal, or the endpoint's work.
fn decide<F>(
    endpoint: Endpoint<'_, F>,
    claim: Claim,
    ticket: Ticket,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Outcome
where
    F: FnOnce(&Rc<Service>, &[u8], Option<&Keyed<'_>>, &mut Vec<u8>) -> Outcome + 'static,
{
    let Endpoint {
        svc,
        project,
        api,
        run,
    } = endpoint;
    match claim {
        Claim::Fresh => {}
        Claim::Replay(stored) => {
            ticket.forget();
            crate::metrics::with(|m| {
                m.idempotent_replay();
                m.publish_request(api, stored.status);
            });
            let extra = Extra {
                rate: Some(RateHeaders::peek(project)),
                replayed: true,
                ..Extra::default()
            };
            write_json(out, stored.status, &stored.body, extra);
            return Outcome::Answered { close: false };
        }
        Claim::Reused => {
            ticket.forget();
            crate::metrics::with(|m| m.idempotency_key_reused());
            return refuse(out, project, api, ApiError::IdempotencyKeyReused);
        }
        Claim::InProgress => {
            ticket.forget();
            crate::metrics::with(|m| m.idempotency_in_progress());
            return refuse(out, project, api, ApiError::IdempotencyKeyInProgress);
        }
    }
    let start = out.len();
    match run(svc, body, None, out) {
        Outcome::Answered { close } => {
            settle(ticket, &out[start..]);
            Outcome::Answered { close }
        }
        Outcome::Deferred(answer) => Outcome::Deferred(Box::pin(async move {
            let bytes = answer.await;
            settle(ticket, &bytes);
            bytes
        })),
        // A complete body never asks for more or upgrades; the key is free again.
        other => {
            ticket.release();
            other
        }
    }
}

/// Keep the answer of an accepted request (2xx); free the key of a refused one.
fn settle(ticket: Ticket, response: &[u8]) {
    match split_response(response) {
        Some((status, body)) if (200..300).contains(&status) => ticket.complete(Stored {
            status,
            body: Bytes::copy_from_slice(body),
        }),
        _ => ticket.release(),
    }
}

/// The status and body of one response written by `response::write_json`.
fn split_response(response: &[u8]) -> Option<(u16, &[u8])> {
    let status = std::str::from_utf8(response.get(9..12)?)
        .ok()?
        .parse()
        .ok()?;
    let end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some((status, &response[end + 4..]))
}

/// A refusal of the key itself: counted, with the rate headers peeked.
fn refuse(out: &mut Vec<u8>, project: &ProjectState, api: Api, err: ApiError) -> Outcome {
    crate::metrics::with(|m| m.publish_request(api, err.status()));
    let extra = Extra {
        rate: Some(RateHeaders::peek(project)),
        ..Extra::default()
    };
    write_error(out, err, extra);
    Outcome::Answered { close: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_split_into_status_and_body() {
        let mut out = Vec::new();
        write_json(&mut out, 202, b"{\"id\":\"x\"}", Extra::default());
        assert_eq!(split_response(&out), Some((202, &b"{\"id\":\"x\"}"[..])));
        let mut out = Vec::new();
        write_error(&mut out, ApiError::RateLimited, Extra::default());
        assert_eq!(split_response(&out).map(|r| r.0), Some(429));
        assert_eq!(split_response(b"HTTP/1.1"), None);
    }
}
