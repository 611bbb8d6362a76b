//! A line chart as SVG: bubble against memory limit (`pipewise plan --sweep-memory`).

use std::fmt::Write as _;

use super::fmt_num;
use super::svg::{escape, tick_step};

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 56.0;
const FONT: &str = "Helvetica, Arial, sans-serif";

/// One named series of (x, y) points, drawn as a step-free polyline with markers.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// Where a chart's y axis starts and ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YRange {
    /// From 0 to a tick above the largest y (quantities whose zero matters: a bubble).
    FromZero,
    /// From a tick below the smallest y to one above the largest (a loss curve, whose
    /// shape is in a band far from 0).
    Fitted,
}

/// A series of more points than this is drawn as its line alone, without a marker (and
/// hover text) per point: a loss curve of thousands of steps stays small.
pub const MAX_MARKERS: usize = 64;

/// Renders `series` on shared axes starting at y = 0.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    line_chart_in(YRange::FromZero, title, (x_label, y_label), series)
}

/// Renders `series` on shared axes, the y axis over `range`; points that are not finite
/// are left out.
pub fn line_chart_in(
    range: YRange,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
) -> String {
    let all = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y_min, mut y_max) = (f64::INFINITY, f64::NEG_INFINITY);
    for (x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
        (y_min, y_max) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let (y0, y1) = y_bounds(range, y_min, y_max);
    let y_step = tick_step(y1 - y0, 6.0);
    let (y0, y1) = (
        (y0 / y_step).floor() * y_step,
        (y1 / y_step).ceil() * y_step,
    );
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let px = |x: f64| LEFT + (x - x0) / (x1 - x0) * plot_w;
    let py = |y: f64| TOP + plot_h - (y - y0) / (y1 - y0) * plot_h;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}">"#
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="28" font-size="17" font-weight="bold">{}</text>"#,
        escape(title)
    );
    // Axes, grid and ticks.
    let mut y = y0;
    while y <= y1 + y_step * 1e-6 {
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{0}" y1="{1:.1}" y2="{1:.1}" stroke="#e3e3e3"/><text x="{2}" y="{3:.1}" font-size="12" text-anchor="end">{4}</text>"##,
            LEFT + plot_w,
            py(y),
            LEFT - 6.0,
            py(y) + 4.0,
            fmt_num(y, 2)
        );
        y += y_step;
    }
    let x_step = tick_step(x1 - x0, 8.0);
    let mut x = (x0 / x_step).ceil() * x_step;
    while x <= x1 + 1e-9 {
        let _ = writeln!(
            out,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="#999"/><text x="{0:.1}" y="{3:.1}" font-size="12" text-anchor="middle">{4}</text>"##,
            px(x),
            TOP + plot_h,
            TOP + plot_h + 5.0,
            TOP + plot_h + 19.0,
            fmt_num(x, 3)
        );
        x += x_step;
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 14.0,
        escape(x_label)
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" font-size="13" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        escape(y_label)
    );
    const COLOURS: [&str; 4] = ["#2f6fb3", "#c0392b", "#27ae60", "#8e44ad"];
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let shown: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        let points: Vec<String> = shown
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"><title>{}</title></polyline>"#,
            points.join(" "),
            escape(&s.name)
        );
        let markers = if shown.len() <= MAX_MARKERS {
            &shown[..]
        } else {
            &[]
        };
        for &(x, y) in markers {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"><title>{}: {} → {}</title></circle>"#,
                px(x),
                py(y),
                escape(&s.name),
                fmt_num(x, 4),
                fmt_num(y, 3)
            );
        }
        let ly = TOP + 14.0 + 16.0 * i as f64;
        let lx = LEFT + plot_w - 190.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}" font-size="12">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The y axis's ends before rounding to ticks, for data from `min` to `max`.
fn y_bounds(range: YRange, min: f64, max: f64) -> (f64, f64) {
    match range {
        YRange::FromZero if max > 0.0 => (0.0, max),
        YRange::FromZero => (0.0, 1.0),
        // A flat series gets a band around it.
        YRange::Fitted if max - min <= max.abs() * 1e-9 => {
            let pad = (max.abs() * 0.05).max(0.5);
            (min - pad, max + pad)
        }
        YRange::Fitted => (min, max),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn one_marker_per_point_and_escaped_text() {
        let s = Series {
            name: "a<b".into(),
            points: vec![(1.0, 10.0), (2.0, 5.0), (3.0, 0.0)],
        };
        let svg = line_chart("t & u", "x", "y", std::slice::from_ref(&s));
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("t &amp; u") && svg.contains("a&lt;b"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // An empty chart still renders.
        assert!(line_chart("e", "x", "y", &[]).contains("</svg>"));
    }

    /// The y tick labels of a chart, bottom to top.
    fn y_ticks(svg: &str) -> Vec<f64> {
        svg.lines()
            .filter(|l| l.contains(r#"text-anchor="end">"#))
            .map(|l| {
                let start = l.rfind(r#"">"#).expect("a label's start") + 2;
                let end = l.rfind("</text>").expect("a label's end");
                l[start..end].parse().expect("a number")
            })
            .collect()
    }

    /// A fitted axis spans the data between ticks just outside it, not from 0; a long
    /// series is its line alone, a short one has a marker per point; points that are not
    /// finite are left out.
    #[test]
    fn a_fitted_axis_hugs_the_data_and_long_series_have_no_markers() {
        let long = Series {
            name: "loss".into(),
            points: (0..=200)
                .map(|i| (f64::from(i), 8.3 - 3.2 * f64::from(i) / 200.0))
                .chain([(201.0, f64::NAN)])
                .collect(),
        };
        let short = Series {
            name: "val".into(),
            points: vec![(0.0, 8.4), (100.0, 6.0), (200.0, 5.7)],
        };
        let svg = line_chart_in(YRange::Fitted, "t", ("step", "loss"), &[long, short]);
        let ticks = y_ticks(&svg);
        assert_eq!(
            (ticks[0], *ticks.last().expect("ticks")),
            (5.0, 9.0),
            "{ticks:?}"
        );
        assert_eq!(svg.matches("<circle").count(), 3);
        let first_line = svg
            .lines()
            .find(|l| l.starts_with("<polyline"))
            .expect("a line");
        assert_eq!(
            first_line.matches(',').count(),
            201,
            "the NaN point is left out"
        );
        assert!(!svg.contains("NaN"));
        // From zero, the same data's axis starts at 0.
        let svg = line_chart("t", "step", "loss", &[]);
        assert_eq!(y_ticks(&svg)[0], 0.0);
        // A flat series still gets a band.
        let flat = Series {
            name: "flat".into(),
            points: vec![(1.0, 2.0), (2.0, 2.0)],
        };
        let ticks = y_ticks(&line_chart_in(YRange::Fitted, "t", ("x", "y"), &[flat]));
        assert!(
            ticks[0] < 2.0 && *ticks.last().expect("ticks") > 2.0,
            "{ticks:?}"
        );
    }
}
