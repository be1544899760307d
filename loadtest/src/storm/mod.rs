//! `loadtest storm`: the reconnect-storm scenario of issue 26 (contract "Admission").
//!
//! Two roles, run as separate processes by `loadtest/storm.sh`:
//! - `--role clients`: a fleet of reconnecting clients (`fleet.rs`, `client.rs`), each
//!   on the common channel and its own, all starting on `--home-node`; after a loss a
//!   client comes back as the JS client would (`backoff.rs`) on another node, with
//!   `since` its last position, and records every offset it gets (`ledger.rs`). At the
//!   end it reads the publisher's accepted file and counts lost and duplicated messages.
//! - `--role publisher`: publishes to the common channel and to the own channels
//!   through the storm, retrying on another node with the same `Idempotency-Key`
//!   (`publish.rs`), and writes every accepted (channel, offset, epoch) to
//!   `--accepted-file` (written whole, then renamed, so readers never see half).
//!
//! Both carry the publish→delivery latency (`latency.rs`): the publisher stamps every
//! message's `data` with its send time, the clients histogram every live delivery.
//!
//! Invariants: every phase is bounded (`--duration` or `--stop-file`, then `--drain`,
//! then at most `ACCEPTED_WAIT` for the publisher's file); one JSON line on stdout.

mod backoff;
mod client;
mod fields;
mod fleet;
mod latency;
mod ledger;
mod publish;

use crate::{net, Common};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long the clients wait for the publisher's accepted file after their drain.
const ACCEPTED_WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Clients,
    Publisher,
}

#[derive(Args)]
pub struct StormArgs {
    /// The nodes, comma-separated base URLs (loopback, plaintext), in a fixed order
    /// shared by every process of the run (indexes in the report follow it).
    #[arg(long, value_delimiter = ',', required = true)]
    pub nodes: Vec<String>,
    #[arg(long, value_enum, default_value = "clients")]
    pub role: Role,
    /// Clients of this process.
    #[arg(long, default_value_t = 1000)]
    pub clients: u32,
    /// Global index of this process's first client (own channel `<prefix><tag>u<i>`).
    #[arg(long, default_value_t = 0)]
    pub first_client: u32,
    /// Node (index in --nodes) every client of this process connects to first.
    #[arg(long, default_value_t = 0)]
    pub home_node: usize,
    /// First connects per second (0: all at once).
    #[arg(long, default_value_t = 2000)]
    pub connect_rate: u32,
    /// Seconds to run before stopping (unless --stop-file appears first).
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Stop (clients: then drain) once this file exists.
    #[arg(long)]
    pub stop_file: Option<PathBuf>,
    /// Clients: seconds to keep receiving after the stop.
    #[arg(long, default_value_t = 5.0)]
    pub drain: f64,
    /// Clients: rewritten every 500 ms with `<ready> <total> <lost now>`.
    #[arg(long)]
    pub status_file: Option<PathBuf>,
    /// Clients: the balancer's view, one line of connection counts per node (in --nodes
    /// order), re-read every 500 ms; reconnects then go to the least loaded live node.
    /// Without it: round-robin.
    #[arg(long)]
    pub loads_file: Option<PathBuf>,
    /// Publisher: written at the end; clients: read at the end.
    #[arg(long)]
    pub accepted_file: Option<PathBuf>,
    /// Publisher: own channels are u0..u<total-clients>.
    #[arg(long, default_value_t = 1000)]
    pub total_clients: u32,
    /// Publisher: publishes per second to the common channel.
    #[arg(long, default_value_t = 2.0)]
    pub common_rate: f64,
    /// Publisher: publishes per second to own channels (round-robin over them).
    #[arg(long, default_value_t = 100.0)]
    pub own_rate: f64,
    /// Publisher: threads for the own channels (the common channel has one more).
    #[arg(long, default_value_t = 2)]
    pub pub_threads: u32,
}

/// Everything a clients process counts.
#[derive(Debug, Default)]
pub struct Counters {
    pub attempts: u64,
    pub losses: u64,
    pub messages: u64,
    /// Messages at or below the offset of their connection's `subscribed`: the replay of
    /// a recovery (no latency recorded for them).
    pub replayed: u64,
    /// Publish→delivery latency of every live, stamped message.
    pub latency: latency::Latency,
    /// 1013 on a reconnect (the storm) and on a first connect (the fleet's start-up).
    pub refused_1013: u64,
    pub refused_1013_first: u64,
    pub close_codes: BTreeMap<u16, u64>,
    pub refused_status: BTreeMap<u16, u64>,
    pub failures: BTreeMap<&'static str, u64>,
    pub recovered_true: u64,
    pub recovered_false: u64,
    /// `recovered: false` on a resubscribe whose `since` was offset 0 (the channel had
    /// never been published to when the client last heard of it): a history-less
    /// channel whose first epoch turned with its window (RELIABILITY.md, "A subscribe to
    /// a fresh history channel"), nothing missed; the rest is a real unrecovered gap.
    pub recovered_false_fresh: u64,
    pub server_errors: u64,
    pub other_frames: u64,
    pub unpositioned: u64,
    pub reconnect_wait_ms_sum: u64,
    /// Loss → Ready again, per reconnect of a client that had been Ready.
    pub back_ms: Vec<u32>,
    pub first_loss_unix_ms: u64,
    pub last_back_unix_ms: u64,
    /// (node, unix second) → connections that became Ready.
    pub upgrades: HashMap<(usize, u64), u32>,
    pub ready_at_end: u32,
    /// Ready clients per node (index in `--nodes`) at the end.
    pub ready_per_node: Vec<u32>,
    pub lost_at_end: u32,
    pub never_ready: u32,
}

impl Counters {
    fn note_upgrade(&mut self, node: usize) {
        *self
            .upgrades
            .entry((node, fleet::unix_ms() / 1000))
            .or_default() += 1;
    }
}

fn node_addrs(a: &StormArgs) -> Result<(Vec<SocketAddr>, Vec<String>), String> {
    let mut addrs = Vec::new();
    let mut hosts = Vec::new();
    for u in &a.nodes {
        let e = net::parse_url(u)?;
        if e.tls {
            return Err(format!("{u}: storm speaks plaintext only"));
        }
        addrs.push(e.addr);
        hosts.push(e.host);
    }
    if addrs.is_empty() || a.home_node >= addrs.len() {
        return Err("--home-node is not an index of --nodes".into());
    }
    Ok((addrs, hosts))
}

fn prefix(c: &Common) -> Result<String, String> {
    let tag = c
        .tag
        .as_deref()
        .ok_or("storm needs --tag (the same for every process of the run)")?;
    Ok(format!("{}{tag}", c.channel_prefix))
}

pub fn run(c: &Common, a: &StormArgs) -> Result<Value, String> {
    let (addrs, hosts) = node_addrs(a)?;
    let p = prefix(c)?;
    if c.secret_key.is_empty() && a.role == Role::Publisher {
        return Err("storm publisher needs --secret-key".into());
    }
    if c.public_key.is_empty() && a.role == Role::Clients {
        return Err("storm clients need --public-key".into());
    }
    let until = Instant::now() + crate::secs(a.duration);
    match a.role {
        Role::Publisher => run_publisher(c, a, addrs, hosts, &p, until),
        Role::Clients => run_clients(c, a, addrs, hosts, &p, until),
    }
}

fn run_publisher(
    c: &Common,
    a: &StormArgs,
    addrs: Vec<SocketAddr>,
    hosts: Vec<String>,
    p: &str,
    until: Instant,
) -> Result<Value, String> {
    let threads = a.pub_threads.max(1);
    let mut plans = vec![publish::PubPlan {
        nodes: addrs.clone(),
        host_of: hosts.clone(),
        secret_key: c.secret_key.clone(),
        channels: vec![format!("{p}all")],
        rate: a.common_rate,
        until,
        stop_file: a.stop_file.clone(),
        key_prefix: format!("{p}-{}-c", std::process::id()),
        first_node: 0,
    }];
    for t in 0..threads {
        plans.push(publish::PubPlan {
            nodes: addrs.clone(),
            host_of: hosts.clone(),
            secret_key: c.secret_key.clone(),
            channels: (0..a.total_clients)
                .filter(|i| i % threads == t)
                .map(|i| format!("{p}u{i}"))
                .collect(),
            rate: a.own_rate / f64::from(threads),
            until,
            stop_file: a.stop_file.clone(),
            key_prefix: format!("{p}-{}-o{t}", std::process::id()),
            first_node: t as usize + 1,
        });
    }
    let handles: Vec<_> = plans
        .into_iter()
        .map(|pl| std::thread::spawn(move || publish::run(pl)))
        .collect();
    let mut outs = Vec::new();
    for h in handles {
        outs.push(h.join().map_err(|_| "a publisher thread panicked")?);
    }
    let mut text = String::new();
    for o in &outs {
        for l in &o.accepted {
            text.push_str(l);
            text.push('\n');
        }
    }
    if let Some(f) = &a.accepted_file {
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, &text).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, f).map_err(|e| format!("{}: {e}", f.display()))?;
    }
    let sum = |g: fn(&publish::PubOut) -> u64| outs.iter().map(g).sum::<u64>();
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    for o in &outs {
        for (s, n) in &o.statuses {
            *statuses.entry(s.to_string()).or_default() += n;
        }
    }
    let accepted = ledger::Accepted::parse(&text);
    let failed = sum(|o| o.failed);
    let unpositioned = sum(|o| o.unpositioned);
    let pub_dups = accepted.publisher_duplicates();
    Ok(json!({
        "mode": "storm", "role": "publisher",
        "publishes": sum(|o| o.publishes),
        "accepted": sum(|o| o.accepted.len() as u64),
        // The first plan is the common channel's.
        "accepted_common": outs.first().map_or(0, |o| o.accepted.len()),
        "retries": sum(|o| o.retries),
        "replayed": sum(|o| o.replayed),
        "failed": failed,
        "unpositioned": unpositioned,
        "publisher_duplicate_offsets": pub_dups,
        "statuses": statuses,
        "ok": failed == 0 && unpositioned == 0 && pub_dups == 0,
    }))
}

fn run_clients(
    c: &Common,
    a: &StormArgs,
    addrs: Vec<SocketAddr>,
    hosts: Vec<String>,
    p: &str,
    until: Instant,
) -> Result<Value, String> {
    let names = client::Names {
        common: format!("{p}all"),
        own_prefix: format!("{p}u"),
        ws_path: format!("/api/v1/ws?key={}", c.public_key),
        host: hosts[a.home_node].clone(),
    };
    let plan = fleet::Plan {
        nodes: addrs,
        home: a.home_node,
        first_client: a.first_client,
        clients: a.clients,
        until,
        drain: crate::secs(a.drain),
        stop_file: a.stop_file.clone(),
        status_file: a.status_file.clone(),
        connect_rate: a.connect_rate,
        source_ips: c.source_ips,
        loads_file: a.loads_file.clone(),
    };
    let mut k = Counters::default();
    let clients = fleet::run(&plan, &names, &mut k)?;
    // The publisher's accepted file (it stops at the same time, then writes it).
    let accepted = match &a.accepted_file {
        Some(f) => {
            let waited = Instant::now();
            loop {
                if let Ok(t) = std::fs::read_to_string(f) {
                    break Some(ledger::Accepted::parse(&t));
                }
                if waited.elapsed() > ACCEPTED_WAIT {
                    return Err(format!("{}: never written by the publisher", f.display()));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        None => None,
    };
    let mut lost = 0u64;
    let mut expected = 0u64;
    // [common, own]: a publish to the common channel must reach every client.
    let mut lost_by = [0u64; 2];
    let mut expected_by = [0u64; 2];
    let mut dups = 0u64;
    let mut clients_with_loss = 0u64;
    let (mut foreign, mut before, mut unstarted) = (0u64, 0u64, 0u64);
    for cl in &clients {
        let mut l = 0;
        for (slot, t) in cl.tracks.iter().enumerate() {
            dups += u64::from(t.duplicates);
            foreign += u64::from(t.foreign_epoch);
            before += u64::from(t.before_start);
            if !t.started {
                unstarted += 1;
                continue;
            }
            if let Some(acc) = &accepted {
                let ch = if slot == 0 {
                    names.common.clone()
                } else {
                    names.own(cl.idx)
                };
                let offs = acc.offsets(&ch, &t.epoch);
                let e = offs.iter().filter(|&&o| o > t.start).count() as u64;
                let tl = t.lost(offs);
                expected += e;
                expected_by[slot] += e;
                lost_by[slot] += tl;
                l += tl;
            }
        }
        lost += l;
        clients_with_loss += u64::from(l > 0);
    }
    let mut back = k.back_ms.clone();
    back.sort_unstable();
    let pct = |q: f64| -> Value {
        if back.is_empty() {
            Value::Null
        } else {
            json!(back[((back.len() - 1) as f64 * q).round() as usize])
        }
    };
    let mut upgrades: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
    for ((node, sec), n) in &k.upgrades {
        upgrades
            .entry(node.to_string())
            .or_default()
            .insert(sec.to_string(), *n);
    }
    let ok = accepted.is_some()
        && lost == 0
        && dups == 0
        && k.lost_at_end == 0
        && k.ready_at_end == a.clients
        && k.recovered_false == 0
        && foreign == 0;
    Ok(json!({
        "mode": "storm", "role": "clients",
        "clients": a.clients, "first_client": a.first_client, "home_node": a.home_node,
        "ready_at_end": k.ready_at_end, "lost_at_end": k.lost_at_end, "never_ready": k.never_ready,
        "attempts": k.attempts, "losses": k.losses, "messages": k.messages,
        "expected": expected, "lost": lost, "duplicates": dups,
        "expected_common": expected_by[0], "lost_common": lost_by[0],
        "expected_own": expected_by[1], "lost_own": lost_by[1],
        "replayed_messages": k.replayed, "latency": k.latency.to_json(),
        "ready_per_node": k.ready_per_node,
        "clients_with_loss": clients_with_loss,
        "recovered_true": k.recovered_true, "recovered_false": k.recovered_false,
        "recovered_false_fresh": k.recovered_false_fresh,
        "foreign_epoch": foreign, "before_start": before, "tracks_never_started": unstarted,
        "refused_1013": k.refused_1013, "refused_1013_first_connect": k.refused_1013_first,
        "close_codes": k.close_codes.iter().map(|(c, n)| (c.to_string(), *n)).collect::<BTreeMap<_, _>>(),
        "refused_status": k.refused_status.iter().map(|(c, n)| (c.to_string(), *n)).collect::<BTreeMap<_, _>>(),
        "failures": k.failures,
        "server_errors": k.server_errors, "unpositioned": k.unpositioned,
        "back_ms": {"count": back.len(), "p50": pct(0.5), "p99": pct(0.99), "max": back.last()},
        "first_loss_unix_ms": k.first_loss_unix_ms, "last_back_unix_ms": k.last_back_unix_ms,
        "upgrades_ready_per_node_second": upgrades,
        "ok": ok,
    }))
}
