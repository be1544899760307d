//! The HAProxy deployment of `deploy/haproxy.cfg`, black box: a real `haproxy` started
//! here with that file (addresses and the runtime socket replaced for ephemeral ports),
//! two real `ringcast serve` nodes in cluster mode on a real `redis-server`, clients
//! connecting from several loopback source addresses (127.0.0.x).
//!
//! Checks that the client address reaches the nodes through PROXY protocol v2 (seen by
//! `ws_connect_rate_per_ip`: one client address is limited, others behind the same
//! proxy are not), and that after draining one node (runtime API `state drain`, then
//! SIGTERM) its clients get 1001, reconnect through HAProxy and land on the other node.
//!
//! `haproxy` and `redis-server` are required: without them the test fails (CI installs
//! both), it never skips.

mod common;
use common::cluster as support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{next_json, set_timeout, Ws};
use serde_json::{json, Value};
use support::{project, wait_for, Node, Redis};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::Message;

struct HaProxy {
    child: Child,
    addr: SocketAddr,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl HaProxy {
    /// `deploy/haproxy.cfg` with its `# test:` lines pointed at `nodes`.
    fn start(nodes: [SocketAddr; 2]) -> HaProxy {
        let found = Command::new("haproxy")
            .arg("-v")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            found,
            "haproxy is not installed (apt-get install haproxy; .ci/run installs it)"
        );
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("admin.sock");
        let port = support::spare_port();
        let template = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy.cfg"),
        )
        .unwrap();
        let mut replaced = 0;
        let cfg: Vec<String> = template
            .lines()
            .map(|line| {
                let Some((_, tag)) = line.split_once("# test: ") else {
                    return line.to_string();
                };
                replaced += 1;
                match tag.trim() {
                    "stats socket" => {
                        format!("    stats socket {} mode 600 level admin", socket.display())
                    }
                    // This machine's tests run under a 20,000-descriptor limit.
                    "maxconn" => "    maxconn 2000".to_string(),
                    "bind" => format!("    bind 127.0.0.1:{port}"),
                    "node1" => format!("    server node1 {}", nodes[0]),
                    "node2" => format!("    server node2 {}", nodes[1]),
                    other => panic!("unknown test tag {other:?}"),
                }
            })
            .collect();
        assert_eq!(replaced, 5, "deploy/haproxy.cfg lost a `# test:` line");
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg.join("\n") + "\n").unwrap();
        let check = Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .unwrap();
        common::assert_success(&check, "haproxy -c refused the config");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start haproxy");
        let mut lb = HaProxy {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            socket,
            _dir: dir,
        };
        wait_for("haproxy to serve /health", || {
            if let Ok(Some(status)) = lb.child.try_wait() {
                panic!("haproxy exited: {status}");
            }
            lb.health_from(2) == 200
        });
        lb
    }

    /// A runtime API command; returns its answer.
    fn command(&self, cmd: &str) -> String {
        let mut s = UnixStream::connect(&self.socket).expect("stats socket");
        s.write_all(format!("{cmd}\n").as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// A TCP connection to HAProxy from 127.0.0.`host`.
    fn connect_from(&self, host: u8) -> TcpStream {
        let tcp = self.try_connect_from(host).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        tcp
    }

    /// A TCP connection to HAProxy from 127.0.0.`host`, or the error connecting.
    fn try_connect_from(&self, host: u8) -> std::io::Result<TcpStream> {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let from = SocketAddr::from(([127, 0, 0, host], 0));
        sock.bind(&from.into()).unwrap();
        sock.connect(&self.addr.into())?;
        Ok(sock.into())
    }

    fn health_from(&self, host: u8) -> u16 {
        let Ok(mut tcp) = self.try_connect_from(host) else {
            return 0;
        };
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = tcp.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let mut out = Vec::new();
        let _ = tcp.read_to_end(&mut out);
        common::parse_response(&out).0
    }

    /// A WebSocket through HAProxy from 127.0.0.`host`: the answer's status, and the
    /// socket with its `connected` frame when it was upgraded.
    fn ws_from(&self, host: u8, key: &str) -> Result<(Ws, Value), u16> {
        let tcp = self.connect_from(host);
        let url = format!("ws://{}/api/v1/ws?key={key}", self.addr);
        match tungstenite::client(url, MaybeTlsStream::Plain(tcp)) {
            Ok((mut ws, _)) => {
                set_timeout(&mut ws, Duration::from_secs(10));
                let hello = next_json(&mut ws);
                assert_eq!(hello["type"], "connected", "{hello}");
                Ok((ws, hello))
            }
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
                Err(resp.status().as_u16())
            }
            Err(e) => panic!("upgrade through haproxy: {e}"),
        }
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A cluster node that trusts HAProxy (127.0.0.1) for the client address.
fn node(redis: &Redis) -> Node {
    Node::start_config(
        redis,
        "trusted_proxies = [\"127.0.0.1\"]\nws_connect_rate_per_ip = 1\ndrain_spread_s = 1\n",
    )
}

/// The node part of a `connection_id` (`<node>.<local>`).
fn node_of(hello: &Value) -> String {
    let id = hello["connection_id"].as_str().expect("connection_id");
    id.split_once('.').expect("<node>.<local>").0.to_string()
}

#[test]
fn client_addresses_reach_the_nodes_and_a_drained_nodes_clients_move_over() {
    let redis = Redis::start().expect("redis-server is required (apt-get install redis-server)");
    let mut n1 = node(&redis);
    let n2 = node(&redis);
    let p = project(&redis, "lb", "100000/s");
    n1.wait_key(&p.secret);
    n2.wait_key(&p.secret);
    let lb = HaProxy::start([n1.addr, n2.addr]);

    // One node only, so the per-node connect rate sees every attempt.
    let answer = lb.command("set server ringcast_nodes/node2 state maint");
    assert!(answer.trim().is_empty(), "{answer}");
    // Through PROXY v2 the node sees 127.0.0.2, not HAProxy's 127.0.0.1: three upgrades
    // from it within two one-second windows of `ws_connect_rate_per_ip = 1` cannot all
    // pass ...
    let from_2: Vec<Result<(Ws, Value), u16>> = (0..3).map(|_| lb.ws_from(2, &p.public)).collect();
    assert!(
        from_2.iter().any(|r| matches!(r, Err(429))),
        "one client address was not limited"
    );
    // ... while other clients behind the same proxy, right after, are each let in (with
    // HAProxy's address for all of them, at most one per second would be).
    for host in 3..=6 {
        assert!(
            lb.ws_from(host, &p.public).is_ok(),
            "client 127.0.0.{host} was refused"
        );
    }
    drop(from_2);
    lb.command("set server ringcast_nodes/node2 state ready");

    // Clients spread over both nodes (least connections).
    let mut clients: Vec<(Ws, String)> = Vec::new();
    for host in 10..30 {
        let (mut ws, hello) = lb.ws_from(host, &p.public).expect("upgrade");
        common::subscribe(&mut ws, "all");
        clients.push((ws, node_of(&hello)));
    }
    let first_node = clients[0].1.clone();
    let on_first = clients.iter().filter(|c| c.1 == first_node).count();
    assert!(on_first > 0 && on_first < clients.len(), "all on one node");

    // Which node is node1: the id a direct connection to it reports.
    let n1_id = {
        let url = format!("ws://{}/api/v1/ws?key={}", n1.addr, p.public);
        let (mut ws, _) = tungstenite::connect(url).expect("direct");
        set_timeout(&mut ws, Duration::from_secs(10));
        node_of(&next_json(&mut ws))
    };
    let moving = clients.iter().filter(|c| c.1 == n1_id).count();
    assert!(moving > 0, "no client on node1");

    // Drain node1, then stop it: its clients get 1001 and come back through HAProxy.
    let answer = lb.command("set server ringcast_nodes/node1 state drain");
    assert!(answer.trim().is_empty(), "{answer}");
    let _ = Command::new("kill")
        .args(["-15", &n1.child.id().to_string()])
        .status();
    let mut host = 100u8;
    for (ws, on) in clients.iter_mut() {
        if *on != n1_id {
            continue;
        }
        set_timeout(ws, Duration::from_secs(20));
        let code = loop {
            match ws.read() {
                Ok(Message::Close(f)) => break f.map(|f| u16::from(f.code)),
                Ok(_) => continue,
                Err(e) => panic!("before the close: {e}"),
            }
        };
        assert_eq!(code, Some(1001));
        // Reconnect as the JS client does (a new connection, here a new address).
        host += 1;
        let (mut again, hello) = lb.ws_from(host, &p.public).expect("reconnect");
        common::subscribe(&mut again, "all");
        *ws = again;
        *on = node_of(&hello);
    }
    assert!(n1.child.wait().unwrap().success());
    assert!(
        clients.iter().all(|c| c.1 != n1_id),
        "a client landed on the drained node"
    );
    // Every client, all now on node2, receives a publish.
    let (status, _, _) = n2.publish(&p.secret, "all", json!({"after": "drain"}));
    assert_eq!(status, 202);
    for (ws, _) in clients.iter_mut() {
        let v = next_json(ws);
        assert_eq!(v["data"]["after"], "drain", "{v}");
    }
}
