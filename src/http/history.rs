//! `GET /api/v1/history?channel=c&limit=100&since=41&epoch=abc`: a channel's kept
//! messages over REST, with the project's secret key.
//!
//! Order of checks: key (401) → query (400: `channel` missing or not a valid name,
//! `limit` not 1..=1000, `since` not an integer) → history off (404 `history_off`) →
//! `epoch` given and not the channel's (409 `epoch_mismatch`) → 200. Without `since` the
//! newest `limit` messages, with it the first `limit` after it; oldest first either way.
//! The body stays within `max_history_answer_bytes` (always at least one message): the
//! messages that fit, and `"more": true` when some did not (page on with `since`). It is
//! written straight into the connection's output, never built apart and copied.
//! `offset` is the channel's last assigned offset even when older messages are gone.
//! Not a hot path: it allocates freely.

use super::outcome::{answer, Outcome, Request};
use super::parse::query_param;
use super::response::{write_json_with, Extra};
use super::ApiError;
use crate::error::Unavailable;
use crate::history::backend::{Project, Read, ReadAnswer, ReadAsk};
use crate::json::write_json_str;

/// Most messages one request returns, and the default.
const MAX_LIMIT: usize = 1000;
const DEFAULT_LIMIT: usize = 100;

pub(crate) fn handle(r: &Request<'_>, out: &mut Vec<u8>) -> Outcome {
    let svc = r.svc;
    let project = match r.secret_project() {
        Ok(project) => project,
        Err(err) => return answer(out, err),
    };
    let params = match Params::parse(r.query()) {
        Ok(p) => p,
        Err(e) => return answer(out, e),
    };
    let spec = project.history.get();
    if !spec.is_on() {
        return answer(out, ApiError::HistoryOff);
    }
    let max_bytes = svc.config().max_history_answer_bytes;
    let project = Project {
        index: project.index,
        id: &project.id,
    };
    let ask = ReadAsk {
        channel: &params.channel,
        spec,
        since: params.since,
        limit: params.limit,
    };
    match svc.node.backend.read(project, ask) {
        ReadAnswer::Here(read) => write_history(out, &params, read, max_bytes),
        // Cluster mode: the history is in Redis; the cluster's thread reads it.
        ReadAnswer::Later(reply) => Outcome::Deferred(Box::pin(async move {
            let mut out = Vec::new();
            match reply.wait().await {
                Ok(read) => {
                    write_history(&mut out, &params, read, max_bytes);
                }
                Err(_) => {
                    answer(
                        &mut out,
                        ApiError::Unavailable(Unavailable::HistoryUnreachable),
                    );
                }
            }
            out
        })),
    }
}

/// The 200 answer (or the 409 of an `epoch` that is not the channel's), written straight
/// into `out`. Messages go in oldest first while the body stays within `max_bytes`; the
/// first one always goes in (a single message is at most `max_body_bytes`, and paging on
/// with `since` must always move), and `"more": true` says the others did not fit.
fn write_history(out: &mut Vec<u8>, params: &Params, read: Read, max_bytes: usize) -> Outcome {
    let position = read.position;
    if params
        .epoch
        .as_deref()
        .is_some_and(|e| e != position.epoch.as_str())
    {
        return answer(out, ApiError::EpochMismatch);
    }
    write_json_with(out, 200, Extra::default(), |body| {
        let start = body.len();
        body.extend_from_slice(b"{\"channel\":");
        write_json_str(body, &params.channel);
        body.extend_from_slice(format!(",\"offset\":{},\"epoch\":", position.offset).as_bytes());
        write_json_str(body, position.epoch.as_str());
        body.extend_from_slice(b",\"messages\":[");
        let mut more = false;
        for (i, m) in read.messages.iter().enumerate() {
            let before = body.len();
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(b"{\"event\":");
            write_json_str(body, &m.event);
            body.extend_from_slice(b",\"data\":");
            body.extend_from_slice(&m.data);
            body.extend_from_slice(b",\"id\":");
            write_json_str(body, &m.id);
            body.extend_from_slice(format!(",\"offset\":{}}}", m.offset).as_bytes());
            if i > 0 && body.len() - start + END_MAX > max_bytes {
                body.truncate(before);
                more = true;
                break;
            }
        }
        body.extend_from_slice(if more {
            b"],\"more\":true}"
        } else {
            b"],\"more\":false}"
        });
    });
    Outcome::Answered { close: false }
}

/// The longest end of a history body (`],"more":false}`).
const END_MAX: usize = 15;

/// The query, decoded and checked.
#[derive(Debug, PartialEq, Eq)]
struct Params {
    channel: String,
    limit: usize,
    since: Option<u64>,
    epoch: Option<String>,
}

impl Params {
    fn parse(query: &[u8]) -> Result<Params, ApiError> {
        let get = |name: &[u8]| query_param(query, name).map(percent_decode);
        let channel = match get(b"channel") {
            None => return Err(ApiError::MissingField("channel")),
            Some(None) => return Err(ApiError::InvalidField("channel", "is not valid UTF-8")),
            Some(Some(c)) => c,
        };
        crate::publish::parse::validate_name("channel", &channel)?;
        let number = |name: &'static str, why: &'static str| -> Result<Option<u64>, ApiError> {
            match get(name.as_bytes()) {
                None => Ok(None),
                Some(Some(t)) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| ApiError::InvalidField(name, why)),
                Some(_) => Err(ApiError::InvalidField(name, why)),
            }
        };
        let limit = number("limit", "must be an integer from 1 to 1000")?.map_or(
            Ok(DEFAULT_LIMIT),
            |l| {
                usize::try_from(l)
                    .ok()
                    .filter(|l| (1..=MAX_LIMIT).contains(l))
                    .ok_or(ApiError::InvalidField(
                        "limit",
                        "must be an integer from 1 to 1000",
                    ))
            },
        )?;
        let since = number("since", "must be an offset (an integer, 0 or more)")?;
        let epoch = match get(b"epoch") {
            None => None,
            Some(Some(e)) => Some(e),
            Some(None) => return Err(ApiError::InvalidField("epoch", "is not valid UTF-8")),
        };
        Ok(Params {
            channel,
            limit,
            since,
            epoch,
        })
    }
}

/// Decode a query value (`%XX` escapes, `+` as a space); `None` when the result is not
/// UTF-8 or an escape is malformed.
pub(crate) fn percent_decode(raw: &[u8]) -> Option<String> {
    crate::percent::decode(raw, crate::percent::Plus::Space).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(max_bytes: usize, n: u64) -> serde_json::Value {
        let params = Params::parse(b"channel=c").unwrap();
        let position = crate::history::Position {
            offset: n,
            epoch: crate::history::Epoch::random(),
        };
        let data = format!("\"{}\"", "x".repeat(100));
        let messages = (1..=n)
            .map(|o| crate::history::backend::Kept {
                offset: o,
                event: "e".into(),
                data: data.clone().into(),
                id: format!("id{o}").into(),
            })
            .collect();
        let mut out = Vec::new();
        write_history(&mut out, &params, Read { position, messages }, max_bytes);
        let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&out[..at]).to_string();
        assert!(head.contains(&format!("Content-Length: {}\r\n", out.len() - at)));
        serde_json::from_slice(&out[at..]).unwrap()
    }

    #[test]
    fn the_answer_holds_the_messages_that_fit_and_says_more() {
        let all = body_of(1 << 20, 10);
        assert_eq!(all["more"], false);
        assert_eq!(all["messages"].as_array().unwrap().len(), 10);
        let one_size = serde_json::to_vec(&all).unwrap().len();
        let cut = body_of(one_size / 2, 10);
        assert_eq!(cut["more"], true);
        let kept = cut["messages"].as_array().unwrap();
        assert!((3..10).contains(&kept.len()), "{}", kept.len());
        assert_eq!(kept[0]["offset"], 1, "oldest first");
        assert!(serde_json::to_vec(&cut).unwrap().len() <= one_size / 2);
        // Smaller than one message: that one message all the same, so paging moves on.
        let tiny = body_of(1, 10);
        assert_eq!(tiny["more"], true);
        assert_eq!(tiny["messages"].as_array().unwrap().len(), 1);
        assert_eq!(body_of(1, 0)["more"], false);
    }

    #[test]
    fn query_values_are_decoded_and_checked() {
        let p = Params::parse(b"channel=a%20b%2Bc+d&limit=5&since=41&epoch=ab12").unwrap();
        assert_eq!(
            p,
            Params {
                channel: "a b+c d".into(),
                limit: 5,
                since: Some(41),
                epoch: Some("ab12".into())
            }
        );
        let p = Params::parse("channel=%C3%A9".as_bytes()).unwrap();
        assert_eq!((p.channel.as_str(), p.limit, p.since), ("é", 100, None));
        assert_eq!(
            Params::parse(b"limit=5"),
            Err(ApiError::MissingField("channel"))
        );
        // Each refusal names the field at fault.
        for (bad, field) in [
            (&b"channel=c&limit=0"[..], "limit"),
            (b"channel=c&limit=1001", "limit"),
            (b"channel=c&limit=x", "limit"),
            (b"channel=c&since=-1", "since"),
            (b"channel=c&since=", "since"),
            (b"channel=c&epoch=%FF", "epoch"),
            (b"channel=", "channel"),
            (b"channel=%ZZ", "channel"),
            (b"channel=%FF", "channel"),
            (b"channel=a%01", "channel"),
        ] {
            let named = match Params::parse(bad) {
                Err(ApiError::InvalidField(name, _)) => Some(name),
                _ => None,
            };
            assert_eq!(named, Some(field), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
