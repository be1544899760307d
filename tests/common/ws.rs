//! WebSocket client helpers for the tests (tungstenite): read and send JSON frames,
//! subscribe (native, with or without a history position), connect as a Pusher client,
//! and wait for a close or for silence. The connect helpers give every socket a read
//! timeout ([`set_timeout`]), so a test waiting for a frame that never comes fails
//! instead of hanging.

use std::time::Duration;

use serde_json::Value;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::Message;

use super::Ws;

pub fn set_timeout(ws: &mut Ws, d: Duration) {
    match ws.get_mut() {
        MaybeTlsStream::Plain(s) => s.set_read_timeout(Some(d)).unwrap(),
        MaybeTlsStream::Rustls(s) => s.sock.set_read_timeout(Some(d)).unwrap(),
        _ => {}
    }
}

/// Next text frame as JSON (pings are answered by tungstenite).
pub fn next_json(ws: &mut Ws) -> Value {
    loop {
        match ws.read().expect("ws read") {
            Message::Text(t) => return serde_json::from_str(t.as_str()).expect("json frame"),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

pub fn send_json(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).expect("ws send");
}

pub fn subscribe(ws: &mut Ws, channel: &str) {
    send_json(
        ws,
        serde_json::json!({"type": "subscribe", "channel": channel}),
    );
    let reply = next_json(ws);
    assert_eq!(reply["type"], "subscribed", "{reply}");
    assert_eq!(reply["channel"], channel);
}

/// Connect to a Pusher WebSocket URL (`ws://.../app/{key}?protocol=7...`) and read
/// `pusher:connection_established`; returns the socket and its socket_id.
pub fn pusher_connect(url: &str) -> (Ws, String) {
    let (mut ws, _) = tungstenite::connect(url).expect("pusher connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    assert_eq!(hello["event"], "pusher:connection_established", "{hello}");
    let data: Value = serde_json::from_str(hello["data"].as_str().expect("data is a string"))
        .expect("data is JSON");
    let id = data["socket_id"].as_str().expect("a socket_id").to_string();
    (ws, id)
}

/// Subscribe, with `since` (offset, epoch) when given, and return the `subscribed` answer.
pub fn subscribe_since(ws: &mut Ws, channel: &str, since: Option<(u64, &str)>) -> Value {
    let mut frame = serde_json::json!({"type": "subscribe", "channel": channel});
    if let Some((offset, epoch)) = since {
        frame["since"] = serde_json::json!({"offset": offset, "epoch": epoch});
    }
    send_json(ws, frame);
    let reply = next_json(ws);
    assert_eq!(reply["type"], "subscribed", "{reply}");
    reply
}

/// Subscribe from now and return the channel's epoch, from the `subscribed` answer.
pub fn subscribe_epoch(ws: &mut Ws, channel: &str) -> String {
    let reply = subscribe_since(ws, channel, None);
    reply["epoch"].as_str().expect("an epoch").to_string()
}

/// Read the next frame, a `presence` event `action` (join or leave) of `user`; returns it.
pub fn expect_presence(ws: &mut Ws, action: &str, user: &str) -> Value {
    let v = next_json(ws);
    assert_eq!(v["type"], "presence", "{v}");
    assert_eq!(v["action"], action, "{v}");
    assert_eq!(v["user_id"], user, "{v}");
    v
}

/// Read frames until the server closes; returns the close code.
pub fn close_code(ws: &mut Ws) -> Option<u16> {
    loop {
        match ws.read() {
            Ok(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
            Ok(_) => continue,
            Err(tungstenite::Error::ConnectionClosed) | Err(tungstenite::Error::AlreadyClosed) => {
                return None
            }
            Err(e) => panic!("ws error before close: {e}"),
        }
    }
}

/// Expect no text frame within `d`.
pub fn expect_silence(ws: &mut Ws, d: Duration) {
    set_timeout(ws, d);
    match ws.read() {
        Ok(Message::Text(t)) => panic!("unexpected frame {t}"),
        Ok(_) => {}
        Err(tungstenite::Error::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        Err(e) => panic!("ws error: {e}"),
    }
    set_timeout(ws, Duration::from_secs(10));
}

/// A raw client's view of a server frame at the start of `buf`: `(header length, payload
/// length)` once its header is whole, `None` while more bytes are needed. Server frames
/// are never masked (checked).
pub fn frame_head(buf: &[u8]) -> Option<(usize, usize)> {
    if buf.len() < 2 {
        return None;
    }
    assert_eq!(buf[1] & 0x80, 0, "server frames are never masked");
    match buf[1] & 0x7f {
        126 => (buf.len() >= 4).then(|| (4, u16::from_be_bytes([buf[2], buf[3]]) as usize)),
        127 => {
            let len: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
            Some((10, u64::from_be_bytes(len) as usize))
        }
        n => Some((2, n as usize)),
    }
}
