//! A tiny deterministic random source (SplitMix64) for initialisation and sampling.
//!
//! Host-side on purpose: the same seed gives the same numbers on every device and build,
//! which candle's device generators do not promise.

/// SplitMix64: a 64-bit generator with good statistical quality for its size.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one named stream under `seed` (e.g. one parameter tensor): the
    /// stream does not depend on which other streams were drawn before.
    pub fn for_stream(seed: u64, stream: &str) -> Self {
        let mut h = SplitMix64::new(seed ^ 0x5157_4f52_4b45_5221);
        let mut acc = h.next_u64();
        for &byte in stream.as_bytes() {
            acc = SplitMix64::new(acc ^ u64::from(byte)).next_u64();
        }
        h.state ^= acc;
        h
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `[0, n)` (`n > 0`), by rejection so it has no modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        let n = n.max(1);
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// A standard normal sample (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = SplitMix64::for_stream(7, "block0.qkv.weight");
                move |_| r.next_u64()
            })
            .collect();
        let mut again = SplitMix64::for_stream(7, "block0.qkv.weight");
        assert_eq!(a[0], again.next_u64());
        let mut other = SplitMix64::for_stream(7, "block1.qkv.weight");
        assert_ne!(a[0], other.next_u64());
        let mut seed8 = SplitMix64::for_stream(8, "block0.qkv.weight");
        assert_ne!(a[0], seed8.next_u64());
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = SplitMix64::new(1);
        let xs: Vec<f64> = (0..20_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
        let mut b = SplitMix64::new(2);
        assert!((0..1000).all(|_| b.below(7) < 7));
    }
}
