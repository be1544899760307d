//! Test support: start the real `ringcast` binary on 127.0.0.1:0 with its own data
//! directory, create projects through the real CLI, and talk to it with real clients
//! (ureq for HTTP, tungstenite for WebSocket, raw TcpStream for protocol abuse).
//! The server is stopped (SIGTERM, then kill) when the handle drops.
//!
//! TLS: [`TlsFiles::generate`] makes a self-signed certificate (rcgen) for 127.0.0.1,
//! [`Server::start_tls`] passes it with `--tls-cert/--tls-key`, and from then on every
//! helper (`raw`, `publish`, `health`, `project`, `ws`) speaks TLS trusting exactly that
//! certificate. [`Server::raw_plain`] still sends plaintext, to the TLS port too.

#![allow(dead_code)]

pub mod cluster;
pub mod metrics;
pub mod sign;
pub mod users;
mod ws;

pub use ws::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::WebSocket;

/// The binary under test: this build's, or `RINGCAST_TEST_BIN` to run the same
/// black-box tests against another build (e.g. to show a regression test fails on the
/// code before a fix).
pub fn bin() -> std::path::PathBuf {
    std::env::var_os("RINGCAST_TEST_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_ringcast").into())
}

pub type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

/// Run the CLI against `data_dir`, expecting success and one JSON object.
pub fn cli(data_dir: &Path, args: &[&str]) -> Value {
    cli_with(Command::new(bin()), data_dir, args)
}

/// [`cli`] with `cmd` (the binary, with any options or environment already given).
pub fn cli_with(mut cmd: Command, data_dir: &Path, args: &[&str]) -> Value {
    let out = cmd
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .expect("run ringcast CLI");
    assert!(
        out.status.success(),
        "ringcast {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("CLI prints JSON")
}

/// A project's id and keys, as `project create` printed them.
#[derive(Clone, Debug)]
pub struct Project {
    pub id: String,
    /// The secret key (`sk_...`).
    pub secret: String,
    /// The public key (`pk_...`).
    pub public: String,
    /// The token secret (`ts_...`): signs channel tokens; the Pusher app secret.
    pub token_secret: String,
    /// The Pusher app id (digits, as a string).
    pub app_id: String,
}

impl Project {
    /// From the JSON `ringcast project create` prints.
    pub fn from_create(v: &Value) -> Project {
        fn field(f: &Value) -> String {
            f.as_str()
                .expect("project create prints this field")
                .to_owned()
        }
        let p = Project {
            id: field(&v["project"]["id"]),
            secret: field(&v["secret_key"]),
            public: field(&v["public_key"]),
            token_secret: field(&v["token_secret"]),
            app_id: field(&v["project"]["pusher_app_id"]),
        };
        assert!(p.token_secret.starts_with("ts_"), "{v}");
        p
    }
}

pub struct Server {
    pub addr: SocketAddr,
    /// The rest of the start line after the address, e.g. "(2 workers, io_uring)".
    pub banner: String,
    pub data_dir: PathBuf,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
    /// Set for a TLS server: the client configuration trusting its certificate.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The metrics listener (`metrics_listen` in the config), from its stdout line.
    pub metrics: Option<SocketAddr>,
}

/// A self-signed certificate for 127.0.0.1 and localhost, written as PEM files.
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_der: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl TlsFiles {
    pub fn generate() -> TlsFiles {
        let ck = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])
        .expect("generate certificate");
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
        TlsFiles {
            cert,
            key,
            cert_der: ck.cert.der().to_vec(),
            _dir: dir,
        }
    }

    /// A rustls client trusting only this certificate, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(
                self.cert_der.clone(),
            ))
            .expect("add root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(cfg)
    }

    /// A ureq agent trusting only this certificate (statuses are not errors).
    pub fn agent(&self) -> ureq::Agent {
        let root = ureq::tls::Certificate::from_der(&self.cert_der).to_owned();
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&[root]))
            .build();
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls)
            .build()
            .into()
    }
}

/// Either a plain or a TLS client connection, for the raw helpers.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// The environment a server needs to post webhooks to a receiver in the test, which
/// listens on 127.0.0.1 (`webhook_allow_private_addresses`, default false). An env
/// variable, not a config key, so an older binary given it still starts.
#[allow(dead_code)]
pub const ALLOW_PRIVATE_WEBHOOKS: (&str, &str) =
    ("RINGCAST_WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true");

pub struct Options {
    pub workers: usize,
    pub config: String,
    /// Extra environment for the server process (may override `RUST_LOG=warn`).
    pub env: Vec<(&'static str, &'static str)>,
    /// Write the server's stderr (its logs) to this file instead of the test's stderr.
    pub log_file: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workers: 2,
            config: String::new(),
            env: Vec::new(),
            log_file: None,
        }
    }
}

impl Options {
    /// The default options with `config` as the config file's text.
    pub fn config(config: &str) -> Options {
        Options {
            config: config.into(),
            ..Options::default()
        }
    }

    /// These options with `n` workers.
    pub fn workers(self, n: usize) -> Options {
        Options { workers: n, ..self }
    }
}

/// The text of a line the server prints on stdout: the line itself, or with
/// `--log-format json` the `fields.message` of its JSON object.
pub fn start_line_text(line: &str) -> String {
    serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v["fields"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| line.to_string())
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(Options::default())
    }

    pub fn start_with(opts: Options) -> Server {
        Server::launch(opts, None)
    }

    /// Start with `--tls-cert/--tls-key` from `files`; helpers then speak TLS.
    pub fn start_tls(opts: Options, files: &TlsFiles) -> Server {
        Server::launch(opts, Some(files))
    }

    fn launch(opts: Options, tls: Option<&TlsFiles>) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data_dir = tmp.path().join("data");
        let mut server = Server {
            addr: "127.0.0.1:0".parse().unwrap(),
            banner: String::new(),
            data_dir,
            child: None,
            _tmp: None,
            tls: tls.map(|f| f.client_config(&[b"http/1.1"])),
            metrics: None,
        };
        let args: Vec<&std::ffi::OsStr> = match tls {
            Some(f) => vec![
                "--tls-cert".as_ref(),
                f.cert.as_os_str(),
                "--tls-key".as_ref(),
                f.key.as_os_str(),
            ],
            None => Vec::new(),
        };
        server.spawn(&opts, tmp.path(), &args);
        server._tmp = Some(tmp);
        server
    }

    fn spawn(&mut self, opts: &Options, dir: &Path, extra: &[&std::ffi::OsStr]) {
        let config = dir.join("ringcast.toml");
        std::fs::write(&config, &opts.config).expect("write config");
        // Create the database before the server starts, so projects can be added by
        // the CLI at any time.
        std::fs::create_dir_all(&self.data_dir).unwrap();
        let mut child = Command::new(bin())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["serve", "--listen", "127.0.0.1:0", "--workers"])
            .arg(opts.workers.to_string())
            .arg("--config")
            .arg(&config)
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(opts.env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(match &opts.log_file {
                Some(path) => Stdio::from(std::fs::File::create(path).expect("log file")),
                None => Stdio::inherit(),
            })
            .spawn()
            .expect("spawn ringcast serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (metrics_tx, metrics_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                let line = start_line_text(&line);
                // Printed before the listening line when metrics are on.
                if let Some(rest) = line.strip_prefix("ringcast metrics on http://") {
                    let _ = metrics_tx.send(rest.trim_end_matches("/metrics").to_string());
                }
                let rest = line
                    .strip_prefix("ringcast listening on http://")
                    .or_else(|| line.strip_prefix("ringcast listening on https://"));
                if let Some(rest) = rest {
                    let _ = tx.send(rest.to_string());
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("server printed its address");
        self.metrics = metrics_rx.try_recv().ok().and_then(|a| a.parse().ok());
        let addr = line.split_whitespace().next().unwrap_or("");
        self.addr = addr.parse().expect("address");
        // "(N workers, io_uring|epoll)"
        self.banner = line;
        self.child = Some(child);
    }

    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{}", self.addr, path)
    }

    /// A client connection: TLS (handshake done) when the server is a TLS server.
    pub fn connect(&self) -> Conn {
        let tcp = TcpStream::connect(self.addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        match &self.tls {
            None => Conn::Plain(tcp),
            Some(cfg) => {
                let name = rustls::pki_types::ServerName::IpAddress(self.addr.ip().into());
                let conn = rustls::ClientConnection::new(cfg.clone(), name).expect("tls client");
                let mut stream = rustls::StreamOwned::new(conn, tcp);
                while stream.conn.is_handshaking() {
                    stream
                        .conn
                        .complete_io(&mut stream.sock)
                        .expect("TLS handshake");
                }
                Conn::Tls(Box::new(stream))
            }
        }
    }

    /// Send raw bytes as plaintext, whatever the server speaks; read until it closes.
    pub fn raw_plain(&self, bytes: &[u8]) -> Vec<u8> {
        raw_to(self.addr, bytes)
    }

    pub fn project(&self, name: &str, rate: &str) -> Project {
        self.project_json(name, &["--rate-limit", rate]).0
    }

    /// A project whose rate limit (10000/s) no test reaches by accident.
    pub fn test_project(&self, name: &str) -> Project {
        self.project(name, "10000/s")
    }

    /// `project create NAME ARGS...`: the project, once the server knows its keys, and
    /// the JSON the CLI printed.
    pub fn project_json(&self, name: &str, args: &[&str]) -> (Project, Value) {
        let mut all = vec!["project", "create", name];
        all.extend_from_slice(args);
        let v = cli(&self.data_dir, &all);
        let p = Project::from_create(&v);
        // The server sees new keys within its refresh interval.
        self.wait_key(&p.secret);
        (p, v)
    }

    /// Wait until the server refuses a public key (after `key revoke`): its upgrade
    /// answers 401.
    pub fn wait_key_refused(&self, public: &str) {
        let url = self.ws_url(public);
        wait_for(
            Duration::from_secs(3),
            "the revocation to reach the server",
            || matches!(tungstenite::connect(url.as_str()), Err(tungstenite::Error::Http(r)) if r.status().as_u16() == 401),
        );
    }

    /// Wait until the server knows a secret key (a 401 turns into anything else).
    pub fn wait_key(&self, secret: &str) {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let (status, _, _) = self.raw_publish(secret, "application/json", b"{}");
            if status != 401 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("server did not pick up key in time");
    }

    /// POST /api/v1/publish over a fresh connection; returns status, head, body.
    pub fn raw_publish(&self, key: &str, content_type: &str, body: &[u8]) -> (u16, String, Value) {
        let mut req = format!(
            "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        if !key.is_empty() {
            req.push_str(&format!("X-Api-Key: {key}\r\n"));
        }
        if !content_type.is_empty() {
            req.push_str(&format!("Content-Type: {content_type}\r\n"));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        let resp = self.raw(&bytes);
        parse_response(&resp)
    }

    pub fn publish(&self, key: &str, channel: &str, event: &str, data: Value) -> (u16, Value) {
        let body = serde_json::json!({"channel": channel, "event": event, "data": data});
        let (s, _, v) = self.raw_publish(key, "application/json", body.to_string().as_bytes());
        (s, v)
    }

    /// `GET path` with `key` on a new connection: the status and the JSON body.
    pub fn get_json(&self, key: &str, path: &str) -> (u16, Value) {
        let (status, _, body) = parse_response(&self.raw(get_request(path, key).as_bytes()));
        (status, body)
    }

    /// Send raw bytes on a new connection and read until the server closes it.
    pub fn raw(&self, bytes: &[u8]) -> Vec<u8> {
        let mut s = self.connect();
        s.write_all(bytes).expect("write");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }

    /// POST /api/v1/publish with `key` and the JSON `body` through `agent` (which keeps
    /// its connection from one call to the next); the response, whatever its status.
    pub fn agent_publish(
        &self,
        agent: &ureq::Agent,
        key: &str,
        body: &str,
    ) -> ureq::http::Response<ureq::Body> {
        agent
            .post(self.url("/api/v1/publish"))
            .header("X-Api-Key", key)
            .content_type("application/json")
            .send(body)
            .expect("publish request")
    }

    pub fn health(&self) -> (u16, Value) {
        health_answer(&self.raw(HEALTH_REQUEST))
    }

    pub fn ws_url(&self, key: &str) -> String {
        let scheme = if self.tls.is_some() { "wss" } else { "ws" };
        format!("{scheme}://{}/api/v1/ws?key={}", self.addr, key)
    }

    /// Connect a WebSocket client and read the `connected` frame.
    pub fn ws(&self, key: &str) -> Ws {
        let (mut ws, _) = match &self.tls {
            None => tungstenite::connect(self.ws_url(key)).expect("ws connect"),
            Some(cfg) => {
                let tcp = TcpStream::connect(self.addr).expect("connect");
                tungstenite::client_tls_with_config(
                    self.ws_url(key),
                    tcp,
                    None,
                    Some(tungstenite::Connector::Rustls(cfg.clone())),
                )
                .expect("wss connect")
            }
        };
        set_timeout(&mut ws, Duration::from_secs(10));
        let hello = next_json(&mut ws);
        assert_eq!(hello["type"], "connected", "{hello}");
        ws
    }

    /// [`Server::ws`], subscribed to `channel`.
    pub fn ws_on(&self, key: &str, channel: &str) -> Ws {
        let mut ws = self.ws(key);
        subscribe(&mut ws, channel);
        ws
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Stop the server (SIGTERM) and start a new one on the same data directory (and a
    /// new port: `addr` is updated). Plaintext servers only.
    pub fn restart(&mut self, opts: Options) {
        self.terminate(Duration::from_secs(10));
        let dir = self
            ._tmp
            .as_ref()
            .expect("a server started by Server::start owns its directory")
            .path()
            .to_path_buf();
        self.spawn(&opts, &dir, &[]);
    }

    /// Send SIGTERM and wait for the exit status (None if it did not exit in `limit`).
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        unsafe_kill(child.id(), 15);
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn unsafe_kill(pid: u32, sig: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A ureq agent for plaintext servers (statuses are not errors).
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// Poll `cond` every 20 ms until it holds; panic naming `what` after `limit`. Tests wait
/// for conditions, never for fixed times.
pub fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Parse an HTTP/1.1 response: status, head text, JSON body (Null if none).
pub fn parse_response(resp: &[u8]) -> (u16, String, Value) {
    let text = String::from_utf8_lossy(resp).to_string();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return (0, text, Value::Null);
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, head.to_string(), body)
}

/// Find a header's value in a response head (case-insensitive name).
pub fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// Whether a publish's answer says it replays an earlier one (`Idempotent-Replayed`).
pub fn replayed(head: &str) -> bool {
    header(head, "Idempotent-Replayed").as_deref() == Some("true")
}

/// `GET path` with `key`, the connection closed after the answer: the request's bytes.
pub fn get_request(path: &str, key: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: t\r\nX-Api-Key: {key}\r\nConnection: close\r\n\r\n")
}

/// The worker index inside a `connection_id` (`<node>.<worker << 40 | connection>`, the
/// documented socket id form), so a test can choose "another worker" instead of hoping.
pub fn worker_of(connection_id: &str) -> String {
    let (node, local) = connection_id
        .split_once('.')
        .unwrap_or_else(|| panic!("connection_id {connection_id:?} is not <node>.<local>"));
    assert!(node.parse::<u32>().is_ok(), "{connection_id}");
    let local: u64 = local.parse().expect("local part is decimal");
    (local >> 40).to_string()
}

/// The string `field` of each object in the JSON array `items`, in order.
pub fn strs<'a>(items: &'a Value, field: &str) -> Vec<&'a str> {
    let items = items.as_array().expect("an array");
    items
        .iter()
        .map(|i| i[field].as_str().expect("a string"))
        .collect()
}

/// `POST path` with `key` and a JSON `body`, the connection closed after the answer: the
/// request's bytes, for [`Server::raw`] and its kin.
pub fn post_request(path: &str, key: &str, body: &str) -> String {
    post_request_with(path, key, &[], body)
}

/// [`post_request`] with more header lines (`(name, value)`, e.g. `Idempotency-Key`).
pub fn post_request_with(path: &str, key: &str, headers: &[(&str, &str)], body: &str) -> String {
    let more: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {key}\r\n{more}Content-Type: application/json\r\n\r\n{body}",
        body.len()
    )
}

/// Assert that a command finished with success, showing its stderr when not.
pub fn assert_success(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The JSON lines of a `--log-format json` log whose `fields.message` satisfies `which`
/// (lines not yet whole, or not JSON, are passed over).
pub fn log_lines(path: &Path, which: impl Fn(&str) -> bool) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"].as_str().is_some_and(&which))
        .collect()
}

/// Unix seconds now (token `exp`, Pusher's `auth_timestamp`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs()
}

/// The resident set size of process `pid`, in KiB (Linux's `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

/// A JWT over `claims`, HS256 with `secret` (channel and connection tokens).
pub fn hs256(secret: &str, claims: Value) -> String {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("HS256 signs any claims")
}

/// A channel token for user `sub` on `channel`, valid for ten minutes.
pub fn channel_token(secret: &str, channel: &str, sub: &str) -> String {
    hs256(
        secret,
        serde_json::json!({"channel": channel, "exp": unix_now() + 600, "sub": sub}),
    )
}

/// Send raw bytes to `addr` in plaintext on a new connection and read until it closes
/// (10 s at most per read).
pub fn raw_to(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// `GET /health`, the connection closed after the answer.
pub const HEALTH_REQUEST: &[u8] = b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

/// The status and JSON of a `/health` answer.
pub fn health_answer(resp: &[u8]) -> (u16, Value) {
    let (s, _, v) = parse_response(resp);
    (s, v)
}
