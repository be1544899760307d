//! Cluster test support shared by the cluster test files: a real `redis-server` on a
//! free loopback port, `ringcast serve --redis URL` processes, the CLI against Redis.
//! A test file names it as `use common::cluster as support;`.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use super::Project;
use super::{self as common, next_json, parse_response, set_timeout, Ws};
use serde_json::{json, Value};

/// A redis-server child on a fixed port, restartable on the same port and directory.
pub struct Redis {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Redis {
    /// `None` (after saying why) when redis-server is missing and tools are optional.
    pub fn start() -> Option<Redis> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            if std::env::var("RINGCAST_REQUIRE_TOOLS").is_ok_and(|v| v == "1") {
                panic!("redis-server is not installed and RINGCAST_REQUIRE_TOOLS=1");
            }
            eprintln!("SKIP: redis-server is not installed (apt-get install redis-server)");
            return None;
        }
        let port = spare_port();
        let mut redis = Redis {
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
        };
        // Cluster mode needs one master key file shared by every node and the CLI.
        std::fs::write(redis.master_key_file(), format!("{}\n", "ab".repeat(32))).unwrap();
        // As an operator would keep it (the server warns about a file others can read).
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                redis.master_key_file(),
                std::fs::Permissions::from_mode(0o600),
            )
            .unwrap();
        }
        redis.spawn();
        Some(redis)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The master key file every node and CLI call of this cluster uses.
    pub fn master_key_file(&self) -> PathBuf {
        self.dir.path().join("master.key")
    }

    pub fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.conn().is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn conn(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let mut c = client.get_connection_with_timeout(Duration::from_secs(1))?;
        redis::cmd("PING").query::<()>(&mut c)?;
        Ok(c)
    }

    /// One Redis command (`args[0]` and its arguments) and its answer.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = self.conn().expect("redis");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c).expect("redis command")
    }

    /// Save a snapshot (so a restart keeps projects and keys, like a production Redis
    /// with persistence), then kill the server hard.
    pub fn kill(&mut self) {
        let mut c = self.conn().expect("redis conn");
        redis::cmd("SAVE").query::<()>(&mut c).expect("SAVE");
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Subscribers (nodes) that Redis has for a ringcast channel.
    pub fn numsub(&self, project_id: &str, channel: &str) -> u64 {
        let name = format!("ringcast:m:{project_id}:{channel}");
        let Ok(mut c) = self.conn() else {
            return 0;
        };
        redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&name)
            .query::<(String, u64)>(&mut c)
            .map(|(_, n)| n)
            .unwrap_or(0)
    }

    pub fn wait_numsub(&self, project_id: &str, channel: &str, want: u64) {
        wait_for(&format!("{want} Redis subscribers of {channel}"), || {
            self.numsub(project_id, channel) == want
        });
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free port for a child that must be told one (redis-server, haproxy), chosen below
/// the kernel's ephemeral range (32768 and up): a port taken from `bind(0)` and released
/// can be handed to the next `bind(0)` of any other test (a server's metrics listener) in
/// the moment before the child binds it; a port below that range never is. Each call in a
/// process takes the next of a random start, so parallel tests never choose the same one.
pub fn spare_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::sync::OnceLock;
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    static START: OnceLock<u16> = OnceLock::new();
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = *START
        .get_or_init(|| (RandomState::new().hash_one(std::process::id()) % u64::from(SPAN)) as u16);
    loop {
        let step = NEXT.fetch_add(1, Ordering::Relaxed) % SPAN;
        let port = LOW + (start + step) % SPAN;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// [`common::wait_for`] with the cluster tests' limit (10 s).
pub fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    common::wait_for(Duration::from_secs(10), what, cond)
}

/// The CLI against Redis.
pub fn cli(redis: &Redis, args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(common::bin());
    cmd.args(["--redis", &redis.url()])
        .env("RINGCAST_MASTER_KEY_FILE", redis.master_key_file());
    common::cli_with(cmd, dir.path(), args)
}

pub fn project(redis: &Redis, name: &str, rate: &str) -> Project {
    Project::from_create(&cli(
        redis,
        &["project", "create", name, "--rate-limit", rate],
    ))
}

/// [`project`], known to each of `nodes` when it returns.
pub fn project_on(redis: &Redis, name: &str, rate: &str, nodes: &[&Node]) -> Project {
    let p = project(redis, name, rate);
    for node in nodes {
        node.wait_key(&p.secret);
    }
    p
}

/// A project with history `spec` (e.g. `100/300s`), known to each of `nodes` when it
/// returns.
pub fn history_project_on(
    redis: &Redis,
    name: &str,
    rate: &str,
    spec: &str,
    nodes: &[&Node],
) -> Project {
    let args = [
        "project",
        "create",
        name,
        "--rate-limit",
        rate,
        "--history",
        spec,
    ];
    let p = Project::from_create(&cli(redis, &args));
    for node in nodes {
        node.wait_key(&p.secret);
    }
    p
}

/// A Redis and two nodes on it; `None` where [`Redis::start`] is.
pub fn two_nodes() -> Option<(Redis, Node, Node)> {
    let redis = Redis::start()?;
    let a = Node::start(&redis);
    let b = Node::start(&redis);
    Some((redis, a, b))
}

/// One `ringcast serve --redis URL` process.
pub struct Node {
    pub addr: SocketAddr,
    /// The metrics listener, when the node was started with one.
    pub metrics: Option<SocketAddr>,
    pub child: Child,
    pub _dir: tempfile::TempDir,
}

impl Node {
    pub fn start(redis: &Redis) -> Node {
        Node::start_env(redis, &[])
    }

    /// [`Node::start`] with extra environment (e.g. [`common::ALLOW_PRIVATE_WEBHOOKS`]).
    pub fn start_env(redis: &Redis, env: &[(&str, &str)]) -> Node {
        Node::spawn(redis, env, None)
    }

    /// [`Node::start`] with a configuration file of this TOML.
    pub fn start_config(redis: &Redis, toml: &str) -> Node {
        Node::spawn(redis, &[], Some(toml))
    }

    fn spawn(redis: &Redis, env: &[(&str, &str)], toml: Option<&str>) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = node_command(&dir, &redis.url(), &redis.master_key_file(), 2);
        if let Some(toml) = toml {
            let cfg = dir.path().join("ringcast.toml");
            std::fs::write(&cfg, toml).unwrap();
            cmd.arg("--config").arg(cfg);
        }
        cmd.envs(env.iter().copied());
        Node::launch(&mut cmd, dir)
    }

    /// Spawn `cmd` (a [`node_command`] over `dir`, with any additions) and wait for its
    /// start lines; the node owns `dir`. Its stderr is the test's unless `cmd` says.
    pub fn launch(cmd: &mut Command, dir: tempfile::TempDir) -> Node {
        let data = dir.path().join("data");
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn ringcast serve");
        let (addr, metrics) = wait_start(&mut child, &data);
        Node {
            addr,
            metrics,
            child,
            _dir: dir,
        }
    }

    /// `GET path` with `key` on a new connection: the status and the JSON body.
    pub fn get_json(&self, key: &str, path: &str) -> (u16, Value) {
        let req = common::get_request(path, key);
        let (status, _, body) = parse_response(&self.raw(req.as_bytes()));
        (status, body)
    }

    pub fn raw(&self, bytes: &[u8]) -> Vec<u8> {
        common::raw_to(self.addr, bytes)
    }

    pub fn health(&self) -> (u16, Value) {
        common::health_answer(&self.raw(common::HEALTH_REQUEST))
    }

    pub fn publish(&self, key: &str, channel: &str, data: Value) -> (u16, String, Value) {
        let body = json!({"channel": channel, "event": "e", "data": data}).to_string();
        let req = common::post_request("/api/v1/publish", key, &body);
        parse_response(&self.raw(req.as_bytes()))
    }

    pub fn ws(&self, key: &str) -> Ws {
        let url = format!("ws://{}/api/v1/ws?key={}", self.addr, key);
        let (mut ws, _) = tungstenite::connect(url).expect("ws connect");
        set_timeout(&mut ws, Duration::from_secs(10));
        assert_eq!(next_json(&mut ws)["type"], "connected");
        ws
    }

    /// Wait until this node accepts `secret` (keys arrive through the watcher).
    /// [`Node::ws`], subscribed to `channel`.
    pub fn ws_on(&self, key: &str, channel: &str) -> Ws {
        let mut ws = self.ws(key);
        common::subscribe(&mut ws, channel);
        ws
    }

    pub fn wait_key(&self, secret: &str) {
        wait_for("the node to know the key", || {
            self.publish(secret, "warmup", json!("x")).0 != 401
        });
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The command a node runs, before a test's additions: `ringcast --data-dir DIR/data
/// --redis URL serve --listen 127.0.0.1:0 --workers N` with the cluster's master key file
/// and `RUST_LOG=warn` (a later `.env` replaces it).
pub fn node_command(
    dir: &tempfile::TempDir,
    redis_url: &str,
    master: &Path,
    workers: u32,
) -> Command {
    let mut cmd = Command::new(common::bin());
    cmd.arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--redis", redis_url])
        .env("RINGCAST_MASTER_KEY_FILE", master)
        .args(["serve", "--listen", "127.0.0.1:0", "--workers"])
        .arg(workers.to_string())
        .env("RUST_LOG", "warn");
    cmd
}

pub fn wait_listening(child: &mut Child, data: &Path) -> SocketAddr {
    wait_start(child, data).0
}

/// Read a node's start lines: its address and, printed before it when metrics are on,
/// its metrics listener.
pub fn wait_start(child: &mut Child, data: &Path) -> (SocketAddr, Option<SocketAddr>) {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut metrics = None;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let line = common::start_line_text(&line);
            if let Some(rest) = line.strip_prefix("ringcast metrics on http://") {
                metrics = rest.trim_end_matches("/metrics").parse().ok();
            }
            if let Some(rest) = line.strip_prefix("ringcast listening on http://") {
                let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send((addr, metrics));
            }
        }
    });
    let (addr, metrics) = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("node ({}) did not start", data.display()));
    (addr.parse().expect("address"), metrics)
}

pub fn wait_health(node: &Node, status: u16) -> Value {
    let mut last = Value::Null;
    wait_for(&format!("health {status}"), || {
        let (s, v) = node.health();
        last = v;
        s == status
    });
    last
}
