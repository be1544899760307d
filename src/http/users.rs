//! Ending a user's access over REST, with the project's secret key (`X-Api-Key`):
//! - `POST /api/v1/users/{user_id}/disconnect` → 202 `{}`;
//! - `POST /api/v1/users/{user_id}/block` `{"until": <unix seconds> | null}` → 202 `{}`;
//! - `DELETE /api/v1/users/{user_id}/block` → 202 `{}` (also when there was none);
//! - `GET /api/v1/users/{user_id}` → 200 `{"user_id","blocked","blocked_until","connections"}`;
//! - `POST /api/v1/channels/unsubscribe` `{"channel","user_id"}` → 202 `{}`.
//!
//! Order of checks: path (404 for an unknown one, 405 for a wrong method) → key (401)
//! → user id (400: percent-decoded, 1 to 200 characters, no control characters) → a body
//! where one is taken: Content-Type (415), declared size over `max_body_bytes` (413),
//! JSON and its fields (400) → the project's publish quota, one unit per call (429) →
//! the store (the key watcher's thread runs the write: 503 when its queue is full or the
//! store fails; 409 `too_many_blocks` over `max_blocked_users_per_project`).
//!
//! What bounds a secret-key holder: every call costs one unit of the project's publish
//! quota (cluster-wide in cluster mode), so a flood of disconnects is a flood of
//! publishes, refused the same way; each accepted call is one small store write (an end
//! record, see [`crate::cluster::users`]), the stored end records are capped, and a
//! project's blocks are capped by `max_blocked_users_per_project`.
//!
//! The node that takes the request ends the user's connections on its own workers at
//! once; the other nodes (and other processes on the same data directory) apply the end
//! record at their next watcher poll. Not a hot path: it allocates freely.

use std::rc::Rc;
use std::sync::Arc;

use super::outcome::{answer, Outcome, Request};
use super::parse::{is_json_media_type, Method};
use super::response::{write_json, write_json_with, Extra};
use super::{ApiError, Service};
use crate::auth::ProjectState;
use crate::cluster::users::{connections_here, end_here, End};
use crate::error::Unavailable;
use crate::project::users::{process_origin, valid_user_id, MAX_UNTIL};
use crate::project::{UserBlockRecord, UserEndRecord};
use crate::quota::now_ns;
use crate::reply::reply;
use crate::store::{unix_now, Store, StoreError};

/// Which user endpoint a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Show,
    Disconnect,
    Block,
    Unblock,
    Unsubscribe,
}

/// `path` after `/api/v1/users/`: `{id}`, `{id}/disconnect` or `{id}/block`.
pub(crate) fn handle_user(r: &Request<'_>, out: &mut Vec<u8>, path: &[u8]) -> Outcome {
    let (svc, head) = (r.svc, r.head);
    let (raw_id, rest) = match memchr::memchr(b'/', path) {
        Some(i) => (&path[..i], &path[i..]),
        None => (path, &b""[..]),
    };
    let delete = is_delete(r.bytes);
    let action = match (rest, head.method(), delete) {
        (b"", Method::Get, _) => Action::Show,
        (b"", ..) => return answer(out, ApiError::MethodNotAllowed("GET")),
        (b"/disconnect", Method::Post, _) => Action::Disconnect,
        (b"/disconnect", ..) => return answer(out, ApiError::MethodNotAllowed("POST")),
        (b"/block", Method::Post, _) => Action::Block,
        (b"/block", _, true) => Action::Unblock,
        (b"/block", ..) => return answer(out, ApiError::MethodNotAllowed("POST, DELETE")),
        _ => return answer(out, ApiError::NotFound),
    };
    let project = match r.secret_project() {
        Ok(p) => p,
        Err(e) => return answer(out, e),
    };
    let user = match crate::percent::decode(raw_id, crate::percent::Plus::Literal) {
        Ok(u) if valid_user_id(&u) => u,
        _ => return answer(out, bad_user_id()),
    };
    match action {
        Action::Show | Action::Unblock if head.has_body() => answer(
            out,
            ApiError::BadRequest("this request must not have a body"),
        ),
        Action::Show | Action::Unblock | Action::Disconnect => {
            if action == Action::Disconnect {
                // An optional body, which must then be a JSON object (ignored).
                if let Err(outcome) = body_object(r, out, true) {
                    return outcome;
                }
            }
            run(svc, out, &project, Call::native(user, action))
        }
        Action::Block => {
            let body = match body_object(r, out, false) {
                Ok(b) => b,
                Err(outcome) => return outcome,
            };
            let until =
                match body.as_ref().and_then(|b| b.get("until")) {
                    None => return answer(out, ApiError::MissingField("until")),
                    Some(serde_json::Value::Null) => None,
                    Some(v) => match until_of(v) {
                        Some(t) => Some(t),
                        None => return answer(
                            out,
                            ApiError::InvalidField(
                                "until",
                                "must be unix seconds (an integer from 0 to 253402300799) or null",
                            ),
                        ),
                    },
                };
            let call = Call {
                until,
                ..Call::native(user, action)
            };
            run(svc, out, &project, call)
        }
        Action::Unsubscribe => answer(out, ApiError::NotFound),
    }
}

/// `POST /api/v1/channels/unsubscribe`.
pub(crate) fn handle_unsubscribe(r: &Request<'_>, out: &mut Vec<u8>) -> Outcome {
    let svc = r.svc;
    if r.head.method() != Method::Post {
        return answer(out, ApiError::MethodNotAllowed("POST"));
    }
    let project = match r.secret_project() {
        Ok(p) => p,
        Err(e) => return answer(out, e),
    };
    let body = match body_object(r, out, false) {
        Ok(b) => b.unwrap_or_default(),
        Err(outcome) => return outcome,
    };
    let channel = match body.get("channel") {
        None => return answer(out, ApiError::MissingField("channel")),
        Some(serde_json::Value::String(c)) if crate::names::check(c).is_ok() => c.clone(),
        Some(_) => {
            return answer(
                out,
                ApiError::InvalidField(
                    "channel",
                    "must be a channel name (1 to 100 characters, no control characters)",
                ),
            )
        }
    };
    let user = match body.get("user_id") {
        None => return answer(out, ApiError::MissingField("user_id")),
        Some(serde_json::Value::String(u)) if valid_user_id(u) => u.clone(),
        Some(_) => return answer(out, bad_user_id()),
    };
    let call = Call {
        channel: Some(channel),
        ..Call::native(user, Action::Unsubscribe)
    };
    run(svc, out, &project, call)
}

/// `until` as unix seconds: an integer, or a number with no fraction (JSON does not tell
/// `5` from `5.0` apart), from 0 to [`MAX_UNTIL`].
fn until_of(v: &serde_json::Value) -> Option<i64> {
    let t = match v.as_i64() {
        Some(t) => t,
        None => {
            let f = v.as_f64()?;
            if f.fract() != 0.0 || !(0.0..=MAX_UNTIL as f64).contains(&f) {
                return None;
            }
            f as i64
        }
    };
    (0..=MAX_UNTIL).contains(&t).then_some(t)
}

pub(super) fn bad_user_id() -> ApiError {
    ApiError::InvalidField(
        "user_id",
        "must be 1 to 200 characters without control characters",
    )
}

/// DELETE is not one of the methods the head parser names (`Method::Other`): read it
/// from the request line, which starts the request.
fn is_delete(req: &[u8]) -> bool {
    req.starts_with(b"DELETE ")
}

/// The request's JSON object body. `optional`: no body is `Ok(None)`. `Err` carries
/// the outcome to return (an answer, or "need more bytes").
fn body_object(
    r: &Request<'_>,
    out: &mut Vec<u8>,
    optional: bool,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, Outcome> {
    let length = r.head.content_length.unwrap_or(0);
    if length == 0 && optional {
        return Ok(None);
    }
    if !r.content_type().is_some_and(is_json_media_type) {
        return Err(answer(out, ApiError::UnsupportedMediaType));
    }
    if length > r.svc.node.config.max_body_bytes {
        return Err(answer(out, ApiError::PayloadTooLarge));
    }
    let Some(body) = r.body() else {
        return Err(Outcome::NeedMore);
    };
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(answer(out, ApiError::NotAnObject)),
        Err(_) => Err(answer(out, ApiError::InvalidJson)),
    }
}

/// What the store thread answers.
enum Done {
    Stored,
    Shown(Option<UserBlockRecord>),
    Failed(ApiError),
}

fn store_failure(e: StoreError) -> ApiError {
    match e {
        StoreError::TooManyBlocks(_) => ApiError::TooManyBlocks,
        other => {
            tracing::warn!(error = %other, "user request: store failed");
            ApiError::Unavailable(Unavailable::StoreUnreachable)
        }
    }
}

/// Which API asked: the native one answers 202 and its quota 429; Pusher's answers 200
/// and its quota 403 (as its other endpoints do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Native,
    Pusher,
}

/// One call of a user endpoint, once its request is checked.
struct Call {
    user: String,
    action: Action,
    /// `block`'s end (unix seconds); `None`: until lifted.
    until: Option<i64>,
    /// `channels/unsubscribe`'s channel.
    channel: Option<String>,
    /// Which REST dialect answers.
    api: Api,
}

impl Call {
    fn native(user: String, action: Action) -> Call {
        Call {
            user,
            action,
            until: None,
            channel: None,
            api: Api::Native,
        }
    }
}

/// Pusher's `terminate_connections` for `user` of an already authenticated project:
/// the native disconnect, answered Pusher's way (200 `{}`).
pub(crate) fn pusher_terminate(
    svc: &Rc<Service>,
    out: &mut Vec<u8>,
    project: &Arc<ProjectState>,
    user: String,
) -> Outcome {
    let call = Call {
        api: Api::Pusher,
        ..Call::native(user, Action::Disconnect)
    };
    run(svc, out, project, call)
}

/// Charge the quota, hand the store work to the watcher's thread, end the user's
/// connections here, and answer once the store has.
fn run(svc: &Rc<Service>, out: &mut Vec<u8>, project: &Arc<ProjectState>, call: Call) -> Outcome {
    let Call {
        user,
        action,
        until,
        channel,
        api,
    } = call;
    if !project.quota.check(now_ns()).allowed {
        let extra = Extra {
            retry_after_s: Some(1),
            ..Extra::default()
        };
        let err = match api {
            Api::Native => ApiError::RateLimited,
            Api::Pusher => ApiError::Forbidden(crate::error::Forbidden::OverQuota),
        };
        super::response::write_error(out, err, extra);
        return Outcome::Answered { close: false };
    }
    let ends = matches!(
        action,
        Action::Disconnect | Action::Block | Action::Unsubscribe
    );
    let record = UserEndRecord {
        seq: 0,
        project_id: project.id.clone(),
        user_id: user.clone(),
        channel: channel.clone(),
        origin: process_origin(),
        created_at: unix_now(),
    };
    let max_blocks = svc.node.config.max_blocked_users_per_project;
    let project_id = project.id.clone();
    let job_user = user.clone();
    let (tx, rx) = reply::<Done>();
    let job = Box::new(move |store: &mut dyn Store| {
        let result = match action {
            Action::Show => store.user_block(&project_id, &job_user).map(Done::Shown),
            Action::Unblock => store
                .unblock_user(&project_id, &job_user)
                .map(|_| Done::Stored),
            Action::Block => store
                .block_user(
                    &UserBlockRecord {
                        project_id: project_id.clone(),
                        user_id: job_user.clone(),
                        until,
                    },
                    max_blocks,
                )
                .and_then(|()| store.add_user_end(&record))
                .map(|()| Done::Stored),
            Action::Disconnect | Action::Unsubscribe => {
                store.add_user_end(&record).map(|()| Done::Stored)
            }
        };
        let done = result.unwrap_or_else(|e| Done::Failed(store_failure(e)));
        // Answered after the watcher's poll: the node's snapshot has the change then.
        Box::new(move || tx.send(Ok(done))) as crate::store::AfterJob
    });
    if svc.node.keys.store_job(job).is_err() {
        return answer(out, ApiError::Unavailable(Unavailable::StoreUnreachable));
    }
    let index = project.index;
    let node = Arc::clone(&svc.node);
    let user: Arc<str> = user.into();
    let end = match &channel {
        Some(c) => End::Unsubscribe(c.as_str().into()),
        None => End::Disconnect,
    };
    // A disconnect or unsubscribe needs nothing from the store to act here: at once.
    // A block waits for the store (409 over the bound must change nothing).
    if matches!(action, Action::Disconnect | Action::Unsubscribe) {
        end_here(&node.mailboxes, index, Arc::clone(&user), end.clone());
    }
    Outcome::Deferred(Box::pin(async move {
        let mut out = Vec::new();
        match rx.wait().await {
            Ok(Done::Stored) => {
                if action == Action::Block {
                    end_here(&node.mailboxes, index, Arc::clone(&user), end);
                    crate::metrics::with(|m| m.user_block());
                }
                if ends && channel.is_none() {
                    crate::metrics::with(|m| m.user_disconnect());
                }
                let status = if api == Api::Pusher { 200 } else { 202 };
                write_json(&mut out, status, b"{}", Extra::default());
            }
            Ok(Done::Shown(block)) => {
                let connections = connections_here(&node.mailboxes, index, &user);
                write_json_with(&mut out, 200, Extra::default(), |body| {
                    body.extend_from_slice(b"{\"user_id\":");
                    crate::json::write_json_str(body, &user);
                    let (blocked, until) = match &block {
                        Some(b) => (true, b.until),
                        None => (false, None),
                    };
                    body.extend_from_slice(format!(",\"blocked\":{blocked}").as_bytes());
                    match until {
                        Some(t) => {
                            body.extend_from_slice(format!(",\"blocked_until\":{t}").as_bytes())
                        }
                        None => body.extend_from_slice(b",\"blocked_until\":null"),
                    }
                    body.extend_from_slice(format!(",\"connections\":{connections}}}").as_bytes());
                });
            }
            Ok(Done::Failed(e)) => {
                answer(&mut out, e);
            }
            Err(_) => {
                answer(
                    &mut out,
                    ApiError::Unavailable(Unavailable::StoreUnreachable),
                );
            }
        }
        out
    }))
}
