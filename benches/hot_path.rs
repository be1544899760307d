//! Criterion benches of the publish and fan-out hot path, over in-memory data only:
//! publish parse+validate (100 B, 1 KiB, 16 KiB bodies), frame encoding, one frame
//! fanned out to 1/100/10k local subscribers, a mailbox push+drain across threads, and
//! the reassembly of a 16 KiB client text message, whole and in 64 fragments (the CPU
//! per received byte of a fragmented message should stay within 2× of a whole one), and
//! one history append (position, record, byte budget) with the budget full, so every
//! append evicts. Key lookup and the quota check are in `control_plane.rs`. Idempotent publish (issue
//! 22): a publish request head parsed with and without `Idempotency-Key` (what an
//! unkeyed publish pays for the feature is the header compare), and the keyed path's
//! own work on the owner worker: SHA-256 of the body, claim and complete in the store,
//! at steady state (every key new, the store full, the oldest evicted each time).

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

#[path = "support/cpu.rs"]
mod cpu;
use cpu::cpu_iters;

use ringcast::bench::{
    channel_hash, fan_out, Broadcast, Dialect, HistoryBench, Mailboxes, Registry,
};
use ringcast::{
    message_frame, parse_head, Assembler, HistorySpec, Incoming, Opcode, PublishParser, WsConn,
};

fn body_of(size: usize) -> Vec<u8> {
    let head = r#"{"channel":"orders","event":"order.created","data":{"pad":""#;
    let tail = r#"","n":42,"ok":true}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    format!("{head}{}{tail}", "x".repeat(pad)).into_bytes()
}

fn parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("publish_parse_validate");
    let mut parser = PublishParser::new();
    for size in [100usize, 1024, 16 * 1024] {
        let body = body_of(size);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &body, |b, body| {
            b.iter(|| {
                let m = parser.parse(body).expect("valid body");
                std::hint::black_box(m.data.len())
            })
        });
    }
    group.finish();
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame_encode");
    for size in [100usize, 1024, 16 * 1024] {
        let data = format!("\"{}\"", "x".repeat(size));
        group.bench_with_input(BenchmarkId::from_parameter(size), &data, |b, data| {
            b.iter(|| {
                message_frame(
                    "orders",
                    "order.created",
                    data.as_bytes(),
                    "0123456789abcdef0123",
                )
            })
        });
    }
    group.finish();
}

fn fanout(c: &mut Criterion) {
    let mut group = c.benchmark_group("shard_fan_out");
    let frame = message_frame("orders", "e", br#"{"n":1}"#, "0123456789abcdef0123");
    for subs in [1usize, 100, 10_000] {
        let mut registry = Registry::default();
        let conns: Vec<Rc<WsConn>> = (0..subs as u64)
            // No socket: fd -1 is never touched because nothing aborts.
            .map(|id| Rc::new(WsConn::new(id, -1, usize::MAX / 2, 0)))
            .collect();
        for conn in &conns {
            registry.subscribe(0, "orders", conn);
        }
        let msg = Broadcast::plain(0, "orders".into(), frame.clone());
        group.throughput(Throughput::Elements(subs as u64));
        group.bench_function(BenchmarkId::from_parameter(subs), |b| {
            b.iter(|| {
                let n = fan_out(&registry, &msg);
                for conn in &conns {
                    conn.take_queued();
                }
                n
            })
        });
    }
    group.finish();
}

/// 10k subscribers of one channel, none, half or all of them speaking the Pusher
/// protocol. Each iteration fans out a fresh message, so the Pusher frame (made once per
/// message, by the first worker that needs it) is part of the cost measured.
fn fanout_dialects(c: &mut Criterion) {
    let mut group = c.benchmark_group("shard_fan_out_10k_by_protocol");
    let frame = message_frame(
        "orders",
        "order.created",
        br#"{"id":42,"sku":"A-1","qty":3,"note":"a \"quoted\" word"}"#,
        "0123456789abcdef0123",
    );
    let subs = 10_000u64;
    for (name, every) in [("native", 0u64), ("half_pusher", 2), ("all_pusher", 1)] {
        let mut registry = Registry::default();
        let conns: Vec<Rc<WsConn>> = (0..subs)
            .map(|id| {
                let conn = WsConn::new(id + 1, -1, usize::MAX / 2, 0);
                let pusher = every != 0 && id % every == 0;
                Rc::new(conn.with_dialect(if pusher {
                    Dialect::Pusher
                } else {
                    Dialect::Native
                }))
            })
            .collect();
        for conn in &conns {
            registry.subscribe(0, "orders", conn);
        }
        // Every subscriber takes the frame (a Pusher frame that failed to build would
        // make the loop cheap and the figure wrong).
        let msg = Broadcast::plain(0, "orders".into(), frame.clone());
        assert_eq!(fan_out(&registry, &msg), subs as usize, "{name}");
        for conn in &conns {
            assert_eq!(conn.take_queued().len(), 1);
        }
        group.throughput(Throughput::Elements(subs));
        group.bench_function(name, |b| {
            b.iter_batched(
                || Broadcast::plain(0, "orders".into(), frame.clone()),
                |msg| {
                    let n = fan_out(&registry, &msg);
                    for conn in &conns {
                        conn.take_queued();
                    }
                    n
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn mailbox(c: &mut Criterion) {
    let mut group = c.benchmark_group("mailbox_push_drain_2_threads");
    let batch = 1024u64;
    group.throughput(Throughput::Elements(batch));
    group.bench_function("1024", |b| {
        let boxes = Mailboxes::new(1, 1 << 20);
        let mb = boxes.get(0).expect("one mailbox");
        mb.interest.add(channel_hash(0, "c"));
        let msg = Arc::new(Broadcast::plain(0, "c".into(), Bytes::from_static(b"x")));
        b.iter(|| {
            let producer = {
                let boxes = boxes.clone();
                let msg = msg.clone();
                std::thread::spawn(move || {
                    for _ in 0..batch {
                        while !boxes.broadcast(msg.clone()) {
                            std::hint::spin_loop();
                        }
                    }
                })
            };
            let mut got = 0;
            while got < batch {
                if mb.try_recv().is_some() {
                    got += 1;
                }
            }
            let _ = producer.join();
        })
    });
    group.finish();
}

/// A 16 KiB text message of client-protocol JSON with 2-, 3- and 4-byte characters, so
/// fragment boundaries fall inside UTF-8 sequences.
fn client_text(size: usize) -> Vec<u8> {
    let unit = r#"{"type":"subscribe","channel":"news-é€😀"}"#;
    let mut text = unit.repeat(size / unit.len() + 1);
    let mut cut = size;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    let mut bytes = text.into_bytes();
    bytes.resize(size, b' ');
    bytes
}

/// Assembler::push for every frame of one message, then `release` (what the reader
/// does per message). The payloads are unmasked already; validation and copying are
/// what is measured.
fn reassembly(c: &mut Criterion) {
    const SIZE: usize = 16 * 1024;
    const FRAGMENTS: usize = 64;
    let mut group = c.benchmark_group("reassembly_16KiB_text");
    group.throughput(Throughput::Bytes(SIZE as u64));
    let mut msg = client_text(SIZE);
    let mut asm = Assembler::new(FRAGMENTS);
    group.bench_function("unfragmented", |b| {
        b.iter(|| {
            let n = match asm.push(Opcode::Text, true, &mut msg, SIZE) {
                Ok(Incoming::Message(_, data)) => data.len(),
                other => panic!("{other:?}"),
            };
            asm.release();
            n
        })
    });
    group.bench_function("64_fragments", |b| {
        b.iter(|| {
            let mut n = 0;
            for (i, part) in msg.chunks_mut(SIZE / FRAGMENTS).enumerate() {
                let op = if i == 0 {
                    Opcode::Text
                } else {
                    Opcode::Continuation
                };
                match asm.push(op, i + 1 == FRAGMENTS, part, SIZE) {
                    Ok(Incoming::None) => {}
                    Ok(Incoming::Message(_, data)) => n = data.len(),
                    other => panic!("{other:?}"),
                }
            }
            asm.release();
            n
        })
    });
    group.finish();
}

fn idempotent(c: &mut Criterion) {
    let mut group = c.benchmark_group("idempotent_publish_cpu");
    let body = body_of(100);
    let head = |key: &str| {
        format!(
            "POST /api/v1/publish HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nX-Api-Key: sk_0123456789abcdef0123456789abcdef\r\nContent-Type: application/json\r\n{key}Content-Length: 100\r\n\r\n"
        )
        .into_bytes()
    };
    let plain = head("");
    let keyed = head("Idempotency-Key: 7c9e6679-7425-40de-944b-e07fc1f90ae7\r\n");
    for (name, req) in [
        ("parse_head/no_key", &plain),
        ("parse_head/with_key", &keyed),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                cpu_iters(iters, || {
                    let h = parse_head(req, 8192, 64).expect("valid").expect("complete");
                    std::hint::black_box(h.head_len);
                })
            })
        });
    }
    group.bench_function("sha256_100B_body", |b| {
        use sha2::Digest;
        b.iter_custom(|iters| {
            cpu_iters(iters, || {
                std::hint::black_box(sha2::Sha256::digest(std::hint::black_box(&body[..])));
            })
        })
    });
    // 200k distinct UUID-length keys against a bound of 100k on one worker: every claim
    // is fresh and, once full, evicts the oldest (the worst steady state).
    let keys: Vec<String> = (0..200_000u64)
        .map(|i| {
            format!(
                "{:08x}-7425-40de-944b-{:012x}",
                i,
                i.wrapping_mul(0x9e37_79b9)
            )
        })
        .collect();
    let mut i = 0usize;
    group.bench_function("claim_complete_100B_body", |b| {
        b.iter_custom(|iters| {
            cpu_iters(iters, || {
                i = (i + 1) % keys.len();
                let fresh =
                    ringcast::bench::idempotency_cycle(7, keys[i].as_bytes(), &body, 300, 100_000);
                std::hint::black_box(fresh);
            })
        })
    });
    group.finish();
}

/// One history append of a 200-byte frame with the node's budget (4 MiB) full, so each
/// append also evicts: `one_project`: 1 project writing round-robin to 10,000 channels;
/// `100_projects`: 100 projects of 100 channels each, the same total. Per append: the
/// position, the record, and the budget (the project order, then the channel order).
fn history_append(c: &mut Criterion) {
    let mut group = c.benchmark_group("history_append_budget_full");
    let spec = HistorySpec::parse("100/600s").expect("valid spec");
    let frame = Bytes::from(vec![b'x'; 200]);
    for (label, projects) in [("one_project", 1u32), ("100_projects", 100)] {
        let per_project = 10_000 / projects;
        let names: Vec<String> = (0..per_project).map(|i| format!("ch-{i:05}")).collect();
        let history = HistoryBench::new(4 * 1024 * 1024);
        let mut n = 0u64;
        let mut next = |history: &HistoryBench| {
            let project = (n % u64::from(projects)) as u32;
            let channel = &names[((n / u64::from(projects)) % u64::from(per_project)) as usize];
            n += 1;
            history.append(project, channel, spec, frame.clone())
        };
        // Fill the budget first: 4 MiB of ~400-byte entries.
        for _ in 0..20_000 {
            next(&history);
        }
        group.bench_function(label, |b| b.iter(|| next(&history)));
    }
    group.finish();
}

criterion_group!(
    benches,
    idempotent,
    parse,
    encode,
    fanout,
    fanout_dialects,
    mailbox,
    reassembly,
    history_append
);
criterion_main!(benches);
