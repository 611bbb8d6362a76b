//! Helpers for tests that run on every available device.

use std::fmt::Debug;

/// Defines a test on the CPU and, with the `cuda` feature, the same test on GPU 0.
///
/// `test_device!(name, body)` where `body: fn(&Device) -> R` (`R` is `()` or a `Result`
/// whose `Err` fails the test) expands to a module `name` with tests `name::cpu` and, under
/// `#[cfg(feature = "cuda")]`, `name::cuda`.
///
/// ```no_run
/// use pipewise_worker::{Device, Result, Tensor};
///
/// fn adds(device: &Device) -> Result<()> {
///     let x = Tensor::new(&[1f32, 2.0], device)?;
///     assert_eq!((&x + &x)?.to_vec1::<f32>()?, [2.0, 4.0]);
///     Ok(())
/// }
/// pipewise_worker::test_device!(adds_up, adds); // tests adds_up::cpu (and adds_up::cuda)
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! test_device {
    ($name:ident, $body:path) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn cpu() {
                $crate::test_utils::Outcome::check($body(&$crate::Device::Cpu));
            }

            #[cfg(feature = "cuda")]
            #[test]
            fn cuda() {
                match $crate::Device::new_cuda(0) {
                    Ok(device) => $crate::test_utils::Outcome::check($body(&device)),
                    Err(e) => panic!("CUDA device 0: {e}"),
                }
            }
        }
    };
}

/// What a [`test_device!`] body may return: `()` or a `Result` (an `Err` panics).
pub trait Outcome {
    /// Panics on failure.
    fn check(self);
}

impl Outcome for () {
    fn check(self) {}
}

impl<E: Debug> Outcome for Result<(), E> {
    fn check(self) {
        if let Err(e) = self {
            panic!("test failed: {e:?}");
        }
    }
}

/// The largest absolute elementwise difference of two tensors of one shape, in f64.
pub fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> crate::Result<f64> {
    let d = (a.to_dtype(candle_core::DType::F32)? - b.to_dtype(candle_core::DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    Ok(f64::from(d))
}
