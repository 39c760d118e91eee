//! Small inline SVG charts drawn on the server: no script, no style attribute (the CSP
//! forbids inline styles), nothing fetched. Colours come from the stylesheet's classes.

use maud::{html, Markup};

const W: f64 = 600.0;
const H: f64 = 120.0;
/// Left margin for the axis labels.
const L: f64 = 48.0;
const B: f64 = 16.0;

/// One line of a chart: its class (colour) and legend, and its points `(x, y)`.
pub struct Series<'a> {
    pub class: &'a str,
    pub label: &'a str,
    pub points: Vec<(f64, f64)>,
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

fn frame(label: &str, y_max: f64, unit: &str, x_left: &str, x_right: &str, body: Markup) -> Markup {
    html! {
        svg.chart viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(label) {
            title { (label) }
            line.axis x1=(L) y1=(H - B) x2=(W) y2=(H - B) {}
            line.axis x1=(L) y1="4" x2=(L) y2=(H - B) {}
            text.tick x=(L - 4.0) y="12" text-anchor="end" { (fmt_num(y_max)) (unit) }
            text.tick x=(L - 4.0) y=(H - B) text-anchor="end" { "0" }
            text.tick x=(L) y=(H - 2.0) { (x_left) }
            text.tick x=(W) y=(H - 2.0) text-anchor="end" { (x_right) }
            (body)
        }
    }
}

fn fmt_num(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Vertical bars at `x` in `[x0, x1]`, one per point, each `width` of x wide.
pub fn bars(
    label: &str,
    unit: &str,
    points: &[(f64, f64)],
    (x0, x1): (f64, f64),
    width: f64,
    (x_left, x_right): (&str, &str),
) -> Markup {
    let y_max = nice_max(points.iter().map(|p| p.1).fold(0.0, f64::max));
    let sx = |x: f64| L + (x - x0) / (x1 - x0).max(1.0) * (W - L);
    let sy = |y: f64| (H - B) - y / y_max * (H - B - 4.0);
    let bw = (width / (x1 - x0).max(1.0) * (W - L) - 1.0).max(1.0);
    let body = html! {
        @for (x, y) in points {
            rect.bar x=(format!("{:.1}", sx(*x))) y=(format!("{:.1}", sy(*y))) width=(format!("{bw:.1}"))
                height=(format!("{:.1}", (H - B) - sy(*y))) {
                title { (fmt_num(*y)) }
            }
        }
    };
    frame(label, y_max, unit, x_left, x_right, body)
}

/// Lines over `[x0, x1]`, with a legend.
pub fn lines(
    label: &str,
    unit: &str,
    series: &[Series<'_>],
    (x0, x1): (f64, f64),
    (x_left, x_right): (&str, &str),
) -> Markup {
    let y_max = nice_max(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max),
    );
    let sx = |x: f64| L + (x - x0) / (x1 - x0).max(1.0) * (W - L);
    let sy = |y: f64| (H - B) - y.max(0.0) / y_max * (H - B - 4.0);
    let body = html! {
        @for (i, s) in series.iter().enumerate() {
            @let pts = s.points.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect::<Vec<_>>().join(" ");
            polyline class=(format!("series {}", s.class)) points=(pts) {}
            @for (x, y) in &s.points {
                circle class=(format!("dot {}", s.class)) cx=(format!("{:.1}", sx(*x))) cy=(format!("{:.1}", sy(*y))) r="2" {
                    title { (s.label) " " (fmt_num(*y)) (unit) }
                }
            }
            text class=(format!("legend {}", s.class)) x=(W - 4.0) y=(14.0 + 12.0 * i as f64) text-anchor="end" { (s.label) }
        }
    };
    frame(label, y_max, unit, x_left, x_right, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_maxima_round_up_to_1_2_5() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(3.0), 5.0);
        assert_eq!(nice_max(12.0), 20.0);
        assert_eq!(nice_max(100.0), 100.0);
        assert_eq!(nice_max(501.0), 1000.0);
    }

    #[test]
    fn a_chart_is_svg_without_style_or_script() {
        let svg = lines(
            "lag <x>",
            " ms",
            &[Series {
                class: "p99",
                label: "p99",
                points: vec![(0.0, 1.0), (1.0, 3.0)],
            }],
            (0.0, 1.0),
            ("a", "b"),
        )
        .into_string();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("lag &lt;x&gt;"), "{svg}");
        assert!(!svg.contains("style") && !svg.contains("script"), "{svg}");
    }
}
