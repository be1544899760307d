//! `GET /api/v1/history?channel=c&limit=100&since=41&epoch=abc`: a channel's kept
//! messages over REST, with the project's secret key.
//!
//! Order of checks: key (401) → query (400: `channel` missing or not a valid name,
//! `limit` not 1..=1000, `since` not an integer) → history off (404 `history_off`) →
//! `epoch` given and not the channel's (409 `epoch_mismatch`) → 200. Without `since` the
//! newest `limit` messages, with it the first `limit` after it; oldest first either way.
//! `offset` is the channel's last assigned offset even when older messages are gone.
//! Not a hot path: it allocates freely.

use std::rc::Rc;

use super::outcome::{answer, Outcome};
use super::parse::{query_param, RequestHead};
use super::response::{write_json, Extra};
use super::{ApiError, Service};
use crate::apikey::KeyKind;
use crate::cluster::history::{ReadRequest, Request};
use crate::error::Unavailable;
use crate::history::Position;
use crate::json::write_json_str;

/// Most messages one request returns, and the default.
const MAX_LIMIT: usize = 1000;
const DEFAULT_LIMIT: usize = 100;

pub(crate) fn handle(
    svc: &Rc<Service>,
    head: &RequestHead,
    req: &[u8],
    out: &mut Vec<u8>,
) -> Outcome {
    let keys = svc.node.keys.load();
    let raw_key = head.api_key.as_ref().map(|r| &req[r.clone()]);
    let project = match keys.authenticate(raw_key, KeyKind::Secret) {
        Ok(entry) => &entry.project,
        Err(refusal) => return answer(out, ApiError::Unauthorized(refusal)),
    };
    let query = head.query.as_ref().map_or(&b""[..], |q| &req[q.clone()]);
    let params = match Params::parse(query) {
        Ok(p) => p,
        Err(e) => return answer(out, e),
    };
    let spec = project.history.get();
    if !spec.is_on() {
        return answer(out, ApiError::HistoryOff);
    }
    if let Some(cluster) = &svc.node.cluster {
        // Cluster mode: the history is in Redis; the cluster's thread reads it.
        let (tx, reply) = crate::cluster::history::reply();
        cluster.history(Request::Read(ReadRequest {
            project_id: project.id.as_str().into(),
            channel: params.channel.as_str().into(),
            size: spec.size,
            ttl_s: spec.ttl_s,
            since: params.since,
            limit: params.limit,
            reply: tx,
        }));
        return Outcome::Deferred(Box::pin(async move {
            let mut out = Vec::new();
            match reply.wait().await {
                Ok(read) => {
                    let entries = read.entries.iter().filter_map(|k| {
                        let (event, data, id) =
                            crate::cluster::wire::split_body(&k.body, k.data_start)?;
                        Some((event, data, id, k.offset))
                    });
                    write_history(&mut out, &params, read.position, entries);
                }
                Err(_) => {
                    answer(
                        &mut out,
                        ApiError::Unavailable(Unavailable::HistoryUnreachable),
                    );
                }
            }
            out
        }));
    }
    let (position, entries) = svc.node.history.lock().read(
        project.index,
        &params.channel,
        spec,
        params.since,
        params.limit,
    );
    let entries = entries
        .iter()
        .map(|e| (&*e.event, &e.data[..], &*e.id, e.offset));
    write_history(out, &params, position, entries)
}

/// The 200 answer (or the 409 of an `epoch` that is not the channel's).
fn write_history<E: AsRef<str>>(
    out: &mut Vec<u8>,
    params: &Params,
    position: Position,
    entries: impl Iterator<Item = (E, impl AsRef<[u8]>, impl AsRef<str>, u64)>,
) -> Outcome {
    if params
        .epoch
        .as_deref()
        .is_some_and(|e| e != position.epoch.as_str())
    {
        return answer(out, ApiError::EpochMismatch);
    }
    let mut body = Vec::with_capacity(1024);
    body.extend_from_slice(b"{\"channel\":");
    write_json_str(&mut body, &params.channel);
    body.extend_from_slice(format!(",\"offset\":{},\"epoch\":", position.offset).as_bytes());
    write_json_str(&mut body, position.epoch.as_str());
    body.extend_from_slice(b",\"messages\":[");
    for (i, (event, data, id, offset)) in entries.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b"{\"event\":");
        write_json_str(&mut body, event.as_ref());
        body.extend_from_slice(b",\"data\":");
        body.extend_from_slice(data.as_ref());
        body.extend_from_slice(b",\"id\":");
        write_json_str(&mut body, id.as_ref());
        body.extend_from_slice(format!(",\"offset\":{offset}}}").as_bytes());
    }
    body.extend_from_slice(b"]}");
    write_json(out, 200, &body, Extra::default());
    Outcome::Answered { close: false }
}

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
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => {
                let hex = raw.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for bad in [
            &b"channel=c&limit=0"[..],
            b"channel=c&limit=1001",
            b"channel=c&limit=x",
            b"channel=c&since=-1",
            b"channel=c&since=",
            b"channel=",
            b"channel=%ZZ",
            b"channel=%FF",
            b"channel=a%01",
        ] {
            assert!(
                matches!(Params::parse(bad), Err(ApiError::InvalidField(..))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
