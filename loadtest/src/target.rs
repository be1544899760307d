//! Target adapters: how to subscribe, publish and read a delivery on ringcast and on
//! nginx + Nchan, so every scenario runs unchanged against either.
//!
//! - ringcast: one WebSocket at `/api/v1/ws?key=pk_..`, `subscribe` frames, publish by
//!   `POST /api/v1/publish` with `{channel,event,data}`; a delivery is a
//!   `{"type":"message",...,"data":{"t":..,"seq":..}}` frame.
//! - Nchan: one WebSocket per channel at `/sub/<channel>`, publish by `POST /pub/<channel>`;
//!   a delivery is the raw POST body, which is our `{"t":..,"seq":..}` itself.
//!
//! Invariants: classification never allocates and never panics on any payload; the
//! timestamp is read only from the published `data` (ringcast) or raw body (Nchan).

use crate::net::Endpoint;
use std::io::Write;

/// Which server we talk to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Ringcast,
    Nchan,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ringcast => "ringcast",
            Kind::Nchan => "nchan",
        }
    }
}

/// Everything needed to speak to one target.
#[derive(Debug, Clone)]
pub struct Target {
    pub kind: Kind,
    pub endpoint: Endpoint,
    /// Where publishes go when it is not `endpoint` (`--publish-url`: subscribe on one
    /// cluster node, publish on another).
    pub publish_endpoint: Option<Endpoint>,
    pub secret_key: String,
    pub public_key: String,
    /// A per-run channel prefix, so a run never sees messages left by an earlier one.
    pub tag: String,
    /// Start of every channel name (`lt` by default; `private-lt` for private channels).
    pub channel_prefix: String,
    /// A subscription token (JWT) sent in every ringcast subscribe frame (private
    /// channels); it must name every channel of the run.
    pub token: Option<String>,
}

/// What a text frame from the server means to the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// ringcast's `connected` greeting.
    Connected,
    /// ringcast's `subscribed` confirmation.
    Subscribed,
    /// ringcast's `unsubscribed` confirmation.
    Unsubscribed,
    /// A delivery, with the publisher's timestamp (Unix ns) and per-channel sequence.
    Message { t: u64, seq: u64 },
    /// An `error` frame.
    Error,
    /// Anything else (pong, unknown frames).
    Other,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The unsigned integer right after `key` (e.g. `"t":`), spaces allowed.
fn number_after(hay: &[u8], key: &[u8]) -> Option<u64> {
    let start = find(hay, key)? + key.len();
    let digits = hay[start..].iter().skip_while(|b| **b == b' ');
    let mut n: u64 = 0;
    let mut any = false;
    for &b in digits.take(20) {
        if !b.is_ascii_digit() {
            break;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        any = true;
    }
    any.then_some(n)
}

/// Parse our `{"t":<ns>,"seq":<n>...}` payload.
pub fn parse_stamp(data: &[u8]) -> Option<(u64, u64)> {
    Some((
        number_after(data, b"\"t\":")?,
        number_after(data, b"\"seq\":")?,
    ))
}

impl Target {
    /// This target as the publishers see it: `endpoint` replaced by the publish
    /// endpoint when one is set.
    pub fn for_publishers(&self) -> Target {
        let mut t = self.clone();
        if let Some(e) = &self.publish_endpoint {
            t.endpoint = e.clone();
        }
        t
    }

    /// The channel name of channel index `ch` (per-run prefix).
    pub fn channel_name(&self, ch: u32) -> String {
        format!("{}{}c{}", self.channel_prefix, self.tag, ch)
    }

    /// The path of the WebSocket upgrade. For Nchan the channel is in the path.
    pub fn ws_path(&self, ch: u32) -> String {
        match self.kind {
            Kind::Ringcast => format!("/api/v1/ws?key={}", self.public_key),
            Kind::Nchan => format!("/sub/{}", self.channel_name(ch)),
        }
    }

    /// ringcast subscribes with a frame after `connected`; Nchan by the URL alone.
    pub fn uses_subscribe_frames(&self) -> bool {
        self.kind == Kind::Ringcast
    }

    /// The JSON of a subscribe (or unsubscribe) frame for ringcast.
    pub fn subscribe_json(&self, ch: u32, subscribe: bool) -> String {
        let ty = if subscribe {
            "subscribe"
        } else {
            "unsubscribe"
        };
        match (&self.token, subscribe) {
            // The token is base64url and dots: nothing in it needs escaping.
            (Some(token), true) => format!(
                "{{\"type\":\"{ty}\",\"channel\":\"{}\",\"token\":\"{token}\"}}",
                self.channel_name(ch)
            ),
            _ => format!(
                "{{\"type\":\"{ty}\",\"channel\":\"{}\"}}",
                self.channel_name(ch)
            ),
        }
    }

    /// Append one publish request for channel `ch` carrying timestamp `t` and
    /// sequence `seq`, padded with `pad` bytes of filler inside `data`.
    pub fn write_publish(&self, out: &mut Vec<u8>, ch: u32, t: u64, seq: u64, pad: usize) {
        // The body is built first so Content-Length is exact; one small allocation
        // per publish is noise next to the syscalls.
        let mut body = Vec::with_capacity(96 + pad);
        let chan = self.channel_name(ch);
        // Writes into a Vec cannot fail.
        if self.kind == Kind::Ringcast {
            let _ = write!(body, "{{\"channel\":\"{chan}\",\"event\":\"lt\",\"data\":");
        }
        let _ = write!(body, "{{\"t\":{t},\"seq\":{seq}");
        if pad > 0 {
            body.extend_from_slice(b",\"pad\":\"");
            body.resize(body.len() + pad, b'x');
            body.push(b'"');
        }
        body.push(b'}');
        let path = match self.kind {
            Kind::Ringcast => {
                body.push(b'}');
                "/api/v1/publish".to_string()
            }
            Kind::Nchan => format!("/pub/{chan}"),
        };
        let _ = write!(
            out,
            "POST {path} HTTP/1.1\r\nHost: {}\r\n",
            self.endpoint.host
        );
        if self.kind == Kind::Ringcast {
            let _ = write!(out, "X-Api-Key: {}\r\n", self.secret_key);
        }
        let _ = write!(
            out,
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        out.extend_from_slice(&body);
    }

    /// Append one `POST /api/v1/publish/batch` (ringcast only) carrying one message per
    /// `(channel, seq)`, all stamped `t`, each padded with `pad` filler bytes.
    pub fn write_publish_batch(
        &self,
        out: &mut Vec<u8>,
        msgs: impl Iterator<Item = (u32, u64)>,
        t: u64,
        pad: usize,
    ) {
        let mut body = Vec::with_capacity(4096);
        body.extend_from_slice(b"{\"messages\":[");
        for (i, (ch, seq)) in msgs.enumerate() {
            if i > 0 {
                body.push(b',');
            }
            let chan = self.channel_name(ch);
            let _ = write!(
                body,
                "{{\"channel\":\"{chan}\",\"event\":\"lt\",\"data\":{{\"t\":{t},\"seq\":{seq}"
            );
            if pad > 0 {
                body.extend_from_slice(b",\"pad\":\"");
                body.resize(body.len() + pad, b'x');
                body.push(b'"');
            }
            body.extend_from_slice(b"}}");
        }
        body.extend_from_slice(b"]}");
        let _ = write!(
            out,
            "POST /api/v1/publish/batch HTTP/1.1\r\nHost: {}\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.endpoint.host,
            self.secret_key,
            body.len()
        );
        out.extend_from_slice(&body);
    }

    /// Classify one text frame's payload.
    pub fn classify(&self, payload: &[u8]) -> Inbound {
        match self.kind {
            Kind::Nchan => match parse_stamp(payload) {
                Some((t, seq)) => Inbound::Message { t, seq },
                None => Inbound::Other,
            },
            Kind::Ringcast => {
                // The server may order keys freely; look for the type value only.
                if find(payload, b"\"type\":\"message\"").is_some() {
                    let data = find(payload, b"\"data\":").map_or(payload, |i| &payload[i..]);
                    match parse_stamp(data) {
                        Some((t, seq)) => Inbound::Message { t, seq },
                        None => Inbound::Other,
                    }
                } else if find(payload, b"\"type\":\"subscribed\"").is_some() {
                    Inbound::Subscribed
                } else if find(payload, b"\"type\":\"unsubscribed\"").is_some() {
                    Inbound::Unsubscribed
                } else if find(payload, b"\"type\":\"connected\"").is_some() {
                    Inbound::Connected
                } else if find(payload, b"\"type\":\"error\"").is_some() {
                    Inbound::Error
                } else {
                    Inbound::Other
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::parse_response;

    fn target(kind: Kind) -> Target {
        Target {
            kind,
            endpoint: crate::net::parse_url("http://127.0.0.1:8080").unwrap(),
            publish_endpoint: None,
            secret_key: "sk_x".into(),
            public_key: "pk_y".into(),
            tag: "ab".into(),
            channel_prefix: "lt".into(),
            token: None,
        }
    }

    #[test]
    fn private_runs_name_their_channels_and_send_the_token() {
        let mut t = target(Kind::Ringcast);
        assert_eq!(t.channel_name(2), "ltabc2");
        t.channel_prefix = "private-lt".into();
        t.token = Some("h.p.s".into());
        assert_eq!(t.channel_name(2), "private-ltabc2");
        let v: serde_json::Value = serde_json::from_str(&t.subscribe_json(2, true)).unwrap();
        assert_eq!(v["token"], "h.p.s");
        assert_eq!(v["channel"], "private-ltabc2");
        let v: serde_json::Value = serde_json::from_str(&t.subscribe_json(2, false)).unwrap();
        assert!(v.get("token").is_none());
    }

    #[test]
    fn publishers_use_the_publish_endpoint_when_set() {
        let mut t = target(Kind::Ringcast);
        assert_eq!(t.for_publishers().endpoint.addr, t.endpoint.addr);
        t.publish_endpoint = Some(crate::net::parse_url("http://127.0.0.1:8081").unwrap());
        let p = t.for_publishers();
        assert_eq!(p.endpoint.addr.port(), 8081);
        assert_eq!(p.endpoint.host, "127.0.0.1:8081");
        // Subscribers keep the original endpoint and the same channel names.
        assert_eq!(t.endpoint.addr.port(), 8080);
        assert_eq!(p.channel_name(3), t.channel_name(3));
    }

    /// Split a request we wrote into head and body and check Content-Length matches.
    fn body_of(req: &[u8]) -> &[u8] {
        let head_end = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = std::str::from_utf8(&req[..head_end]).unwrap();
        let cl: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(cl, req.len() - head_end, "{head}");
        &req[head_end..]
    }

    #[test]
    fn ringcast_publish_is_valid_json_with_right_length() {
        let t = target(Kind::Ringcast);
        for pad in [0, 1, 100] {
            let mut out = Vec::new();
            t.write_publish(&mut out, 3, 1_700_000_000_123_456_789, 42, pad);
            let v: serde_json::Value = serde_json::from_slice(body_of(&out)).unwrap();
            assert_eq!(v["channel"], "ltabc3");
            assert_eq!(v["data"]["t"], 1_700_000_000_123_456_789u64);
            assert_eq!(v["data"]["seq"], 42);
        }
    }

    #[test]
    fn ringcast_batch_is_valid_json_with_right_length() {
        let t = target(Kind::Ringcast);
        let mut out = Vec::new();
        t.write_publish_batch(&mut out, [(0, 5), (2, 6)].into_iter(), 77, 3);
        assert!(out.starts_with(b"POST /api/v1/publish/batch HTTP/1.1\r\n"));
        let v: serde_json::Value = serde_json::from_slice(body_of(&out)).unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1]["channel"], "ltabc2");
        assert_eq!(
            (m[1]["data"]["t"].as_u64(), m[1]["data"]["seq"].as_u64()),
            (Some(77), Some(6))
        );
        assert_eq!(m[0]["data"]["pad"], "xxx");
    }

    #[test]
    fn nchan_publish_is_raw_data() {
        let t = target(Kind::Nchan);
        let mut out = Vec::new();
        t.write_publish(&mut out, 0, 5, 6, 10);
        assert!(out.starts_with(b"POST /pub/ltabc0 HTTP/1.1\r\n"));
        let v: serde_json::Value = serde_json::from_slice(body_of(&out)).unwrap();
        assert_eq!((v["t"].as_u64(), v["seq"].as_u64()), (Some(5), Some(6)));
        assert_eq!(t.ws_path(7), "/sub/ltabc7");
        // And the request parser agrees about where a response ends, as a sanity check.
        assert!(
            parse_response(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", false)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn classifies_ringcast_frames() {
        let t = target(Kind::Ringcast);
        assert_eq!(
            t.classify(
                br#"{"type":"message","channel":"c","event":"e","data":{"t":12,"seq":3},"id":"9"}"#
            ),
            Inbound::Message { t: 12, seq: 3 }
        );
        // The timestamp inside data wins over anything before it.
        assert_eq!(
            t.classify(
                br#"{"type":"message","channel":"c","event":"e","data":{"seq":4, "t": 99}}"#
            ),
            Inbound::Message { t: 99, seq: 4 }
        );
        assert_eq!(
            t.classify(br#"{"type":"subscribed","channel":"c"}"#),
            Inbound::Subscribed
        );
        assert_eq!(
            t.classify(br#"{"type":"connected","connection_id":"x","heartbeat_s":25}"#),
            Inbound::Connected
        );
        assert_eq!(
            t.classify(br#"{"type":"error","code":"x","message":"y"}"#),
            Inbound::Error
        );
        assert_eq!(
            t.classify(br#"{"type":"message","data":{"t":"x"}}"#),
            Inbound::Other
        );
        assert_eq!(t.classify(b""), Inbound::Other);
        assert_eq!(
            t.classify(br#"{"t":99999999999999999999999,"seq":1}"#),
            Inbound::Other
        );
    }
}
