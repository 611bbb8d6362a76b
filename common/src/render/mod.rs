//! Renderings of schedules and simulations: text grid, SVG, Chrome trace, table, JSON.
//!
//! Every function here is pure: it takes a [`Schedule`](crate::Schedule) and its
//! [`Simulation`](crate::Simulation) (or a [`report::Report`]) and returns text.
//!
//! - [`grid`]: a text timeline, one row per worker.
//! - [`svg`]: an SVG figure in the style of the pipeline papers.
//! - [`chrome`]: a Chrome / Perfetto trace (`chrome://tracing`, <https://ui.perfetto.dev>).
//! - [`report`]: the numbers of a plan as a struct, JSON and a human table; a comparison table.

pub mod chrome;
pub mod curve;
pub mod executed;
pub mod grid;
pub mod report;
pub mod svg;

/// Formats a number with at most `decimals` decimals, without trailing zeros (`33`, `0.5`);
/// from 10^12 up, with four significant digits and an exponent (`1.234e15`) rather than
/// hundreds of digits.
pub(crate) fn fmt_num(x: f64, decimals: usize) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    if x.abs() >= 1e12 {
        let text = format!("{x:.3e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e{exponent}");
    }
    let text = format!("{x:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    if text == "-0" { "0".to_string() } else { text }
}

/// Formats a fraction as a percentage with two decimals (`3.03 %`).
pub(crate) fn fmt_percent(x: f64) -> String {
    format!("{:.2} %", 100.0 * x)
}

/// The shortest positive pass duration of a simulation (1 when there is none).
pub(crate) fn shortest_pass(sim: &crate::Simulation) -> f64 {
    let q = sim
        .timeline
        .iter()
        .flatten()
        .map(|t| t.end - t.start)
        .filter(|d| *d > 1e-12)
        .fold(f64::INFINITY, f64::min);
    if q.is_finite() { q } else { 1.0 }
}

/// The earliest start of a simulation (0 when there are no passes).
pub(crate) fn first_start(sim: &crate::Simulation) -> f64 {
    let t = sim
        .timeline
        .iter()
        .flatten()
        .map(|t| t.start)
        .fold(f64::INFINITY, f64::min);
    if t.is_finite() { t } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_drop_trailing_zeros() {
        assert_eq!(fmt_num(33.0, 3), "33");
        assert_eq!(fmt_num(0.5, 3), "0.5");
        assert_eq!(fmt_num(1.0 / 3.0, 3), "0.333");
        assert_eq!(fmt_num(-0.0001, 2), "0");
        assert_eq!(fmt_num(1.2345e15, 2), "1.234e15");
        assert_eq!(fmt_num(-1e300, 2), "-1e300");
        assert_eq!(fmt_num(999_999_999_999.0, 2), "999999999999");
        assert_eq!(fmt_percent(3.0 / 11.0), "27.27 %");
    }
}
