//! An SVG figure of a simulated schedule, in the style of the pipeline-parallelism papers.
//!
//! One row per worker; every pass is a rectangle from its simulated start to its end,
//! coloured by kind (F blue, B green, W amber, BW purple) with the worker's later chunks in
//! darker shades of the same colour, and its microbatch number written inside when the
//! rectangle is wide enough. Idle time shows as the hatched grey row background. Above the
//! rows: a title (schedule, `d`, `n`, makespan, bubble) and a legend; below them: a time axis.
//! Hovering a rectangle shows the pass and its times (an SVG `<title>`).

use std::fmt::Write as _;

use crate::pass::PassKind;
use crate::schedule::Schedule;
use crate::simulate::Simulation;

use super::{first_start, fmt_num, fmt_percent, shortest_pass};

const LEFT: f64 = 78.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 104.0;
const ROW: f64 = 26.0;
const GAP: f64 = 4.0;
const AXIS: f64 = 46.0;
/// Width the shortest pass gets, when the figure stays within `MAX_PLOT`.
const SHORTEST_PX: f64 = 22.0;
const MIN_PLOT: f64 = 640.0;
const MAX_PLOT: f64 = 6000.0;
/// Estimated advance of one character of the 18 px bold title.
const TITLE_CHAR: f64 = 10.5;
/// Estimated advance of one character of 12 px text.
const TEXT_CHAR: f64 = 6.8;
/// Smallest font size written.
const MIN_FONT: f64 = 6.0;
const FONT: &str = "Helvetica, Arial, sans-serif";

/// Hue and saturation of each kind.
fn hue(kind: PassKind) -> (f64, f64) {
    match kind {
        PassKind::F => (212.0, 0.62),
        PassKind::B => (140.0, 0.48),
        PassKind::W => (40.0, 0.85),
        PassKind::BW => (275.0, 0.45),
    }
}

/// Lightness of chunk `c` of `chunks`: the first chunk lightest, the last darkest.
fn lightness(chunk: usize, chunks: usize) -> f64 {
    if chunks <= 1 {
        0.62
    } else {
        0.72 - 0.30 * chunk as f64 / (chunks - 1) as f64
    }
}

/// `#rrggbb` from hue (degrees), saturation and lightness (0–1).
fn hsl(h: f64, s: f64, l: f64) -> String {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let hp = (h.rem_euclid(360.0)) / 60.0;
    let x = c * (1.0 - (hp % 2.0 - 1.0).abs());
    let (r, g, b) = match hp as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let byte = |v: f64| ((v + m).clamp(0.0, 1.0) * 255.0).round() as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}

/// Fill colour and text colour of a pass of `kind` on chunk `chunk` of `chunks`.
pub(crate) fn colours(kind: PassKind, chunk: usize, chunks: usize) -> (String, &'static str) {
    let (h, s) = hue(kind);
    let l = lightness(chunk, chunks);
    let text = if l < 0.55 { "#ffffff" } else { "#1b1b1b" };
    (hsl(h, s, l), text)
}

/// Escapes text for XML content and attributes.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 allows no other C0 controls, nor U+FFFE and U+FFFF, not even as
            // references.
            c if (c < ' ' && !matches!(c, '\t' | '\n' | '\r'))
                || matches!(c, '\u{fffe}' | '\u{ffff}') =>
            {
                out.push('\u{fffd}');
            }
            c => out.push(c),
        }
    }
    out
}

/// A time axis at height `axis_y` under a plot `plot` wide from `left`: a line, a tick with
/// its value about every 90 px of `span` (`px` per unit) and `unit` at its left end.
pub(crate) fn time_axis(
    out: &mut String,
    (left, plot): (f64, f64),
    (span, px): (f64, f64),
    axis_y: f64,
    unit: &str,
) {
    let _ = writeln!(
        out,
        r##"<line x1="{left}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="#555555" stroke-width="1"/>"##,
        fmt_num(left + plot, 2)
    );
    let step = tick_step(span, plot / 90.0);
    let ticks = (span / step + 1e-9).floor() as usize;
    for i in 0..=ticks {
        let t = i as f64 * step;
        let tx = fmt_num(left + t * px, 2);
        let _ = writeln!(
            out,
            r##"<line x1="{tx}" y1="{axis_y}" x2="{tx}" y2="{}" stroke="#555555" stroke-width="1"/><text x="{tx}" y="{}" font-size="11" text-anchor="middle" fill="#333333">{}</text>"##,
            axis_y + 5.0,
            axis_y + 17.0,
            fmt_num(t, 3)
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{}" y="{}" font-size="11" text-anchor="end" fill="#555555">{unit}</text>"##,
        fmt_num(left - 8.0, 1),
        axis_y + 17.0
    );
}

/// A "nice" tick step (1, 2 or 5 × 10^k) giving about `target` ticks over `span`.
pub(crate) fn tick_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / target.max(1.0);
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    step.max(1e-9)
}

/// The font size that fits `digits` digits in a cell `width` pixels wide, at most half a row.
fn font_for(width: f64, digits: usize) -> f64 {
    (width / (0.62 * digits as f64 + 0.5)).min(ROW * 0.5)
}

/// Renders `sim` of `schedule` as a standalone SVG document.
///
/// Every pass is one `<rect class="pass">`; other rectangles (background, legend) have other
/// classes.
pub fn svg(schedule: &Schedule, sim: &Simulation) -> String {
    let placement = &schedule.placement;
    let workers = sim.timeline.len();
    let chunks = placement.chunks().max(1) as usize;
    let chunk_of: Vec<usize> = (0..placement.workers())
        .flat_map(|w| {
            placement
                .stages_of(w)
                .into_iter()
                .enumerate()
                .map(|(c, s)| (s, c))
        })
        .fold(vec![0; placement.stages() as usize], |mut acc, (s, c)| {
            if let Some(slot) = acc.get_mut(s as usize) {
                *slot = c;
            }
            acc
        });
    // Title, subtitle and legend (they set the smallest width).
    let mut head = String::new();
    let title = format!(
        "{} — d={}, n={}{}: makespan {}, bubble {}",
        schedule.name,
        schedule.num_workers(),
        schedule.microbatches,
        if chunks > 1 {
            format!(", v={chunks}")
        } else {
            String::new()
        },
        fmt_num(sim.makespan, 3),
        fmt_percent(sim.bubble),
    );
    let peak = sim.max_peak_memory();
    let subtitle = format!(
        "placement {placement} · span bubble {} · peak activation memory {} (× one microbatch over 1/d of the model) · lower bound {}",
        fmt_percent(sim.bubble_span),
        fmt_num(peak, 3),
        fmt_num(sim.bounds.lower_bound, 3),
    );
    let _ = writeln!(
        head,
        r##"<text x="{LEFT}" y="26" font-size="18" font-weight="bold" fill="#1b1b1b">{}</text>"##,
        escape(&title)
    );
    let _ = writeln!(
        head,
        r##"<text x="{LEFT}" y="46" font-size="12" fill="#555555">{}</text>"##,
        escape(&subtitle)
    );

    // Legend: one swatch per kind present (shaded by chunk), then idle.
    let mut present: Vec<PassKind> = sim.timeline.iter().flatten().map(|t| t.pass.kind).collect();
    present.sort();
    present.dedup();
    let label = |k: PassKind| match k {
        PassKind::F => "F forward",
        PassKind::B => "B input-gradient backward",
        PassKind::W => "W weight-gradient backward",
        PassKind::BW => "BW full backward (B+W)",
    };
    let (sw, sh) = (14.0, 14.0);
    let legend_y = 62.0;
    let mut x = LEFT;
    let mut widest = LEFT + TITLE_CHAR * title.chars().count() as f64;
    widest = widest.max(LEFT + TEXT_CHAR * subtitle.chars().count() as f64);
    for kind in present {
        for c in 0..chunks {
            let (fill, _) = colours(kind, c, chunks);
            let _ = writeln!(
                head,
                r##"<rect class="legend" x="{}" y="{legend_y}" width="{sw}" height="{sh}" fill="{fill}" stroke="#ffffff" stroke-width="0.5"/>"##,
                fmt_num(x, 1)
            );
            x += sw;
        }
        let text = label(kind);
        let _ = writeln!(
            head,
            r##"<text x="{}" y="{}" font-size="12" fill="#1b1b1b">{text}</text>"##,
            fmt_num(x + 5.0, 1),
            legend_y + 11.5
        );
        x += 5.0 + TEXT_CHAR * text.len() as f64 + 18.0;
    }
    let _ = writeln!(
        head,
        r##"<rect class="legend" x="{}" y="{legend_y}" width="{sw}" height="{sh}" fill="url(#idle)" stroke="#cccccc" stroke-width="0.5"/>"##,
        fmt_num(x, 1)
    );
    let _ = writeln!(
        head,
        r##"<text x="{}" y="{}" font-size="12" fill="#1b1b1b">idle</text>"##,
        fmt_num(x + sw + 5.0, 1),
        legend_y + 11.5
    );
    x += sw + 5.0 + TEXT_CHAR * 4.0 + 18.0;
    let note = if chunks > 1 {
        format!(
            "shades: chunk 0 (light) → chunk {} (dark) of each worker · numbers: microbatch",
            chunks - 1
        )
    } else {
        "numbers: microbatch".to_string()
    };
    let _ = writeln!(
        head,
        r##"<text x="{}" y="{}" font-size="12" fill="#555555">{note}</text>"##,
        fmt_num(x, 1),
        legend_y + 11.5
    );
    widest = widest.max(x + TEXT_CHAR * note.chars().count() as f64);

    // Geometry: the shortest pass gets `SHORTEST_PX` within the plot width limits, and the
    // plot is at least as wide as the texts above it.
    let t0 = first_start(sim);
    let span = sim.makespan.max(1e-9);
    let q = shortest_pass(sim);
    let plot = (span / q * SHORTEST_PX)
        .clamp(MIN_PLOT, MAX_PLOT)
        .max(widest - LEFT);
    let px = plot / span;
    let width = LEFT + plot + RIGHT;
    let rows_height = workers as f64 * (ROW + GAP) - GAP;
    let height = TOP + rows_height.max(0.0) + AXIS;
    let x_of = |t: f64| LEFT + (t - t0) * px;
    let max_digits = schedule.microbatches.saturating_sub(1).to_string().len();
    let uniform_font = font_for(q * px, max_digits);
    let y_of = |w: usize| TOP + w as f64 * (ROW + GAP);

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT}">"#,
        w = fmt_num(width, 1),
        h = fmt_num(height, 1),
    );
    out.push_str(
        "<defs><pattern id=\"idle\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" \
         patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#efefef\"/>\
         <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d2d2d2\" stroke-width=\"2\"/>\
         </pattern></defs>\n",
    );
    let _ = writeln!(
        out,
        r##"<rect class="page" width="100%" height="100%" fill="#ffffff"/>"##
    );

    out.push_str(&head);

    // Rows: background (idle), then passes.
    for (w, line) in sim.timeline.iter().enumerate() {
        let y = y_of(w);
        let _ = writeln!(
            out,
            r##"<text x="{}" y="{}" font-size="12" text-anchor="end" fill="#1b1b1b">worker {w}</text>"##,
            fmt_num(LEFT - 8.0, 1),
            fmt_num(y + ROW / 2.0 + 4.0, 2)
        );
        let _ = writeln!(
            out,
            r##"<rect class="idle" x="{LEFT}" y="{}" width="{}" height="{ROW}" fill="url(#idle)"/>"##,
            fmt_num(y, 2),
            fmt_num(plot, 2)
        );
        for timed in line {
            let pass = timed.pass;
            let chunk = chunk_of.get(pass.stage as usize).copied().unwrap_or(0);
            let (fill, ink) = colours(pass.kind, chunk, chunks);
            let (x0, x1) = (x_of(timed.start), x_of(timed.end));
            let cell = (x1 - x0).max(0.0);
            let stroke = if cell > 4.0 { 0.75 } else { 0.0 };
            let _ = write!(
                out,
                r##"<rect class="pass" x="{}" y="{}" width="{}" height="{ROW}" fill="{fill}" stroke="#ffffff" stroke-width="{stroke}"><title>{pass}: stage {}, microbatch {}, {}–{}</title></rect>"##,
                fmt_num(x0, 2),
                fmt_num(y, 2),
                fmt_num(cell, 2),
                pass.stage,
                pass.mb,
                fmt_num(timed.start, 3),
                fmt_num(timed.end, 3),
            );
            let digits = pass.mb.to_string();
            // One font size for the whole figure (the largest microbatch number fits the
            // shortest pass) keeps the numbers even; when that is too small to read, each
            // pass gets the size its own width allows, and none when that is too small too.
            let font = if uniform_font >= MIN_FONT {
                uniform_font
            } else {
                font_for(cell, digits.len())
            };
            if font >= MIN_FONT && cell >= font * (0.62 * digits.len() as f64 + 0.3) {
                let _ = write!(
                    out,
                    r##"<text x="{}" y="{}" font-size="{}" text-anchor="middle" fill="{ink}">{digits}</text>"##,
                    fmt_num(x0 + cell / 2.0, 2),
                    fmt_num(y + ROW / 2.0 + font * 0.36, 2),
                    fmt_num(font, 1),
                );
            }
            out.push('\n');
        }
    }

    let axis_y = TOP + rows_height.max(0.0) + 6.0;
    time_axis(&mut out, (LEFT, plot), (span, px), axis_y, "time");
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{Costs, Times};
    use crate::generate::{Request, ScheduleKind, generate};
    use crate::simulate::simulate;

    #[test]
    fn one_rect_per_pass() {
        for (kind, d, n) in [
            (ScheduleKind::OneFOneB, 4, 8),
            (ScheduleKind::VHalf, 4, 8),
            (ScheduleKind::Interleaved1F1B, 3, 6),
        ] {
            let s = generate(&Request::new(kind, d, n)).expect("generates");
            let costs = Costs::uniform(&s.placement, Times::UNIT).expect("costs");
            let sim = simulate(&s, &costs).expect("simulates");
            let text = svg(&s, &sim);
            assert!(text.starts_with("<svg"), "{kind}");
            assert!(text.trim_end().ends_with("</svg>"), "{kind}");
            assert_eq!(
                text.matches("<rect class=\"pass\"").count(),
                s.num_passes(),
                "{kind}"
            );
            assert_eq!(text.matches("<svg").count(), 1);
            assert_eq!(
                text.matches("<title>").count(),
                text.matches("</title>").count()
            );
            assert!(text.contains(&format!("{kind} — d={d}, n={n}")), "{kind}");
        }
    }

    #[test]
    fn escapes_names_and_picks_nice_ticks() {
        assert_eq!(escape("csv:a&b<c>"), "csv:a&amp;b&lt;c&gt;");
        assert_eq!(escape("a\u{1}b\tc"), "a\u{fffd}b\tc");
        assert_eq!(tick_step(100.0, 10.0), 10.0);
        assert_eq!(tick_step(33.0, 10.0), 5.0);
        assert_eq!(tick_step(7.0, 20.0), 0.5);
        assert_eq!(hsl(0.0, 1.0, 0.5), "#ff0000");
        assert_eq!(hsl(120.0, 1.0, 0.5), "#00ff00");
    }
}
