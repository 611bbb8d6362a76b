//! Helpers shared by the worker's benches.

use candle_core::Device;

/// The device from `PIPEWISE_BENCH_DEVICE`: unset or `cpu`, `cuda` (GPU 0) or `cuda:N`.
pub(crate) fn bench_device() -> Device {
    let name = std::env::var("PIPEWISE_BENCH_DEVICE").unwrap_or_default();
    let ordinal = match name.as_str() {
        "" | "cpu" => return Device::Cpu,
        "cuda" => 0,
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => n,
            _ => panic!("PIPEWISE_BENCH_DEVICE={other}: expected cpu, cuda or cuda:N"),
        },
    };
    let hint = if cfg!(feature = "cuda") {
        ""
    } else {
        " (build with --features cuda)"
    };
    Device::new_cuda(ordinal).unwrap_or_else(|e| panic!("PIPEWISE_BENCH_DEVICE={name}: {e}{hint}"))
}
