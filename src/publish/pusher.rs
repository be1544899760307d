//! Pusher REST bodies (design: docs/design/pusher.md, 4.2 and 4.3): the event of
//! `POST /apps/{app_id}/events` and the events of `batch_events`, validated by Pusher's
//! field names into the same [`Publish`] the native API makes, so quota, encoding,
//! history and hand-over are the native ones ([`super::publish_one`],
//! [`super::publish_batch`]); and the `info` attribute lists of every Pusher endpoint.
//!
//! The native parser ([`super::parse`]) does the work, with Pusher's keys and rules as a
//! [`Format`]: one simd-json tape walk over a scratch copy, the fields read by the same
//! reader as the native ones, names borrowed from it, `data` located in the original
//! body and forwarded byte for byte. Rules that differ from the native API:
//! - the event name is `name` (not `event`); `data` must be a JSON string (the SDKs
//!   always send JSON text in a string), which becomes the native frame's `data` as that
//!   same string literal, so a native subscriber receives a string, never parsed;
//! - a `batch_events` event names one `channel` (no `channels`); the batch is
//!   `{"batch":[...]}`;
//! - `info` (optional): a comma-separated list of `subscription_count` and
//!   `user_count`, the latter only when every channel is a presence channel.
//!
//! Everything else is the native rule: 1..=100 distinct channels, names of 1..=100
//! characters without control characters, no `pusher:`/`pusher_internal:` event names,
//! `socket_id` of Pusher's form, unknown fields ignored, the last of duplicate keys wins.

use super::parse::{
    BatchError, BatchLimits, Channels, Fields, Format, Kind, Publish, PublishParser,
};
use crate::error::ApiError;

/// Which counts an `info` list asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Info {
    /// `subscription_count`: connections subscribed (any channel).
    pub subscription_count: bool,
    /// `user_count`: distinct users (presence channels only).
    pub user_count: bool,
}

impl Info {
    /// Parse `subscription_count,user_count` (either, both, in any order). An unknown
    /// attribute or an empty item is a 400: a typo must not read as "no counts".
    pub(crate) fn parse(list: &str) -> Result<Info, ApiError> {
        let mut info = Info::default();
        for item in list.split(',') {
            match item {
                "subscription_count" => info.subscription_count = true,
                "user_count" => info.user_count = true,
                "" => {
                    return Err(ApiError::InvalidInfo(
                        "info has an empty item: give a comma-separated list of subscription_count and user_count",
                    ))
                }
                _ => {
                    return Err(ApiError::InvalidInfo(
                        "info names an unknown attribute: the attributes are subscription_count and user_count",
                    ))
                }
            }
        }
        Ok(info)
    }

    /// `user_count` is asked only of presence channels (Pusher answers 400 otherwise).
    pub(crate) fn check_channels(self, channels: &[&str]) -> Result<Info, ApiError> {
        if self.user_count && !channels.iter().all(|c| crate::shard::is_presence(c)) {
            return Err(ApiError::InvalidInfo(
                "info asks for user_count, which only presence channels (presence-...) have",
            ));
        }
        Ok(self)
    }
}

/// One validated Pusher event: the message to publish and the counts to answer with.
#[derive(Debug, Clone)]
pub(crate) struct Event<'a> {
    pub msg: Publish<'a>,
    pub info: Option<Info>,
}

/// Pusher's REST body: the event `{name, channel|channels, data, socket_id, info}` and
/// the batch `{"batch": [...]}`.
struct Pusher;

impl Format for Pusher {
    type Extra = Option<Info>;
    type Message<'a> = Event<'a>;
    const BATCH_KEY: &'static str = "batch";
    const BATCH_WHAT: &'static str = "must be an array of events";
    const EVENT_KEY: &'static str = "name";
    const EXTRA_KEY: Option<&'static str> = Some("info");
    const BATCH_REFUSES_CHANNELS: Option<&'static str> =
        Some("is not accepted in batch_events: each event names one 'channel'");

    /// `data` is a string (JSON text in a string, as the Pusher libraries send it),
    /// forwarded as that string literal.
    fn refuse_data(data: Kind<'_>) -> Option<&'static str> {
        (!matches!(data, Kind::Str(_)))
            .then_some("must be a string (JSON text in a string, as the Pusher libraries send it)")
    }

    /// `info`: which counts to answer with (`user_count` only of presence channels).
    fn extra(info: Option<Kind<'_>>, channels: &Channels<'_>) -> Result<Option<Info>, ApiError> {
        match info {
            None => Ok(None),
            Some(Kind::Str(list)) => Ok(Some(Info::parse(list)?.check_channels(channels.as_slice())?)),
            Some(_) => Err(ApiError::InvalidInfo(
                "info must be a string: a comma-separated list of subscription_count and user_count",
            )),
        }
    }

    fn message<'a>(f: Fields<'a, Option<Info>>, data: &'a [u8]) -> Event<'a> {
        let (msg, info) = f.publish(data);
        Event { msg, info }
    }
}

impl PublishParser {
    /// Parse and validate the body of `POST /apps/{app_id}/events`.
    pub(crate) fn parse_pusher<'a>(&'a mut self, body: &'a [u8]) -> Result<Event<'a>, ApiError> {
        self.parse_one::<Pusher>(body)
    }

    /// Parse and validate the whole body of `POST /apps/{app_id}/batch_events`: every
    /// event or none (the first invalid one with its index).
    pub(crate) fn parse_pusher_batch<'a>(
        &'a mut self,
        body: &'a [u8],
        limits: BatchLimits,
    ) -> Result<Vec<Event<'a>>, BatchError> {
        self.parse_many::<Pusher>(body, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BatchLimits = BatchLimits {
        max_messages: 100,
        max_message_bytes: 64 * 1024,
    };

    fn one(body: &str) -> Result<(Vec<String>, String, String, Option<Info>), ApiError> {
        let mut p = PublishParser::new();
        let e = p.parse_pusher(body.as_bytes())?;
        Ok((
            e.msg
                .channels
                .as_slice()
                .iter()
                .map(|c| c.to_string())
                .collect(),
            e.msg.event.to_string(),
            String::from_utf8(e.msg.data.to_vec()).unwrap(),
            e.info,
        ))
    }

    fn field_of(r: Result<impl std::fmt::Debug, ApiError>) -> (&'static str, &'static str) {
        match r {
            Err(ApiError::InvalidField(f, _)) => ("invalid_field", f),
            Err(ApiError::MissingField(f)) => ("missing_field", f),
            Err(ApiError::FieldTooLong(f)) => ("field_too_long", f),
            Err(e) => (e.code(), ""),
            Ok(v) => panic!("accepted: {v:?}"),
        }
    }

    #[test]
    fn data_stays_the_string_literal_as_sent() {
        let (c, n, d, info) =
            one(r#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#).unwrap();
        assert_eq!(c, ["project-3"]);
        assert_eq!(n, "foo");
        assert_eq!(d, r#""{\"some\":\"data\"}""#);
        assert_eq!(info, None);
        let (c, _, d, _) =
            one(r#"{"channel":"a","name":"e","data":"h\u00e9","extra":{"x":[1]}}"#).unwrap();
        assert_eq!(c, ["a"]);
        assert_eq!(d, r#""h\u00e9""#);
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (r#"{"name":"e","data":"x"}"#, ("missing_field", "channel")),
            (r#"{"channel":"a","data":"x"}"#, ("missing_field", "name")),
            (r#"{"channel":"a","name":"e"}"#, ("missing_field", "data")),
            (
                r#"{"channel":"a","name":"e","data":{"a":1}}"#,
                ("invalid_field", "data"),
            ),
            (
                r#"{"channel":"a","name":"e","data":1}"#,
                ("invalid_field", "data"),
            ),
            (
                r#"{"channel":"a","channels":["b"],"name":"e","data":"x"}"#,
                ("invalid_field", "channels"),
            ),
            (
                r#"{"channels":["a","a"],"name":"e","data":"x"}"#,
                ("invalid_field", "channels"),
            ),
            (
                r#"{"channels":[],"name":"e","data":"x"}"#,
                ("invalid_field", "channels"),
            ),
            (
                r#"{"channel":"a","name":"pusher:x","data":"x"}"#,
                ("invalid_field", "name"),
            ),
            (
                r#"{"channel":"a","name":"pusher_internal:x","data":"x"}"#,
                ("invalid_field", "name"),
            ),
            (
                r#"{"channel":"a","name":"","data":"x"}"#,
                ("invalid_field", "name"),
            ),
            (
                r#"{"channel":"a","name":"e","data":"x","socket_id":"1"}"#,
                ("invalid_field", "socket_id"),
            ),
            (
                r#"{"channel":"a","name":"e","data":"x","info":"nope"}"#,
                ("invalid_info", ""),
            ),
            (
                r#"{"channel":"a","name":"e","data":"x","info":"user_count"}"#,
                ("invalid_info", ""),
            ),
            (
                r#"{"channel":"a","name":"e","data":"x","info":"subscription_count,"}"#,
                ("invalid_info", ""),
            ),
            (
                r#"{"channel":"a","name":"e","data":"x","info":["user_count"]}"#,
                ("invalid_info", ""),
            ),
            (r#"[1]"#, ("invalid_json", "")),
            (r#"{"channel":"a""#, ("invalid_json", "")),
        ];
        for (body, want) in cases {
            assert_eq!(field_of(one(body)), want, "{body}");
        }
        let long = "x".repeat(101);
        let body = format!(r#"{{"channel":"{long}","name":"e","data":"x"}}"#);
        assert_eq!(field_of(one(&body)), ("field_too_long", "channel"));
        let body = format!(r#"{{"channel":"a","name":"{long}","data":"x"}}"#);
        assert_eq!(field_of(one(&body)), ("field_too_long", "name"));
        let names: Vec<String> = (0..101).map(|i| format!("\"c{i}\"")).collect();
        let body = format!(
            r#"{{"channels":[{}],"name":"e","data":"x"}}"#,
            names.join(",")
        );
        assert_eq!(field_of(one(&body)), ("invalid_field", "channels"));
    }

    #[test]
    fn info_lists() {
        let (_, _, _, info) = one(
            r#"{"channels":["presence-a","presence-b"],"name":"e","data":"x","info":"user_count,subscription_count"}"#,
        )
        .unwrap();
        assert_eq!(
            info,
            Some(Info {
                subscription_count: true,
                user_count: true
            })
        );
        let (_, _, _, info) =
            one(r#"{"channel":"a","name":"e","data":"x","info":"subscription_count"}"#).unwrap();
        assert_eq!(
            info,
            Some(Info {
                subscription_count: true,
                user_count: false
            })
        );
        assert!(Info::parse("").is_err());
        assert!(Info::parse("user_count,,subscription_count").is_err());
        assert!(Info::parse("user_count ").is_err());
        assert!(Info::parse("user_count")
            .unwrap()
            .check_channels(&["presence-a", "b"])
            .is_err());
    }

    #[test]
    fn socket_id_of_the_form_is_kept() {
        let mut p = PublishParser::new();
        let e = p
            .parse_pusher(br#"{"channel":"a","name":"e","data":"x","socket_id":"123.456"}"#)
            .unwrap();
        assert!(e.msg.except.is_some());
    }

    #[test]
    fn batches_are_all_or_nothing_with_the_index() {
        let mut p = PublishParser::new();
        let body = br#"{"batch":[{"channel":"a","name":"e1","data":"1"},{"channel":"b","name":"e2","data":"{\"x\":2}","info":"subscription_count"}]}"#;
        let events = p.parse_pusher_batch(body, LIMITS).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].msg.data, br#""1""#);
        assert_eq!(events[1].msg.data, br#""{\"x\":2}""#);
        assert_eq!(events[0].info, None);
        assert!(events[1].info.is_some());

        let bad = br#"{"batch":[{"channel":"a","name":"e","data":"1"},{"channel":"b","name":"pusher:e","data":"2"}]}"#;
        let err = p.parse_pusher_batch(bad, LIMITS).unwrap_err();
        assert_eq!(err.index, Some(1));
        assert_eq!(err.error.code(), "invalid_field");

        let many = br#"{"batch":[{"channels":["a"],"name":"e","data":"1"}]}"#;
        let err = p.parse_pusher_batch(many, LIMITS).unwrap_err();
        assert_eq!(err.index, Some(0));
        assert_eq!(
            err.error,
            ApiError::InvalidField(
                "channels",
                "is not accepted in batch_events: each event names one 'channel'"
            )
        );

        for body in [
            &br#"{"batch":[]}"#[..],
            br#"{"events":[]}"#,
            br#"{"batch":{}}"#,
        ] {
            let err = p.parse_pusher_batch(body, LIMITS).unwrap_err();
            assert_eq!(err.index, None, "{}", String::from_utf8_lossy(body));
        }
        let small = BatchLimits {
            max_messages: 1,
            max_message_bytes: 40,
        };
        let two = br#"{"batch":[{"channel":"a","name":"e","data":"1"},{"channel":"a","name":"e","data":"1"}]}"#;
        assert_eq!(p.parse_pusher_batch(two, small).unwrap_err().index, None);
        let big =
            br#"{"batch":[{"channel":"a","name":"e","data":"0123456789012345678901234567890"}]}"#;
        let err = p.parse_pusher_batch(big, small).unwrap_err();
        assert_eq!((err.error, err.index), (ApiError::PayloadTooLarge, Some(0)));
    }
}
