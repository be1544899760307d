//! Target adapters: how to subscribe, publish and read a delivery on ringcast, on
//! nginx + Nchan and on any Pusher Channels server, so every scenario runs unchanged
//! against each.
//!
//! - uws (the uWebSockets peer built by hand from `../shared/tools/peer-uws/`): speaks
//!   ringcast's native protocol, so it is driven exactly like ringcast; a kind of its
//!   own only so that every report names the server that was measured.
//!
//! - ringcast: one WebSocket at `/api/v1/ws?key=pk_..`, `subscribe` frames, publish by
//!   `POST /api/v1/publish` with `{channel,event,data}`; a delivery is a
//!   `{"type":"message",...,"data":{"t":..,"seq":..}}` frame.
//! - Nchan: one WebSocket per channel at `/sub/<channel>`, publish by `POST /pub/<channel>`;
//!   a delivery is the raw POST body, which is our `{"t":..,"seq":..}` itself.
//! - Pusher (protocol 7: ringcast's `/app/{key}`, Sockudo, ...): one WebSocket at
//!   `/app/<key>?protocol=7&..`, `pusher:subscribe` frames after
//!   `pusher:connection_established`, publish by the Pusher REST API
//!   (`POST /apps/<id>/events`, signed) or, with `--publish native`, by ringcast's own;
//!   a delivery is `{"event":"lt","channel":..,"data":"{\"t\":..,\"seq\":..}"}`, the
//!   data a JSON string (double-encoded).
//!
//! Invariants: classification never allocates and never panics on any payload; the
//! timestamp is read only from the published `data` (ringcast, Pusher) or raw body
//! (Nchan).

use crate::net::Endpoint;
use hmac::{Hmac, Mac};
use md5::{Digest, Md5};
use sha2::Sha256;
use std::io::Write;

/// Which server we talk to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Ringcast,
    Nchan,
    /// Any server of the Pusher Channels protocol 7 (ringcast's `/app/{key}`, Sockudo).
    Pusher,
    /// The uWebSockets peer: ringcast's native protocol (same URL, frames, publish API).
    Uws,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ringcast => "ringcast",
            Kind::Nchan => "nchan",
            Kind::Pusher => "pusher",
            Kind::Uws => "uws",
        }
    }
}

/// Which API the publishers use (`--publish`; by default the target's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PublishApi {
    /// ringcast's `POST /api/v1/publish` with `X-Api-Key: sk_..`.
    Native,
    /// Pusher's REST `POST /apps/{app_id}/events`, signed with the app secret.
    Pusher,
    /// Nchan's `POST /pub/<channel>`.
    Nchan,
}

impl PublishApi {
    pub fn name(self) -> &'static str {
        match self {
            PublishApi::Native => "native",
            PublishApi::Pusher => "pusher",
            PublishApi::Nchan => "nchan",
        }
    }

    /// The API a target publishes with when `--publish` is not given.
    pub fn default_for(kind: Kind) -> Self {
        match kind {
            Kind::Ringcast | Kind::Uws => PublishApi::Native,
            Kind::Nchan => PublishApi::Nchan,
            Kind::Pusher => PublishApi::Pusher,
        }
    }
}

/// The event name of every publish of a run (and what marks a Pusher delivery).
pub const EVENT: &str = "lt";

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
    /// How publishes are sent (the target's own API unless `--publish` says otherwise).
    pub publish: PublishApi,
    /// Pusher REST: the app id in `/apps/{app_id}/events`.
    pub app_id: String,
    /// Pusher REST: the app secret that signs each request (`auth_key` is `public_key`).
    pub app_secret: String,
    /// Every publish carries a fresh `Idempotency-Key` (`<tag>-<n>`).
    pub idempotency_keys: bool,
    /// The TLS client of a `wss://` (`https://`) endpoint (`None`: plaintext).
    pub tls: Option<crate::tls::Client>,
    /// The same for the publish endpoint, when there is one.
    pub publish_tls: Option<crate::tls::Client>,
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
    /// An `error` frame (Pusher: `pusher:error`, `pusher:subscription_error`).
    Error,
    /// Pusher: a `pusher:ping`, to be answered with `pusher:pong`.
    Ping,
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

/// Parse our payload when it arrives JSON-encoded inside a JSON string, as Pusher's
/// `data` does: `"{\"t\":<ns>,\"seq\":<n>}"`.
pub fn parse_stamp_escaped(data: &[u8]) -> Option<(u64, u64)> {
    Some((
        number_after(data, br#"\"t\":"#)?,
        number_after(data, br#"\"seq\":"#)?,
    ))
}

fn hex_lower(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
}

/// The signed query string of a Pusher REST request with a body, as Pusher's HTTP API
/// reference defines it: `auth_key`, `auth_timestamp`, `auth_version=1.0` and
/// `body_md5` (hex MD5 of the body), then `auth_signature`, the hex HMAC-SHA256 (keyed
/// with the app secret) of `METHOD\nPATH\n` + those four parameters sorted by key
/// (they already are), unescaped.
pub fn pusher_signed_query(
    key: &str,
    secret: &str,
    method: &str,
    path: &str,
    timestamp: u64,
    body: &[u8],
) -> String {
    let body_md5 = hex_lower(&Md5::digest(body));
    let params =
        format!("auth_key={key}&auth_timestamp={timestamp}&auth_version=1.0&body_md5={body_md5}");
    // HMAC takes a key of any length: new_from_slice cannot fail for it.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(method.as_bytes());
    mac.update(b"\n");
    mac.update(path.as_bytes());
    mac.update(b"\n");
    mac.update(params.as_bytes());
    let sig = hex_lower(&mac.finalize().into_bytes());
    format!("{params}&auth_signature={sig}")
}

static PAD_JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--pad-json`: pad with realistic records instead of `x` (set once, at start).
pub fn set_pad_json(on: bool) {
    PAD_JSON.store(on, std::sync::atomic::Ordering::Relaxed);
}

const NAMES: [&str; 8] = [
    "Blue cotton t-shirt",
    "Espresso beans 1 kg",
    "Wireless mouse",
    "Running shoes",
    "Desk lamp, warm white",
    "Notebook A5 dotted",
    "Stainless water bottle",
    "USB-C cable 2 m",
];
const STATES: [&str; 4] = ["pending", "paid", "shipped", "delivered"];

/// Append `,"items":[{...},...]` of realistic order lines until `pad` bytes were added
/// (quotes as `q`): ids, SKUs and prices drawn from `seq` by a small LCG, so messages
/// differ from each other as real ones do.
fn write_items(out: &mut Vec<u8>, seq: u64, pad: usize, q: &[u8]) {
    let start = out.len();
    let mut x = seq
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    let s = |out: &mut Vec<u8>, text: &str| {
        out.extend_from_slice(q);
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(q);
    };
    out.push(b',');
    s(out, "items");
    out.extend_from_slice(b":[");
    let mut first = true;
    while out.len() - start < pad {
        if !first {
            out.push(b',');
        }
        first = false;
        let r = next();
        out.push(b'{');
        s(out, "id");
        let _ = write!(out, ":{},", 100_000 + r % 900_000);
        s(out, "sku");
        out.push(b':');
        s(
            out,
            &format!(
                "SKU-{:04}-{}",
                r % 10_000,
                ["S", "M", "L", "XL"][(r % 4) as usize]
            ),
        );
        out.push(b',');
        s(out, "name");
        out.push(b':');
        s(out, NAMES[(r % 8) as usize]);
        out.push(b',');
        s(out, "price");
        let _ = write!(out, ":{}.{:02},", 1 + r % 200, r % 100);
        s(out, "qty");
        let _ = write!(out, ":{},", 1 + r % 5);
        s(out, "status");
        out.push(b':');
        s(out, STATES[(r % 4) as usize]);
        out.push(b',');
        s(out, "updated_at");
        out.push(b':');
        s(
            out,
            &format!(
                "2026-11-{:02}T{:02}:{:02}:{:02}Z",
                1 + r % 28,
                r % 24,
                r % 60,
                (r >> 8) % 60
            ),
        );
        out.push(b'}');
    }
    out.push(b']');
}

/// Append our stamp `{"t":T,"seq":S[,"pad":"xx.."]}` to `out` (with `--pad-json`,
/// `,"items":[...]` instead of `pad`); escaped for the inside of a JSON string when
/// `escaped` (Pusher's `data` is a string).
fn write_stamp(out: &mut Vec<u8>, t: u64, seq: u64, pad: usize, escaped: bool) {
    let q: &[u8] = if escaped { b"\\\"" } else { b"\"" };
    // Writes into a Vec cannot fail.
    out.push(b'{');
    out.extend_from_slice(q);
    out.push(b't');
    out.extend_from_slice(q);
    let _ = write!(out, ":{t},");
    out.extend_from_slice(q);
    out.extend_from_slice(b"seq");
    out.extend_from_slice(q);
    let _ = write!(out, ":{seq}");
    if pad > 0 && PAD_JSON.load(std::sync::atomic::Ordering::Relaxed) {
        write_items(out, seq, pad, q);
    } else if pad > 0 {
        out.push(b',');
        out.extend_from_slice(q);
        out.extend_from_slice(b"pad");
        out.extend_from_slice(q);
        out.push(b':');
        out.extend_from_slice(q);
        out.resize(out.len() + pad, b'x');
        out.extend_from_slice(q);
    }
    out.push(b'}');
}

impl Target {
    /// This target as the publishers see it: `endpoint` replaced by the publish
    /// endpoint when one is set.
    pub fn for_publishers(&self) -> Target {
        let mut t = self.clone();
        if let Some(e) = &self.publish_endpoint {
            t.endpoint = e.clone();
            t.tls = self.publish_tls.clone();
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
            Kind::Ringcast | Kind::Uws => format!("/api/v1/ws?key={}", self.public_key),
            Kind::Nchan => format!("/sub/{}", self.channel_name(ch)),
            Kind::Pusher => format!(
                "/app/{}?protocol=7&client=ringcast-loadtest&version=1",
                self.public_key
            ),
        }
    }

    /// ringcast and Pusher subscribe with a frame after their greeting; Nchan by the
    /// URL alone.
    pub fn uses_subscribe_frames(&self) -> bool {
        self.kind != Kind::Nchan
    }

    /// The JSON of a subscribe (or unsubscribe) frame (ringcast, Pusher).
    pub fn subscribe_json(&self, ch: u32, subscribe: bool) -> String {
        if self.kind == Kind::Pusher {
            // Public channels only: a private one would need the socket id of the
            // handshake signed per connection.
            let ev = if subscribe {
                "pusher:subscribe"
            } else {
                "pusher:unsubscribe"
            };
            return format!(
                "{{\"event\":\"{ev}\",\"data\":{{\"channel\":\"{}\"}}}}",
                self.channel_name(ch)
            );
        }
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

    /// The answer to a Pusher `pusher:ping` (the protocol's own keep-alive, beside
    /// WebSocket pings).
    pub fn pusher_pong(&self) -> &'static [u8] {
        br#"{"event":"pusher:pong","data":{}}"#
    }

    /// Append the request line, headers and body of one POST to `path`, with the
    /// API key header for ringcast's native API.
    fn write_post(&self, out: &mut Vec<u8>, path: &str, body: &[u8]) {
        // Writes into a Vec cannot fail.
        let _ = write!(
            out,
            "POST {path} HTTP/1.1\r\nHost: {}\r\n",
            self.endpoint.host
        );
        if self.publish == PublishApi::Native {
            let _ = write!(out, "X-Api-Key: {}\r\n", self.secret_key);
        }
        if self.idempotency_keys {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let _ = write!(out, "Idempotency-Key: {}-{n}\r\n", self.tag);
        }
        let _ = write!(
            out,
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        out.extend_from_slice(body);
    }

    /// The signed path and query of a Pusher REST POST of `body` to
    /// `/apps/{app_id}/{endpoint}`. `auth_timestamp` is the whole second of `t` (the
    /// publish's own send time, Unix ns), so it changes once a second.
    fn pusher_target(&self, endpoint: &str, t: u64, body: &[u8]) -> String {
        let path = format!("/apps/{}/{endpoint}", self.app_id);
        let q = pusher_signed_query(
            &self.public_key,
            &self.app_secret,
            "POST",
            &path,
            t / 1_000_000_000,
            body,
        );
        format!("{path}?{q}")
    }

    /// Append one publish request for channel `ch` carrying timestamp `t` and
    /// sequence `seq`, padded with `pad` bytes of filler inside `data`.
    pub fn write_publish(&self, out: &mut Vec<u8>, ch: u32, t: u64, seq: u64, pad: usize) {
        // The body is built first so Content-Length is exact (and, for Pusher, so its
        // MD5 can be signed); one small allocation per publish is noise next to the
        // syscalls.
        let mut body = Vec::with_capacity(112 + pad);
        let chan = self.channel_name(ch);
        let path = match self.publish {
            PublishApi::Native => {
                let _ = write!(
                    body,
                    "{{\"channel\":\"{chan}\",\"event\":\"{EVENT}\",\"data\":"
                );
                write_stamp(&mut body, t, seq, pad, false);
                body.push(b'}');
                "/api/v1/publish".to_string()
            }
            PublishApi::Nchan => {
                write_stamp(&mut body, t, seq, pad, false);
                format!("/pub/{chan}")
            }
            PublishApi::Pusher => {
                let _ = write!(
                    body,
                    "{{\"name\":\"{EVENT}\",\"channel\":\"{chan}\",\"data\":\""
                );
                write_stamp(&mut body, t, seq, pad, true);
                body.extend_from_slice(b"\"}");
                self.pusher_target("events", t, &body)
            }
        };
        self.write_post(out, &path, &body);
    }

    /// Append one batch publish (ringcast's `POST /api/v1/publish/batch`, or Pusher's
    /// `POST /apps/{id}/batch_events`) carrying one message per `(channel, seq)`, all
    /// stamped `t`, each padded with `pad` filler bytes. Nchan has no batch.
    pub fn write_publish_batch(
        &self,
        out: &mut Vec<u8>,
        msgs: impl Iterator<Item = (u32, u64)>,
        t: u64,
        pad: usize,
    ) {
        let pusher = self.publish == PublishApi::Pusher;
        let mut body = Vec::with_capacity(4096);
        body.extend_from_slice(if pusher {
            b"{\"batch\":["
        } else {
            b"{\"messages\":["
        });
        for (i, (ch, seq)) in msgs.enumerate() {
            if i > 0 {
                body.push(b',');
            }
            let chan = self.channel_name(ch);
            if pusher {
                let _ = write!(
                    body,
                    "{{\"name\":\"{EVENT}\",\"channel\":\"{chan}\",\"data\":\""
                );
                write_stamp(&mut body, t, seq, pad, true);
                body.extend_from_slice(b"\"}");
            } else {
                let _ = write!(
                    body,
                    "{{\"channel\":\"{chan}\",\"event\":\"{EVENT}\",\"data\":"
                );
                write_stamp(&mut body, t, seq, pad, false);
                body.push(b'}');
            }
        }
        body.extend_from_slice(b"]}");
        let path = if pusher {
            self.pusher_target("batch_events", t, &body)
        } else {
            "/api/v1/publish/batch".to_string()
        };
        self.write_post(out, &path, &body);
    }

    /// Classify one text frame's payload.
    pub fn classify(&self, payload: &[u8]) -> Inbound {
        match self.kind {
            Kind::Nchan => match parse_stamp(payload) {
                Some((t, seq)) => Inbound::Message { t, seq },
                None => Inbound::Other,
            },
            Kind::Ringcast | Kind::Uws => {
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
            Kind::Pusher => classify_pusher(payload),
        }
    }
}

/// A Pusher protocol 7 frame: `{"event":..,"channel":..,"data":..}` with keys in any
/// order. Deliveries (event `lt`) carry our stamp double-encoded in `data`; a server
/// that sent it as an object is read too.
fn classify_pusher(payload: &[u8]) -> Inbound {
    // The run's event first: by far the most frequent frame. The closing quote keeps
    // `"lt"` from matching a longer name.
    if find(payload, br#""event":"lt""#).is_some() {
        let data = find(payload, b"\"data\":").map_or(payload, |i| &payload[i..]);
        return match parse_stamp_escaped(data).or_else(|| parse_stamp(data)) {
            Some((t, seq)) => Inbound::Message { t, seq },
            None => Inbound::Other,
        };
    }
    const TABLE: [(&[u8], Inbound); 5] = [
        (
            br#""event":"pusher_internal:subscription_succeeded""#,
            Inbound::Subscribed,
        ),
        (
            br#""event":"pusher:connection_established""#,
            Inbound::Connected,
        ),
        (br#""event":"pusher:ping""#, Inbound::Ping),
        (br#""event":"pusher:error""#, Inbound::Error),
        (br#""event":"pusher:subscription_error""#, Inbound::Error),
    ];
    TABLE
        .iter()
        .find(|(needle, _)| find(payload, needle).is_some())
        .map_or(Inbound::Other, |&(_, v)| v)
}

#[cfg(test)]
mod tests;
