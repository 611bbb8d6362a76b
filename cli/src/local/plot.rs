//! `loss.svg` of `pipewise local --output-dir`: the training loss of every step and the
//! validation loss where the job evaluated (step 0: before the first step), on one step
//! axis, drawn as `pipewise plan --sweep-memory`'s chart is
//! ([`pipewise_common::render::curve`]), its loss axis fitted to the losses.

use pipewise_common::render::curve::{Series, YRange, line_chart_in};

/// A job's loss curves as they stand: each step's latest figures.
#[derive(Debug, Default)]
pub(super) struct Curves {
    /// (step, training loss), in step order.
    loss: Vec<(u64, f64)>,
    /// (step, validation loss), in step order.
    val: Vec<(u64, f64)>,
}

impl Curves {
    /// Step `step`'s training loss, and its validation loss where it evaluated. A run that
    /// went on from a checkpoint before it ran those steps again: their latest figures
    /// replace the earlier ones.
    pub(super) fn add(&mut self, step: u64, loss: f64, val: Option<f64>) {
        drop_from(&mut self.loss, step);
        drop_from(&mut self.val, step);
        self.loss.push((step, loss));
        if let Some(v) = val {
            self.val.push((step, v));
        }
    }

    /// The validation loss before the first step.
    pub(super) fn add_initial_validation(&mut self, val: f64) {
        self.val.clear();
        self.val.push((0, val));
    }

    /// Whether there is a finite loss to draw (emulated compute has none).
    pub(super) fn any(&self) -> bool {
        self.loss.iter().chain(&self.val).any(|p| p.1.is_finite())
    }

    /// The curves as an SVG document, titled with the job's `name`.
    pub(super) fn svg(&self, name: &str) -> String {
        let series = |name: &str, points: &[(u64, f64)]| Series {
            name: name.into(),
            points: points.iter().map(|&(x, y)| (x as f64, y)).collect(),
        };
        let mut all = vec![series("training loss", &self.loss)];
        if !self.val.is_empty() {
            all.push(series("validation loss", &self.val));
        }
        line_chart_in(
            YRange::Fitted,
            &format!("{name}: loss"),
            ("step", "mean token cross-entropy (nats)"),
            &all,
        )
    }
}

/// Drops the points of step `step` and later from the end of `points`.
fn drop_from(points: &mut Vec<(u64, f64)>, step: u64) {
    while points.last().is_some_and(|p| p.0 >= step) {
        points.pop();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Every `tag` element's start tag in `svg`.
    fn elements<'a>(svg: &'a str, tag: &str) -> Vec<&'a str> {
        let open = format!("<{tag} ");
        svg.match_indices(&open)
            .filter_map(|(at, _)| svg[at..].find('>').map(|end| &svg[at..at + end]))
            .collect()
    }

    /// Attribute `name` of start tag `element`.
    fn attr<'a>(element: &'a str, name: &str) -> Option<&'a str> {
        let key = format!(" {name}=\"");
        let from = element.find(&key)? + key.len();
        Some(&element[from..from + element[from..].find('"')?])
    }

    /// The values of attribute `name` of every `tag` element of `svg` that has it.
    fn attrs<'a>(svg: &'a str, tag: &str, name: &str) -> Vec<&'a str> {
        elements(svg, tag)
            .into_iter()
            .filter_map(|e| attr(e, name))
            .collect()
    }

    /// Every element opened is closed, in order (self-closing ones aside), and nothing
    /// but the one root is outside them.
    fn assert_well_nested(svg: &str) {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = svg.trim();
        assert!(rest.starts_with("<svg "), "{svg}");
        while let Some(at) = rest.find('<') {
            if open.is_empty() {
                assert!(rest[..at].trim().is_empty(), "text outside the root");
            }
            let end = rest[at..].find('>').expect("a tag ends") + at;
            let tag = &rest[at + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "closes what it opened");
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().unwrap_or(tag));
            }
            assert!(
                !tag.contains('<') && tag.matches('"').count().is_multiple_of(2),
                "{tag}"
            );
            rest = &rest[end + 1..];
            if open.is_empty() {
                assert!(rest.trim().is_empty(), "one root: {rest}");
            }
        }
        assert!(open.is_empty(), "left open: {open:?}");
    }

    /// A 200-step run evaluating before its first step and every 25: one line of 200
    /// points and one of 9 with a marker each, in step order, inside the plot, a legend
    /// entry each, well-formed.
    #[test]
    fn the_loss_plot_draws_every_step_and_every_evaluation() {
        let mut curves = Curves::default();
        curves.add_initial_validation(8.35);
        for step in 1..=200u64 {
            let loss = 8.3 - 3.0 * (step as f64 / 200.0).sqrt();
            let val = step.is_multiple_of(25).then_some(loss + 0.4);
            curves.add(step, loss, val);
        }
        let svg = curves.svg("llama <small>");
        assert_well_nested(&svg);
        assert!(svg.contains("llama &lt;small&gt;: loss"));
        let lines = attrs(&svg, "polyline", "points");
        let points: Vec<Vec<(f64, f64)>> = lines
            .iter()
            .map(|l| {
                l.split(' ')
                    .map(|p| {
                        let (x, y) = p.split_once(',').expect("a point");
                        (x.parse().expect("x"), y.parse().expect("y"))
                    })
                    .collect()
            })
            .collect();
        assert_eq!(points.iter().map(Vec::len).collect::<Vec<_>>(), [200, 9]);
        for line in &points {
            assert!(line.windows(2).all(|w| w[0].0 < w[1].0), "in step order");
        }
        // The loss falls: its line rises on the page (y grows downwards).
        assert!(points[0][0].1 < points[0][199].1);
        // Step 0's evaluation sits left of step 1's loss.
        assert!(points[1][0].0 < points[0][0].0);
        // Markers on the 9 evaluations only; two legend entries.
        assert_eq!(attrs(&svg, "circle", "cx").len(), 9);
        assert!(svg.contains(">training loss</text>") && svg.contains(">validation loss</text>"));
        // The plot's frame: the one rectangle drawn unfilled.
        let frames: Vec<&str> = elements(&svg, "rect")
            .into_iter()
            .filter(|e| attr(e, "fill") == Some("none"))
            .collect();
        assert_eq!(frames.len(), 1);
        let frame: Vec<f64> = ["x", "y", "width", "height"]
            .iter()
            .map(|a| attr(frames[0], a).expect(a).parse().expect(a))
            .collect();
        for &(x, y) in points.iter().flatten() {
            assert!(x >= frame[0] && x <= frame[0] + frame[2], "{x}");
            assert!(y >= frame[1] && y <= frame[1] + frame[3], "{y}");
        }
    }

    /// Steps run again after a move to an earlier checkpoint replace the first figures.
    #[test]
    fn steps_run_again_replace_the_earlier_ones() {
        let mut curves = Curves::default();
        curves.add_initial_validation(9.0);
        for step in 1..=5 {
            curves.add(step, 10.0 - step as f64, (step == 4).then_some(7.0));
        }
        for step in 4..=6 {
            curves.add(step, 1.0, None);
        }
        let steps: Vec<u64> = curves.loss.iter().map(|p| p.0).collect();
        assert_eq!(steps, [1, 2, 3, 4, 5, 6]);
        assert_eq!(curves.loss[3].1, 1.0);
        assert_eq!(curves.val, [(0, 9.0)], "step 4's first evaluation is gone");
        assert!(curves.any());
        let mut emulated = Curves::default();
        emulated.add(1, f64::NAN, None);
        assert!(!emulated.any());
    }
}
