//! Criterion bench of permessage-deflate's one-shot compression (issue 23): the raw
//! deflate (flate2 on zlib-rs, level 6, sync flush: what the server runs) of one typical
//! JSON message of 200 B to 64 KiB, which a node pays once per message whatever its
//! fan-out, beside libdeflate (`libdeflater`, level 6) on the same input. The compressed
//! size of each is printed once, so the ratio is seen beside the time.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ringcast::bench::deflate_message;

/// A realistic JSON message of about `n` bytes: an order-book style list of objects with
/// repeated field names and varied values.
fn json(n: usize) -> Vec<u8> {
    let mut s =
        String::from(r#"{"type":"message","channel":"orders","event":"update","data":{"items":["#);
    let mut i = 0u64;
    while s.len() < n {
        let x = i.wrapping_mul(2_654_435_761) % 100_000;
        s.push_str(&format!(
            r#"{{"id":{i},"sku":"SKU-{x}","name":"Item {x} deluxe","price":{}.{:02},"qty":{},"tags":["sale","new"]}},"#,
            x % 1000,
            x % 100,
            x % 17
        ));
        i += 1;
    }
    s.push_str(r#"{}]},"id":"0123456789abcdef0123"}"#);
    s.into_bytes()
}

fn deflate(c: &mut Criterion) {
    let mut group = c.benchmark_group("deflate_once_per_message");
    for size in [200usize, 512, 2048, 16 * 1024, 64 * 1024] {
        let data = json(size);
        let z = deflate_message(&data).expect("deflate");
        eprintln!(
            "deflate {} B JSON -> {} B ({:.2})",
            data.len(),
            z.len(),
            z.len() as f64 / data.len() as f64
        );
        group.throughput(Throughput::Bytes(data.len() as u64));
        group.bench_with_input(BenchmarkId::new("flate2_zlib_rs", size), &data, |b, d| {
            b.iter(|| deflate_message(d))
        });
        // libdeflate at the same level; its output is a complete deflate stream (no
        // sync flush), which a permessage-deflate sender may use as it is.
        let mut ld =
            libdeflater::Compressor::new(libdeflater::CompressionLvl::new(6).expect("level"));
        let mut out = vec![0u8; ld.deflate_compress_bound(data.len())];
        let n = ld.deflate_compress(&data, &mut out).expect("libdeflate");
        eprintln!(
            "libdeflate {} B JSON -> {} B ({:.2})",
            data.len(),
            n,
            n as f64 / data.len() as f64
        );
        group.bench_with_input(BenchmarkId::new("libdeflate", size), &data, |b, d| {
            b.iter(|| ld.deflate_compress(d, &mut out))
        });
    }
    group.finish();
}

criterion_group!(benches, deflate);
criterion_main!(benches);
