//! F, B and W time of one transformer block on this machine, for hidden 256 / 512 / 1024,
//! with the B/F and W/F ratios the planner consumes (`pipewise plan --times F,B,W`).
//!
//! `cargo bench -p pipewise-worker --bench stage_passes`; `PIPEWISE_BENCH_QUICK=1` makes it
//! tiny (a smoke run). `PIPEWISE_BENCH_DEVICE=cuda` (or `cuda:N`) runs it on a GPU; that needs
//! the `cuda` feature (`--features cuda`). Each figure is the median of several repetitions,
//! all in one run.

mod common;

use std::time::Instant;

use candle_core::{Device, Tensor};
use pipewise_common::model::{DType, ModelSpec, Piece};
use pipewise_worker::Stage;
use pipewise_worker::rng::SplitMix64;

fn normal(shape: (usize, usize, usize), std: f64, seed: u64, device: &Device) -> Tensor {
    let mut rng = SplitMix64::new(seed);
    let n = shape.0 * shape.1 * shape.2;
    let v: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
    Tensor::from_vec(v, shape, device).expect("tensor")
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let quick = std::env::var("PIPEWISE_BENCH_QUICK").is_ok_and(|v| v == "1");
    let device = common::bench_device();
    let (hiddens, seq_len, mb, reps): (&[u32], u32, usize, usize) = if quick {
        (&[64, 128], 32, 2, 3)
    } else {
        (&[256, 512, 1024], 256, 2, 7)
    };
    println!(
        "stage_passes: one block, f32, {}, seq {seq_len}, microbatch {mb} \
         ({} tokens), median of {reps}",
        match &device {
            Device::Cpu => format!("CPU ({} threads)", candle_core::utils::get_num_threads()),
            d => format!("{:?}", d.location()),
        },
        seq_len as usize * mb
    );
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        // Other work on the machine skews the figures; say how busy it was.
        println!("load average before the run: {}", load.trim());
    }
    println!(
        "{:>6} {:>5} {:>9} {:>9} {:>9} {:>6} {:>6} {:>10}",
        "hidden", "heads", "F ms", "B ms", "W ms", "B/F", "W/F", "F GFLOP/s"
    );
    let mut ratios = Vec::new();
    for &hidden in hiddens {
        let spec = ModelSpec {
            vocab: 256,
            hidden,
            heads: (hidden / 64).max(1),
            layers: 1,
            seq_len,
            dtype: DType::F32,
            ..Default::default()
        };
        let mut stage = Stage::new(&spec, 1..2, 1, &device).expect("stage");
        let shape = (mb, seq_len as usize, hidden as usize);
        let x = normal(shape, 1.0, 2, &device);
        let dy = normal(shape, 1e-3, 3, &device);
        let (mut f, mut b, mut w) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..=reps {
            let t0 = Instant::now();
            let y = stage.forward(0, &x, None).expect("F");
            device.synchronize().expect("sync");
            let t1 = Instant::now();
            stage.backward_input(0, Some(&dy)).expect("B");
            device.synchronize().expect("sync");
            let t2 = Instant::now();
            stage.backward_weight(0).expect("W");
            device.synchronize().expect("sync");
            let t3 = Instant::now();
            drop(y);
            if rep > 0 {
                // Repetition 0 warms up caches and the allocator.
                f.push((t1 - t0).as_secs_f64() * 1e3);
                b.push((t2 - t1).as_secs_f64() * 1e3);
                w.push((t3 - t2).as_secs_f64() * 1e3);
            }
        }
        let (f, b, w) = (median(f), median(b), median(w));
        let gflops = spec.piece_flops(Piece::Block(0), mb as u32) / (f * 1e-3) / 1e9;
        println!(
            "{hidden:>6} {:>5} {f:>9.2} {b:>9.2} {w:>9.2} {:>6.2} {:>6.2} {gflops:>10.1}",
            spec.heads,
            b / f,
            w / f
        );
        ratios.push(format!("h={hidden}: --times 1,{:.2},{:.2}", b / f, w / f));
    }
    println!("planner (F = 1): {}", ratios.join("; "));
}
