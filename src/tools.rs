//! `ringcast publish` and `ringcast subscribe`: try a running server and script it
//! without writing code. Real clients over the network, nothing in-process: ureq for
//! `POST /api/v1/publish`, tungstenite for the WebSocket, both over rustls for
//! `https://` (and the `wss://` it implies), trusting Mozilla's roots or exactly the
//! certificates of `--ca-file`.
//!
//! Output contract (docs/protocol.md): `publish` prints the answer body and exits 0 on
//! 202, otherwise prints the status and body on stderr and exits non-zero; `subscribe`
//! prints each message frame as one JSON line on stdout (flushed per line, so a pipe
//! sees it at once) and exits 0 after `--count` messages or on SIGINT. A key is never
//! printed by either.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tungstenite::stream::MaybeTlsStream;
use tungstenite::Message;

use crate::cli::{PublishArgs, RemoteArgs, SubscribeArgs};

/// How long `subscribe` waits for the socket before checking for SIGINT.
const POLL: Duration = Duration::from_millis(200);
/// Connect and answer timeout of both commands.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a tool command failed (one line on stderr, exit 1).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("no key: pass --key or set RINGCAST_KEY")]
    NoKey,
    #[error("--url must be http://host:port or https://host:port, got {0:?}")]
    Url(String),
    #[error("DATA is not JSON text ({0}); a string needs quotes, e.g. '\"hello\"'")]
    Data(serde_json::Error),
    #[error("cannot read --ca-file {path}: {why}")]
    CaFile { path: String, why: String },
    #[error("HTTP {status}: {body}")]
    Refused { status: u16, body: String },
    #[error("HTTP {status}: the server redirects to {location:?}; not followed (the key is only ever sent to --url)")]
    Redirect { status: u16, location: String },
    #[error("request failed: {0}")]
    Http(#[from] ureq::Error),
    #[error("WebSocket: {0}")]
    Ws(String),
    #[error("subscribe to {channel:?} refused: {frame}")]
    Subscribe { channel: String, frame: String },
    #[error("the server closed the connection{0}")]
    Closed(String),
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
}

/// `http(s)://host:port[/]` → (tls, "host:port").
fn parse_base(url: &str) -> Result<(bool, String), ToolError> {
    let bad = || ToolError::Url(url.to_string());
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(bad());
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') || authority.contains('@') {
        return Err(bad());
    }
    Ok((tls, authority.to_string()))
}

fn key(remote: &RemoteArgs) -> Result<&str, ToolError> {
    remote
        .key
        .as_deref()
        .filter(|k| !k.is_empty())
        .ok_or(ToolError::NoKey)
}

/// The certificates of a PEM file (DER).
fn ca_certs(path: &Path) -> Result<Vec<Vec<u8>>, ToolError> {
    let err = |why: String| ToolError::CaFile {
        path: path.display().to_string(),
        why,
    };
    let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let certs: Vec<Vec<u8>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c.der().to_vec()),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(err("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// `ringcast publish`.
pub fn publish(args: &PublishArgs) -> Result<(), ToolError> {
    let key = key(&args.remote)?;
    let (_, _) = parse_base(&args.remote.url)?;
    // Checked here so that a typo is a clear local error; sent byte for byte as given.
    serde_json::from_str::<serde_json::Value>(&args.data).map_err(ToolError::Data)?;
    let body = format!(
        "{{\"channel\":{},\"event\":{},\"data\":{}}}",
        serde_json::Value::from(args.channel.as_str()),
        serde_json::Value::from(args.event.as_str()),
        args.data
    );
    let mut tls = ureq::tls::TlsConfig::builder();
    if let Some(path) = &args.remote.ca_file {
        let certs: Vec<_> = ca_certs(path)?
            .into_iter()
            .map(|der| ureq::tls::Certificate::from_der(&der).to_owned())
            .collect();
        tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
    }
    // Redirects are never followed: ureq would resend `X-Api-Key` to wherever the
    // answer points (it only strips `Authorization`), so a 3xx is reported instead.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(TIMEOUT))
        .tls_config(tls.build())
        .build()
        .into();
    let url = format!("{}/api/v1/publish", args.remote.url.trim_end_matches('/'));
    let mut req = agent.post(&url).header("X-Api-Key", key);
    if let Some(idem) = &args.idempotency_key {
        req = req.header("Idempotency-Key", idem);
    }
    let mut resp = req.content_type("application/json").send(body)?;
    let status = resp.status().as_u16();
    if resp.status().is_redirection() {
        let location = resp
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default()
            .to_string();
        return Err(ToolError::Redirect { status, location });
    }
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v.as_bytes() == b"true");
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    if status != 202 {
        return Err(ToolError::Refused { status, body: text });
    }
    if replayed {
        eprintln!("ringcast: Idempotent-Replayed: true (the first answer for this key; nothing was published again)");
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|_| out.flush())
        .map_err(ToolError::Stdout)
}

type Socket = tungstenite::WebSocket<MaybeTlsStream<TcpStream>>;

fn connect(remote: &RemoteArgs) -> Result<Socket, ToolError> {
    let key = key(remote)?;
    let (tls, authority) = parse_base(&remote.url)?;
    let url = format!(
        "{}://{authority}/api/v1/ws?key={key}",
        if tls { "wss" } else { "ws" }
    );
    let ws_err = |e: tungstenite::Error| match e {
        tungstenite::Error::Http(resp) => {
            let body = resp
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default()
                .to_string();
            ToolError::Refused {
                status: resp.status().as_u16(),
                body,
            }
        }
        other => ToolError::Ws(other.to_string()),
    };
    let tcp = TcpStream::connect(&authority).map_err(|e| ToolError::Ws(e.to_string()))?;
    tcp.set_read_timeout(Some(TIMEOUT))
        .and_then(|_| tcp.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| ToolError::Ws(e.to_string()))?;
    let connector = if tls {
        Some(tungstenite::Connector::Rustls(Arc::new(client_tls(
            remote.ca_file.as_deref(),
        )?)))
    } else {
        None
    };
    let (ws, _) = tungstenite::client_tls_with_config(url.as_str(), tcp, None, connector).map_err(
        |e| match e {
            tungstenite::HandshakeError::Failure(e) => ws_err(e),
            tungstenite::HandshakeError::Interrupted(_) => {
                ToolError::Ws("the handshake did not complete".into())
            }
        },
    )?;
    Ok(ws)
}

/// A rustls client for wss://: Mozilla's roots, or exactly the `--ca-file` certificates.
fn client_tls(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, ToolError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for der in ca_certs(path)? {
                roots
                    .add(rustls::pki_types::CertificateDer::from(der))
                    .map_err(|e| ToolError::CaFile {
                        path: path.display().to_string(),
                        why: e.to_string(),
                    })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ToolError::Ws(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(cfg)
}

fn set_read_timeout(ws: &mut Socket, d: Duration) {
    let _ = match ws.get_mut() {
        MaybeTlsStream::Plain(s) => s.set_read_timeout(Some(d)),
        MaybeTlsStream::Rustls(s) => s.sock.set_read_timeout(Some(d)),
        _ => Ok(()),
    };
}

/// The next text frame, or `None` when the read timed out (to check for SIGINT).
fn next_text(ws: &mut Socket) -> Result<Option<String>, ToolError> {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => return Ok(Some(t.as_str().to_string())),
            Ok(Message::Close(frame)) => {
                let why = frame
                    .map(|f| format!(" with {} {}", u16::from(f.code), f.reason))
                    .unwrap_or_default();
                return Err(ToolError::Closed(why));
            }
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e))
                // EINTR: the SIGINT handler ran during the read; the caller checks it.
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(None)
            }
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                return Err(ToolError::Closed(String::new()))
            }
            Err(e) => return Err(ToolError::Ws(e.to_string())),
        }
    }
}

/// The `type` of a server frame.
fn frame_type(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v.get("type")?.as_str().map(str::to_string)
}

/// `ringcast subscribe`.
pub fn subscribe(args: &SubscribeArgs) -> Result<(), ToolError> {
    let interrupted = Arc::new(AtomicBool::new(false));
    // Registered before connecting: a SIGINT at any point ends the command with 0.
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted.clone());
    let mut ws = connect(&args.remote)?;
    // `connected`, then one `subscribed` per channel (in order: the server answers each
    // frame in turn), before anything is printed.
    match next_text(&mut ws)? {
        Some(t) if frame_type(&t).as_deref() == Some("connected") => {}
        other => return Err(ToolError::Ws(format!("unexpected first frame {other:?}"))),
    }
    for channel in &args.channels {
        let frame = serde_json::json!({"type": "subscribe", "channel": channel}).to_string();
        ws.send(Message::text(frame))
            .map_err(|e| ToolError::Ws(e.to_string()))?;
    }
    let mut pending = args.channels.len();
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    set_read_timeout(&mut ws, POLL);
    let mut waited = Duration::ZERO;
    loop {
        if interrupted.load(Ordering::Relaxed) || args.count.is_some_and(|n| printed >= n) {
            let _ = ws.close(None);
            let _ = ws.flush();
            return Ok(());
        }
        let Some(text) = next_text(&mut ws)? else {
            waited += POLL;
            if pending > 0 && waited >= TIMEOUT {
                return Err(ToolError::Ws("no answer to subscribe".into()));
            }
            continue;
        };
        match frame_type(&text).as_deref() {
            Some("subscribed") => pending = pending.saturating_sub(1),
            Some("error") => {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                return Err(ToolError::Subscribe {
                    channel: v["channel"].as_str().unwrap_or_default().to_string(),
                    frame: text,
                });
            }
            Some("message") => {
                writeln!(out, "{}", compact_json(&text))
                    .and_then(|_| out.flush())
                    .map_err(ToolError::Stdout)?;
                printed += 1;
            }
            _ => {}
        }
    }
}

/// JSON text on one line: whitespace outside strings removed, everything else byte for
/// byte (a published `data` keeps its numbers and key order; it may hold newlines
/// between tokens, which would break "one message per line").
fn compact_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\n' | '\r' | '\t') {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(
            parse_base("http://127.0.0.1:8080").unwrap(),
            (false, "127.0.0.1:8080".into())
        );
        assert_eq!(
            parse_base("https://rt.example.com:443/").unwrap(),
            (true, "rt.example.com:443".into())
        );
        for bad in [
            "ws://h:1",
            "127.0.0.1:8080",
            "http://",
            "http://h:1/api",
            "http://u@h:1",
        ] {
            assert!(parse_base(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn compact_keeps_strings_and_numbers() {
        assert_eq!(
            compact_json("{\"a\": [1, 2.50,\n 3],\n \"s\": \"x y\\\" z\"}"),
            "{\"a\":[1,2.50,3],\"s\":\"x y\\\" z\"}"
        );
    }
}
