//! The Internet checksum (`oxvs_pipeline::checksum`): the word-at-a-time
//! sum the switch uses against the plain 16-bit loop (RFC 1071's
//! reference form, what the pipeline used before), and
//! `complete_l4` on a whole TCP frame, the per-packet cost the switch pays
//! for every TCP/UDP frame from a pod (64, 1514 and 9014 bytes), and
//! `verify_or_complete_l4`, what it pays for one from a tunnel (a
//! complete checksum, verified and kept).
//!
//! Run: `cargo bench -p oxvs-bench --bench checksum -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use oxvs_pipeline::checksum::{complete_l4, fold, ones_sum, verify_or_complete_l4, Completion};

/// The plain loop: one big-endian 16-bit word per step.
fn sum16(data: &[u8], initial: u64) -> u64 {
    let (words, rest) = data.as_chunks::<2>();
    let mut sum = initial;
    for w in words {
        sum += u64::from(u16::from_be_bytes(*w));
    }
    if let [b] = rest {
        sum += u64::from(*b) << 8;
    }
    sum
}

/// Ethernet + IPv4 + TCP frame of `len` bytes (payload bytes vary).
fn tcp_frame(len: usize) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    let total = u16::try_from(len - 14).expect("frame under 64 KiB");
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&[
        0x30, 0x39, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0x12, 0x34, 0, 0,
    ]);
    let mut x = 1u32;
    while f.len() < len {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        f.push(x.to_be_bytes()[0]);
    }
    f
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum");
    for len in [64usize, 1514, 9014] {
        let f = tcp_frame(len);
        assert_eq!(fold(ones_sum(&f, 0)), fold(sum16(&f, 0)));
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(format!("ones_sum/{len}"), |b| {
            b.iter(|| fold(ones_sum(black_box(&f), 0)))
        });
        g.bench_function(format!("sum16/{len}"), |b| {
            b.iter(|| fold(sum16(black_box(&f), 0)))
        });
        let mut frame = f.clone();
        g.bench_function(format!("complete_l4/{len}"), |b| {
            b.iter(|| complete_l4(black_box(&mut frame)))
        });
        // With a complete checksum: verified, kept.
        complete_l4(&mut frame);
        assert_eq!(verify_or_complete_l4(&mut frame), Completion::Valid);
        g.bench_function(format!("verify_or_complete_l4/{len}"), |b| {
            b.iter(|| verify_or_complete_l4(black_box(&mut frame)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
