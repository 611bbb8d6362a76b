//! `--device` of `pipewise worker` and `pipewise local`: where stages run (CPU or a CUDA
//! GPU), parsed, and opened.

use anyhow::Result;

/// `--device`: where stages run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceArg {
    /// The CPU.
    Cpu,
    /// A CUDA GPU by ordinal.
    Cuda(usize),
}

/// Parses `--device`: `cpu`, `cuda` or `cuda:N`. CUDA is refused here, with how to get it,
/// when this binary was built without the `cuda` feature.
pub(crate) fn parse_device(text: &str) -> std::result::Result<DeviceArg, String> {
    let text = text.trim().to_ascii_lowercase();
    let device = match text.as_str() {
        "cpu" => return Ok(DeviceArg::Cpu),
        "cuda" => DeviceArg::Cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => DeviceArg::Cuda(n),
            _ => return Err(format!("{text:?} is not a device; use cpu, cuda or cuda:N")),
        },
    };
    if cfg!(feature = "cuda") {
        Ok(device)
    } else {
        Err(format!(
            "{text}: this pipewise was built without CUDA; build it with `cargo build \
             --release -p pipewise-cli --features cuda` (docs/cuda.md)"
        ))
    }
}

impl DeviceArg {
    /// The candle device (opens the GPU).
    pub(crate) fn open(self) -> Result<candle_core::Device> {
        match self {
            DeviceArg::Cpu => Ok(candle_core::Device::Cpu),
            DeviceArg::Cuda(n) => candle_core::Device::new_cuda(n)
                .map_err(|e| anyhow::anyhow!("--device cuda:{n}: cannot open the GPU: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!(parse_device("cpu"), Ok(DeviceArg::Cpu));
        assert_eq!(parse_device(" CPU "), Ok(DeviceArg::Cpu));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let err = parse_device(bad).unwrap_err();
            assert!(err.contains("is not a device"), "{bad}: {err}");
        }
        if cfg!(feature = "cuda") {
            assert_eq!(parse_device("cuda"), Ok(DeviceArg::Cuda(0)));
            assert_eq!(parse_device("cuda:3"), Ok(DeviceArg::Cuda(3)));
        } else {
            for gpu in ["cuda", "cuda:1"] {
                let err = parse_device(gpu).unwrap_err();
                assert!(err.contains("built without CUDA"), "{gpu}: {err}");
                assert!(err.contains("--features cuda"), "{gpu}: {err}");
            }
        }
    }
}
