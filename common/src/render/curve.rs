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

/// Renders `series` on shared axes starting at y = 0.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter().copied());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for (x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    let y_step = tick_step(y1, 6.0);
    let y1 = (y1 / y_step).ceil() * y_step;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let px = |x: f64| LEFT + (x - x0) / (x1 - x0) * plot_w;
    let py = |y: f64| TOP + plot_h - y / y1 * plot_h;
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
    let mut y = 0.0;
    while y <= y1 + 1e-9 {
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
        let points: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            points.join(" ")
        );
        for &(x, y) in &s.points {
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

#[cfg(test)]
mod tests {
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
}
