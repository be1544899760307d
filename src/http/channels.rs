//! Occupancy and presence over REST, with the project's secret key:
//! - `GET /api/v1/channels?prefix=P`: the project's channels with at least one
//!   subscriber now, sorted by name, at most [`MAX_LISTED`] (10,000), with
//!   `"truncated": true` when there were more (the answer is bounded: a few MiB at most);
//! - `GET /api/v1/channels/info?channel=C`: one channel's subscriber count (and
//!   `user_count` on presence channels);
//! - `GET /api/v1/presence?channel=presence-C`: a presence channel's members.
//!
//! Order of checks: key (401) → query (400) → the hub's answer (200, or 503 when it
//! cannot be asked). The answers come from the node's presence hub, asked through a
//! one-shot reply: the worker never waits on a lock. Not a hot path: it allocates
//! freely.

use super::history::percent_decode;
use super::outcome::{answer, Outcome, Request};
use super::parse::query_param;
use super::response::{write_json, write_json_with, Extra};
use super::ApiError;
use crate::error::Unavailable;
use crate::json::write_json_str;
use crate::presence::{write_members, Query, MAX_LISTED};

/// Which of the three questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    List,
    Info,
    Presence,
}

pub(crate) fn handle(r: &Request<'_>, out: &mut Vec<u8>, ask: Ask) -> Outcome {
    let svc = r.svc;
    let project = match r.secret_project() {
        Ok(project) => project.index,
        Err(err) => return answer(out, err),
    };
    let query = r.query();
    let hub = &svc.node.presence;
    match ask {
        Ask::List => {
            let prefix = match query_param(query, b"prefix").map(percent_decode) {
                None => String::new(),
                Some(Some(p)) if p.chars().count() <= 100 => p,
                Some(Some(_)) => {
                    return answer(
                        out,
                        ApiError::InvalidField("prefix", "must be at most 100 characters"),
                    )
                }
                Some(None) => {
                    return answer(out, ApiError::InvalidField("prefix", "is not valid UTF-8"))
                }
            };
            let rx = hub.ask(|reply| Query::Channels {
                project,
                prefix: prefix.into(),
                users: false,
                reply,
            });
            Outcome::Deferred(Box::pin(async move {
                let mut out = Vec::new();
                match rx.wait().await {
                    Ok(list) => write_json_with(&mut out, 200, Extra::default(), |body| {
                        body.reserve(32 + 40 * list.len().min(MAX_LISTED));
                        body.extend_from_slice(b"{\"channels\":[");
                        for (i, ch) in list.iter().take(MAX_LISTED).enumerate() {
                            if i > 0 {
                                body.push(b',');
                            }
                            body.extend_from_slice(b"{\"name\":");
                            write_json_str(body, &ch.name);
                            body.extend_from_slice(
                                format!(",\"subscribers\":{}}}", ch.subscribers).as_bytes(),
                            );
                        }
                        body.push(b']');
                        // The hub answers one more than listed when there are more.
                        if list.len() > MAX_LISTED {
                            body.extend_from_slice(b",\"truncated\":true");
                        }
                        body.push(b'}');
                    }),
                    Err(_) => unreachable_state(&mut out),
                }
                out
            }))
        }
        Ask::Info | Ask::Presence => {
            let channel = match channel_param(query) {
                Ok(c) => c,
                Err(e) => return answer(out, e),
            };
            if ask == Ask::Presence && !crate::shard::is_presence(&channel) {
                return answer(
                    out,
                    ApiError::InvalidField("channel", "must be a presence channel (presence-...)"),
                );
            }
            if ask == Ask::Info {
                let rx = hub.ask(|reply| Query::Info {
                    project,
                    channel: channel.as_str().into(),
                    reply,
                });
                return Outcome::Deferred(Box::pin(async move {
                    let mut out = Vec::new();
                    match rx.wait().await {
                        Ok(info) => {
                            let mut body = Vec::with_capacity(96 + channel.len());
                            body.extend_from_slice(b"{\"channel\":");
                            write_json_str(&mut body, &channel);
                            body.extend_from_slice(
                                format!(
                                    ",\"occupied\":{},\"subscribers\":{}",
                                    info.subscribers > 0,
                                    info.subscribers
                                )
                                .as_bytes(),
                            );
                            if let Some(users) = info.user_count {
                                body.extend_from_slice(
                                    format!(",\"user_count\":{users}").as_bytes(),
                                );
                            }
                            body.push(b'}');
                            write_json(&mut out, 200, &body, Extra::default());
                        }
                        Err(_) => unreachable_state(&mut out),
                    }
                    out
                }));
            }
            let rx = hub.ask(|reply| Query::Members {
                project,
                channel: channel.as_str().into(),
                reply,
            });
            Outcome::Deferred(Box::pin(async move {
                let mut out = Vec::new();
                match rx.wait().await {
                    Ok(m) => {
                        let mut body = Vec::with_capacity(64 + 64 * m.members.len());
                        body.extend_from_slice(b"{\"channel\":");
                        write_json_str(&mut body, &channel);
                        body.extend_from_slice(
                            format!(",\"count\":{},\"members\":", m.members.len()).as_bytes(),
                        );
                        write_members(
                            &mut body,
                            m.members.iter().map(|(u, i)| (&**u, i.as_deref())),
                        );
                        body.push(b'}');
                        write_json(&mut out, 200, &body, Extra::default());
                    }
                    Err(_) => unreachable_state(&mut out),
                }
                out
            }))
        }
    }
}

/// `channel=`: required, a valid channel name.
fn channel_param(query: &[u8]) -> Result<String, ApiError> {
    let channel = match query_param(query, b"channel").map(percent_decode) {
        None => return Err(ApiError::MissingField("channel")),
        Some(None) => return Err(ApiError::InvalidField("channel", "is not valid UTF-8")),
        Some(Some(c)) => c,
    };
    crate::publish::parse::validate_name("channel", &channel)?;
    Ok(channel)
}

fn unreachable_state(out: &mut Vec<u8>) {
    answer(out, ApiError::Unavailable(Unavailable::StateUnreachable));
}
