//! Pusher's REST API (design: docs/design/pusher.md, section 4): a project is a Pusher
//! app whose app id is its `pusher_app_id`, whose key is any of its active public keys
//! and whose secret is its token secret.
//!
//! - `POST /apps/{app_id}/events`: one event to 1..=100 channels → `{}`, or the counts
//!   its `info` asked for, per channel;
//! - `POST /apps/{app_id}/batch_events`: 1..=`max_batch_messages` events, all or nothing
//!   → `{}`, or `{"batch":[...]}` with the counts each event's `info` asked for;
//! - `GET /apps/{app_id}/channels` (`filter_by_prefix`, `info`), `.../channels/{channel}`
//!   (`info`), `.../channels/{channel}/users`: occupancy and presence from the presence
//!   hub, as `/api/v1/channels` answers them (deferred, cluster-wide in cluster mode).
//!
//! Checks, in the order of design 4.1, the first failure answering: route and method
//! (404/405) → declared size (413; a GET with a body 400) → query parse (400
//! `invalid_query`: a key twice, a bad escape) → auth parameters, version, timestamp
//! window, `body_md5` present for a body, signature format (401) → app id, `auth_key` an
//! active public key of that app, and the signature under the project's token secrets
//! in force (401, one message for all three) → the body, now read: `body_md5` (401) →
//! the project's Pusher switch (403) → POST Content-Type (400) → body validation (400,
//! with `index` in a batch) → quota (403 + `Retry-After`) → hand-over (503) → 200.
//! Everything up to the signature is decided from the head (it covers `body_md5`), so
//! a request not signed with the secret never makes the server wait for, or hold, its
//! body.
//!
//! Invariants:
//! - A publish is the native one: the validated events become the native parser's
//!   [`crate::publish::parse::Publish`] and go through the same quota, encoding, history
//!   and mailbox hand-over ([`crate::publish::publish_one`], `publish_batch`); `data`,
//!   a JSON string, becomes the native frame's `data` as that same string literal, so a
//!   native subscriber receives a string and a Pusher subscriber the same text.
//! - Nothing unsigned learns about a project: the Pusher switch is looked at only after
//!   the signature, and rate headers are sent only on answers of the publish pipeline.
//! - No key, secret, signature or digest is ever logged or echoed: nothing here logs,
//!   and error messages name what to fix, never an expected value.
//! - Errors have the native shape `{"error":{"code","message"}}`; the quota answers 403
//!   (Pusher's status for "over quota"), not the native 429.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::outcome::{answer, Outcome, Request};
use super::parse::{is_json_media_type, Method};
use super::publish::{answer_extra, Endpoint as Publishing};
use super::response::{write_error, write_json, write_json_with, Extra, RateHeaders};
use super::{ApiError, Service};
use crate::apikey::KeyKind;
use crate::auth::cache::KeySnapshot;
use crate::auth::pusher::{
    auth_key, check_body, check_head, check_signature, parse_query, percent_decode, Query,
    QueryError, RestAuthError,
};
use crate::auth::ProjectState;
use crate::error::{Forbidden, Unavailable};
use crate::json::write_json_str;
use crate::metrics::Api;
use crate::presence::{ChannelInfo, Hub, Query as HubQuery, MAX_LISTED};
use crate::publish::parse::{validate_name, BatchLimits};
use crate::publish::pusher::Info;
use crate::publish::{Accepted, Answer, Decided, Keyed, PublishParser};

/// The parameters a request may carry besides the endpoint's own: the signature's.
const AUTH_PARAMS: [&str; 5] = [
    "auth_key",
    "auth_timestamp",
    "auth_version",
    "auth_signature",
    "body_md5",
];

/// Which endpoint a path under `/apps/{app_id}/` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint<'a> {
    Events,
    Batch,
    Channels,
    /// The `{channel}` segment, still percent-encoded.
    Channel(&'a [u8]),
    Users(&'a [u8]),
    /// `POST users/{user_id}/terminate_connections` (the user id still percent-encoded;
    /// served by [`super::pusher_terminate`]).
    Terminate(&'a [u8]),
}

impl Endpoint<'_> {
    /// The native publish endpoint this one is the Pusher form of: `events` publishes
    /// one message, `batch_events` a batch; `None` for the reads.
    fn publishing(self) -> Option<Publishing> {
        match self {
            Endpoint::Events => Some(Publishing::One),
            Endpoint::Batch => Some(Publishing::Batch),
            _ => None,
        }
    }
}

/// Split what follows `/apps/` into the app id segment and the endpoint; `None` for a
/// path no endpoint has (404).
fn split(rest: &[u8]) -> Option<(&[u8], Endpoint<'_>)> {
    let mut parts = rest.split(|&b| b == b'/');
    let app_id = parts.next()?;
    let endpoint = match (parts.next()?, parts.next(), parts.next(), parts.next()) {
        (b"events", None, ..) => Endpoint::Events,
        (b"batch_events", None, ..) => Endpoint::Batch,
        (b"channels", None, ..) => Endpoint::Channels,
        (b"channels", Some(c), None, _) if !c.is_empty() => Endpoint::Channel(c),
        (b"channels", Some(c), Some(b"users"), None) if !c.is_empty() => Endpoint::Users(c),
        (b"users", Some(u), Some(b"terminate_connections"), None) if !u.is_empty() => {
            Endpoint::Terminate(u)
        }
        _ => return None,
    };
    Some((app_id, endpoint))
}

/// Count one answered request of the Pusher publish API (`events`, `batch_events`).
fn count(status: u16) {
    crate::metrics::with(|m| m.publish_request(Api::Pusher, status));
}

/// Serve a request whose path starts with `/apps/`; `rest` is the path after it.
pub(crate) fn handle(r: &Request<'_>, out: &mut Vec<u8>, rest: &[u8]) -> Outcome {
    let (svc, head) = (r.svc, r.head);
    // 1. Route and method.
    let Some((app_id, endpoint)) = split(rest) else {
        return answer(out, ApiError::NotFound);
    };
    let publishing = endpoint.publishing();
    let publish = publishing.is_some();
    let refuse = |out: &mut Vec<u8>, err: ApiError| {
        if publish {
            count(err.status());
        }
        answer(out, err)
    };
    let terminate = matches!(endpoint, Endpoint::Terminate(_));
    let (method, method_name) = if publish || terminate {
        (Method::Post, "POST")
    } else {
        (Method::Get, "GET")
    };
    if head.method() != method {
        return refuse(out, ApiError::MethodNotAllowed(method_name));
    }

    // 2. Declared size, from the head: the body is never waited for when too large.
    let cfg = svc.config();
    let length = head.content_length.unwrap_or(0);
    let too_large = match endpoint {
        Endpoint::Events => length > cfg.max_body_bytes,
        Endpoint::Batch => length > cfg.max_batch_body_bytes,
        Endpoint::Terminate(_) => length > cfg.max_body_bytes,
        _ => false,
    };
    if too_large {
        return refuse(out, ApiError::PayloadTooLarge);
    }
    if !publish && !terminate && head.has_body() {
        return refuse(
            out,
            ApiError::BadRequest("a GET request of the Pusher API must not have a body"),
        );
    }

    // 3. The query: every parameter once.
    let q = match parse_query(r.query()) {
        Ok(q) => q,
        Err(e) => return refuse(out, ApiError::InvalidQuery(query_message(&e))),
    };

    // 4.–6. Auth parameters present, version, timestamp window; body_md5 present for a
    // body, the signature's format: nothing that depends on the app.
    let now = crate::client::private::unix_now();
    let tag = match check_head(&q, length, now) {
        Ok(tag) => tag,
        Err(e) => return refuse(out, ApiError::PusherUnauthorized(e)),
    };

    // 7.–8. The app, auth_key one of its active public keys, and the signature (it
    // covers body_md5), all from the head: a request signed without the secret is
    // refused before its body is read, and with one message whatever was wrong.
    let keys = svc.node.keys.load();
    let Some(project) = app_of(&keys, app_id, &q) else {
        return refuse(out, ApiError::PusherUnauthorized(RestAuthError::UnknownApp));
    };
    let secrets = keys
        .token_keys(project.index)
        .map_or_else(Vec::new, |k| k.secrets_at(now));
    // A path that is not UTF-8 cannot have been signed by an SDK.
    let signed = std::str::from_utf8(r.path())
        .map_err(|_| RestAuthError::Signature)
        .and_then(|path| check_signature(method_name, path, &q, &tag, &secrets));
    if let Err(e) = signed {
        return refuse(out, ApiError::PusherUnauthorized(e));
    }

    // 9. The body (its size was bounded in step 2) is the one signed: body_md5.
    let Some(body) = r.body() else {
        return Outcome::NeedMore;
    };
    // The request is complete: the publish-duration histogram starts here, as native.
    let started = (publish && svc.node.metrics_timing).then(Instant::now);
    if let Err(e) = check_body(&q, body) {
        return refuse(out, ApiError::PusherUnauthorized(e));
    }

    // 10. The project's Pusher switch (after the signature: see the module doc).
    if !project.pusher_enabled() {
        return refuse(out, ApiError::Forbidden(Forbidden::PusherDisabled));
    }

    // 11. A publish body is JSON (Pusher has no 415; the SDKs always send the header).
    if publish && !r.content_type().is_some_and(is_json_media_type) {
        return refuse(
            out,
            ApiError::BadRequest("Content-Type must be application/json"),
        );
    }

    // 12. The endpoint (a keyed publish under its key: `super::idempotent`).
    let project = Arc::clone(project);
    drop(keys);
    if let (Some(shape), Some(key)) = (publishing, r.part(&head.idempotency_key)) {
        let owned = Arc::clone(&project);
        let run =
            move |svc: &Rc<Service>, body: &[u8], keyed: Option<&Keyed<'_>>, out: &mut Vec<u8>| {
                publish_events(svc, &owned, body, shape, out, started, keyed)
            };
        return super::idempotent::guard(svc, &project, key, body, Api::Pusher, out, run);
    }
    match endpoint {
        Endpoint::Events => {
            publish_events(svc, &project, body, Publishing::One, out, started, None)
        }
        Endpoint::Batch => {
            publish_events(svc, &project, body, Publishing::Batch, out, started, None)
        }
        Endpoint::Channels => channels(svc, project.index, &q, out),
        Endpoint::Channel(raw) => channel(svc, project.index, raw, &q, out),
        Endpoint::Users(raw) => users(svc, project.index, raw, &q, out),
        Endpoint::Terminate(raw) => super::pusher_terminate::handle(svc, &project, raw, out),
    }
}

/// The project the path's app id names, when `auth_key` is an active public key of that
/// same project (a project may have several; any of them signs).
fn app_of<'k>(keys: &'k KeySnapshot, app_id: &[u8], q: &Query) -> Option<&'k Arc<ProjectState>> {
    // At most 19 digits: always fits a u64.
    if app_id.is_empty() || app_id.len() > 19 || !app_id.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let id: u64 = std::str::from_utf8(app_id).ok()?.parse().ok()?;
    let project = keys.project_by_app_id(id)?;
    let entry = keys.lookup(auth_key(q)?)?;
    (entry.kind == KeyKind::Public && entry.project.index == project.index).then_some(project)
}

/// The 400 message of a query that does not parse. A duplicate is named when it is one
/// of the parameters the API knows (anything else could be any text).
fn query_message(e: &QueryError) -> &'static str {
    match e {
        QueryError::Duplicate(key) => match key.as_str() {
            "auth_key" => "query parameter auth_key is given more than once",
            "auth_timestamp" => "query parameter auth_timestamp is given more than once",
            "auth_version" => "query parameter auth_version is given more than once",
            "auth_signature" => "query parameter auth_signature is given more than once",
            "body_md5" => "query parameter body_md5 is given more than once",
            "info" => "query parameter info is given more than once",
            "filter_by_prefix" => "query parameter filter_by_prefix is given more than once",
            _ => "a query parameter is given more than once (names compare case-insensitively)",
        },
        QueryError::TooMany => "the query string has more than 32 parameters",
        QueryError::Percent => {
            "the query string has a '%' that is not followed by two hexadecimal digits"
        }
        QueryError::Utf8 => "a query parameter is not valid UTF-8 once percent-decoded",
    }
}

/// The counts a publish asked for with `info`, to answer once it is handed over.
enum Asked {
    /// `events`: the counts of each channel published to.
    Channels(Info, Vec<Box<str>>),
    /// `batch_events`: per event, its channel's counts when it asked for them.
    Batch(Vec<Option<(Info, Box<str>)>>),
}

/// `POST /apps/{app_id}/events` ([`Publishing::One`]) or `batch_events`.
fn publish_events(
    svc: &Rc<Service>,
    project: &Arc<ProjectState>,
    body: &[u8],
    shape: Publishing,
    out: &mut Vec<u8>,
    started: Option<Instant>,
    keyed: Option<&Keyed<'_>>,
) -> Outcome {
    let parsed = {
        let mut parser = svc.parser.borrow_mut();
        decide(svc, &mut parser, project, body, shape, keyed)
    };
    match parsed {
        Ok((decided, asked)) => finish(svc, project.index, decided, asked, out, started),
        Err((err, index)) => refuse_known(out, project, err, index),
    }
}

/// What a publish decided and the counts it asked for, or the body's 400 (with the
/// failing event's index in a batch).
type Parsed = Result<(Decided, Option<Asked>), (ApiError, Option<usize>)>;

/// Parse and publish `events` (one event to one or several channels) or `batch_events`
/// (several, each to one channel).
fn decide(
    svc: &Service,
    parser: &mut PublishParser,
    project: &Arc<ProjectState>,
    body: &[u8],
    shape: Publishing,
    keyed: Option<&Keyed<'_>>,
) -> Parsed {
    let (ids, node) = (&svc.ids, &*svc.node);
    if shape == Publishing::One {
        let event = parser.parse_pusher(body).map_err(|err| (err, None))?;
        let asked = event.info.map(|info| {
            let names = event.msg.channels.as_slice().iter();
            Asked::Channels(info, names.map(|&c| c.into()).collect())
        });
        let decided = crate::publish::publish_one(project, &event.msg, ids, node, keyed);
        return Ok((decided, asked));
    }
    let cfg = svc.config();
    let limits = BatchLimits {
        max_messages: cfg.max_batch_messages,
        max_message_bytes: cfg.max_body_bytes,
    };
    let events = parser
        .parse_pusher_batch(body, limits)
        .map_err(|e| (e.error, e.index))?;
    let asked = events.iter().any(|e| e.info.is_some()).then(|| {
        let per_event = events
            .iter()
            .map(|e| e.info.map(|i| (i, e.msg.channel().into())));
        Asked::Batch(per_event.collect())
    });
    let msgs: Vec<_> = events.into_iter().map(|e| e.msg).collect();
    let decided = crate::publish::publish_batch(project, &msgs, ids, node, keyed);
    Ok((decided, asked))
}

/// A 400 of the body's validation: nothing was spent, the rate headers are peeked.
fn refuse_known(
    out: &mut Vec<u8>,
    project: &ProjectState,
    err: ApiError,
    index: Option<usize>,
) -> Outcome {
    count(err.status());
    let extra = Extra {
        rate: Some(RateHeaders::peek(project)),
        error_index: index,
        ..Extra::default()
    };
    write_error(out, err, extra);
    Outcome::Answered {
        close: err.closes_connection(),
    }
}

/// Count and write a publish's answer: now, or once Redis placed it (cluster mode, a
/// history project) and, when `info` asked, once the hub gave the counts.
fn finish(
    svc: &Rc<Service>,
    project: u32,
    decided: Decided,
    asked: Option<Asked>,
    out: &mut Vec<u8>,
    started: Option<Instant>,
) -> Outcome {
    let hub = Arc::clone(&svc.node.presence);
    match decided {
        Decided::Now(answer) => {
            record(&answer, started);
            match asked.filter(|_| answer.outcome.is_ok()) {
                None => {
                    write_answer(out, &answer, b"{}");
                    Outcome::Answered {
                        close: answer
                            .outcome
                            .as_ref()
                            .is_err_and(|e| e.closes_connection()),
                    }
                }
                Some(asked) => Outcome::Deferred(Box::pin(async move {
                    let body = counts_body(&hub, project, asked).await;
                    let mut out = Vec::new();
                    write_answer(&mut out, &answer, &body);
                    out
                })),
            }
        }
        Decided::Later(later) => Outcome::Deferred(Box::pin(async move {
            let answer = later.wait().await;
            record(&answer, started);
            let fresh = matches!(answer.outcome, Ok(Accepted::One(..) | Accepted::Many(_)));
            let body = match asked.filter(|_| fresh) {
                None => b"{}".to_vec(),
                Some(asked) => counts_body(&hub, project, asked).await,
            };
            let mut out = Vec::new();
            write_answer(&mut out, &answer, &body);
            out
        })),
    }
}

/// The native refusal as Pusher answers it: the quota is a 403 (with `Retry-After` when
/// waiting helps), not a 429.
fn pusher_error(err: ApiError) -> ApiError {
    match err {
        ApiError::RateLimited => ApiError::Forbidden(Forbidden::OverQuota),
        ApiError::OverBurst => ApiError::Forbidden(Forbidden::OverBurst),
        other => other,
    }
}

/// The metrics of one decided publish: its status, and on success its units and (while
/// metrics are served) its duration up to the hand-over (not the count queries).
fn record(answer: &Answer, started: Option<Instant>) {
    let status = match &answer.outcome {
        // A keyed request answered from Redis (cluster mode): nothing was published.
        Ok(Accepted::Replayed(stored)) => stored.status,
        Ok(_) => {
            super::publish::record_accepted(answer, started);
            200
        }
        Err(err) => pusher_error(*err).status(),
    };
    count(status);
}

fn write_answer(out: &mut Vec<u8>, answer: &Answer, ok_body: &[u8]) {
    let mut extra = answer_extra(answer);
    match &answer.outcome {
        Ok(Accepted::Replayed(stored)) => {
            extra.replayed = true;
            write_json(out, stored.status, &stored.body, extra)
        }
        Ok(_) => write_json(out, 200, ok_body, extra),
        Err(err) => write_error(out, pusher_error(*err), extra),
    }
}

/// Ask the hub for the counts of `channels`, all questions sent before the first answer
/// is awaited. `None` for a channel the hub could not answer for.
async fn ask_counts<'c>(
    hub: &Hub,
    project: u32,
    channels: impl Iterator<Item = &'c str>,
) -> Vec<Option<ChannelInfo>> {
    let pending: Vec<_> = channels
        .map(|channel| {
            hub.ask(|reply| HubQuery::Info {
                project,
                channel: channel.into(),
                reply,
            })
        })
        .collect();
    let mut counts = Vec::with_capacity(pending.len());
    for rx in pending {
        counts.push(rx.wait().await.ok());
    }
    counts
}

/// The 200 body of a publish whose `info` asked for counts. The counts are taken after
/// the hand-over and independently of the delivery (Pusher says the same of its own).
/// The message is published whatever happens here, so a count the hub cannot give
/// leaves that channel's attributes empty rather than failing the request (which would
/// make the publisher send it again).
async fn counts_body(hub: &Hub, project: u32, asked: Asked) -> Vec<u8> {
    let mut body = Vec::with_capacity(64);
    match asked {
        Asked::Channels(info, names) => {
            let counts = ask_counts(hub, project, names.iter().map(|c| &**c)).await;
            body.extend_from_slice(b"{\"channels\":{");
            for (i, (name, count)) in names.iter().zip(counts).enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                write_json_str(&mut body, name);
                body.push(b':');
                write_attrs(&mut body, info, count);
            }
            body.extend_from_slice(b"}}");
        }
        Asked::Batch(per_event) => {
            let names = per_event.iter().flatten().map(|(_, c)| &**c);
            let mut counts = ask_counts(hub, project, names).await.into_iter();
            body.extend_from_slice(b"{\"batch\":[");
            for (i, asked) in per_event.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                match asked {
                    Some((info, _)) => write_attrs(&mut body, *info, counts.next().flatten()),
                    None => body.extend_from_slice(b"{}"),
                }
            }
            body.extend_from_slice(b"]}");
        }
    }
    body
}

/// `{"user_count":M,"subscription_count":N}` with the attributes `info` asked for
/// (`user_count` only where the channel has users: a presence channel).
fn write_attrs(body: &mut Vec<u8>, info: Info, count: Option<ChannelInfo>) {
    body.push(b'{');
    if let Some(count) = count {
        let mut sep = "";
        if let (true, Some(users)) = (info.user_count, count.user_count) {
            body.extend_from_slice(format!("\"user_count\":{users}").as_bytes());
            sep = ",";
        }
        if info.subscription_count {
            body.extend_from_slice(
                format!("{sep}\"subscription_count\":{}", count.subscribers).as_bytes(),
            );
        }
    }
    body.push(b'}');
}

/// The `info` query parameter (absent: no attributes).
fn info_param(q: &Query) -> Result<Info, ApiError> {
    q.get("info").map_or(Ok(Info::default()), Info::parse)
}

/// The `{channel}` segment: percent-decoded (the signature covered it raw), a valid name.
fn channel_segment(raw: &[u8]) -> Result<String, ApiError> {
    let name = percent_decode(raw).map_err(|_| {
        ApiError::InvalidField("channel", "in the path is not valid percent-encoded UTF-8")
    })?;
    validate_name("channel", &name)?;
    Ok(name)
}

/// An answer from the hub, or the 503 when it cannot be asked.
fn deferred(fill: impl std::future::Future<Output = Option<Vec<u8>>> + 'static) -> Outcome {
    Outcome::Deferred(Box::pin(async move {
        let mut out = Vec::new();
        match fill.await {
            // `out` is empty: the body becomes it and the head goes in front (a large
            // listing is not copied).
            Some(body) => write_json_with(&mut out, 200, Extra::default(), |o| *o = body),
            None => {
                answer(
                    &mut out,
                    ApiError::Unavailable(Unavailable::StateUnreachable),
                );
            }
        }
        out
    }))
}

/// `GET /apps/{app_id}/channels`: the occupied channels (with `filter_by_prefix`, those
/// whose name starts with it), sorted, at most [`MAX_LISTED`] (10,000) and then
/// `"truncated": true`, each with the attributes `info` asked for (`user_count` only when
/// the prefix limits the listing to presence channels).
fn channels(svc: &Rc<Service>, project: u32, q: &Query, out: &mut Vec<u8>) -> Outcome {
    let prefix = q.get("filter_by_prefix").unwrap_or("");
    if prefix.chars().count() > 100 {
        return answer(
            out,
            ApiError::InvalidField("filter_by_prefix", "must be at most 100 characters"),
        );
    }
    let info = match info_param(q) {
        Ok(info) => info,
        Err(e) => return answer(out, e),
    };
    if info.user_count && !prefix.starts_with("presence-") {
        return answer(
            out,
            ApiError::InvalidInfo(
                "info=user_count needs filter_by_prefix starting with presence- (only presence channels have users)",
            ),
        );
    }
    let rx = svc.node.presence.ask(|reply| HubQuery::Channels {
        project,
        prefix: prefix.into(),
        users: info.user_count,
        reply,
    });
    deferred(async move {
        let list = rx.wait().await.ok()?;
        let mut body = Vec::with_capacity(32 + 48 * list.len().min(MAX_LISTED));
        body.extend_from_slice(b"{\"channels\":{");
        for (i, ch) in list.iter().take(MAX_LISTED).enumerate() {
            if i > 0 {
                body.push(b',');
            }
            write_json_str(&mut body, &ch.name);
            body.push(b':');
            let count = ChannelInfo {
                subscribers: ch.subscribers,
                user_count: ch.user_count,
            };
            write_attrs(&mut body, info, Some(count));
        }
        body.push(b'}');
        // The hub answers one more than listed when there are more.
        if list.len() > MAX_LISTED {
            body.extend_from_slice(b",\"truncated\":true");
        }
        body.push(b'}');
        Some(body)
    })
}

/// `GET /apps/{app_id}/channels/{channel}`: `occupied` always, and the attributes `info`
/// asked for (0 when the channel is not occupied).
fn channel(svc: &Rc<Service>, project: u32, raw: &[u8], q: &Query, out: &mut Vec<u8>) -> Outcome {
    let name = match channel_segment(raw) {
        Ok(name) => name,
        Err(e) => return answer(out, e),
    };
    let info = match info_param(q).and_then(|i| i.check_channels(&[name.as_str()])) {
        Ok(info) => info,
        Err(e) => return answer(out, e),
    };
    let rx = svc.node.presence.ask(|reply| HubQuery::Info {
        project,
        channel: name.into(),
        reply,
    });
    deferred(async move {
        let count = rx.wait().await.ok()?;
        let mut body = Vec::with_capacity(80);
        body.extend_from_slice(format!("{{\"occupied\":{}", count.subscribers > 0).as_bytes());
        let mut attrs = Vec::with_capacity(64);
        write_attrs(&mut attrs, info, Some(count));
        // `{...}` → `,...`: the attributes follow `occupied` in the same object.
        if attrs.len() > 2 {
            body.push(b',');
            body.extend_from_slice(&attrs[1..attrs.len() - 1]);
        }
        body.push(b'}');
        Some(body)
    })
}

/// `GET /apps/{app_id}/channels/{channel}/users`: a presence channel's user ids, in
/// join order. No parameter besides the signature's is accepted (Pusher: "no additional
/// parameters needed or allowed").
fn users(svc: &Rc<Service>, project: u32, raw: &[u8], q: &Query, out: &mut Vec<u8>) -> Outcome {
    if q.iter().any(|(k, _)| !AUTH_PARAMS.contains(&k)) {
        return answer(
            out,
            ApiError::InvalidQuery(
                "GET .../channels/{channel}/users takes no parameters besides auth_key, auth_timestamp, auth_version, auth_signature and body_md5",
            ),
        );
    }
    let name = match channel_segment(raw) {
        Ok(name) => name,
        Err(e) => return answer(out, e),
    };
    if !crate::shard::is_presence(&name) {
        return answer(
            out,
            ApiError::InvalidField("channel", "must be a presence channel (presence-...)"),
        );
    }
    let rx = svc.node.presence.ask(|reply| HubQuery::Members {
        project,
        channel: name.into(),
        reply,
    });
    deferred(async move {
        let members = rx.wait().await.ok()?.members;
        let mut body = Vec::with_capacity(16 + 24 * members.len());
        body.extend_from_slice(b"{\"users\":[");
        for (i, (user, _)) in members.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(b"{\"id\":");
            write_json_str(&mut body, user);
            body.push(b'}');
        }
        body.extend_from_slice(b"]}");
        Some(body)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_app_and_endpoint() {
        assert_eq!(
            split(b"1000000/events"),
            Some((&b"1000000"[..], Endpoint::Events))
        );
        assert_eq!(split(b"1/batch_events"), Some((&b"1"[..], Endpoint::Batch)));
        assert_eq!(split(b"1/channels"), Some((&b"1"[..], Endpoint::Channels)));
        assert_eq!(
            split(b"1/channels/presence-a%20b"),
            Some((&b"1"[..], Endpoint::Channel(b"presence-a%20b")))
        );
        assert_eq!(
            split(b"1/channels/presence-a/users"),
            Some((&b"1"[..], Endpoint::Users(b"presence-a")))
        );
        assert_eq!(
            split(b"1/users/u%201/terminate_connections"),
            Some((&b"1"[..], Endpoint::Terminate(b"u%201")))
        );
        for none in [
            &b""[..],
            b"1",
            b"1/",
            b"1/events/",
            b"1/channels/",
            b"1/channels//users",
            b"1/channels/a/users/",
            b"1/channels/a/members",
            b"1/users//terminate_connections",
            b"1/users/u1/terminate_connections/",
        ] {
            assert_eq!(split(none), None, "{}", String::from_utf8_lossy(none));
        }
    }

    #[test]
    fn attributes_are_the_ones_asked_for() {
        let both = Info {
            subscription_count: true,
            user_count: true,
        };
        let count = ChannelInfo {
            subscribers: 3,
            user_count: Some(2),
        };
        let mut b = Vec::new();
        write_attrs(&mut b, both, Some(count));
        assert_eq!(b, br#"{"user_count":2,"subscription_count":3}"#);
        let mut b = Vec::new();
        let public = ChannelInfo {
            subscribers: 3,
            user_count: None,
        };
        write_attrs(&mut b, both, Some(public));
        assert_eq!(b, br#"{"subscription_count":3}"#);
        let mut b = Vec::new();
        write_attrs(&mut b, Info::default(), Some(count));
        assert_eq!(b, b"{}");
        let mut b = Vec::new();
        write_attrs(&mut b, both, None);
        assert_eq!(b, b"{}");
    }

    #[test]
    fn quota_refusals_become_403() {
        assert_eq!(pusher_error(ApiError::RateLimited).status(), 403);
        assert_eq!(pusher_error(ApiError::OverBurst).status(), 403);
        assert_eq!(pusher_error(ApiError::RateLimited).code(), "rate_limited");
        assert_eq!(pusher_error(ApiError::InvalidJson), ApiError::InvalidJson);
    }
}
