//! An SVG of latency percentile distributions (the HdrHistogram plot): one panel per mix, one
//! line per auth model, x = percentile on a "nines" scale, y = latency on a log scale. Written by
//! hand so the report needs no plotting dependency.

use std::fmt::Write;

/// Percentiles every curve is sampled at: 0, then 1 - 10^(-k/10) up to 99.99%.
pub fn curve_points() -> Vec<f64> {
    (0..=40)
        .map(|k| 1.0 - 10f64.powf(-(k as f64) / 10.0))
        .collect()
}

/// One line: label, colour, and (quantile, latency ms) points, the last one being the max.
pub struct Series<'a> {
    pub label: &'a str,
    pub color: &'a str,
    pub points: &'a [(f64, f64)],
}

pub struct Panel<'a> {
    pub title: String,
    pub series: Vec<Series<'a>>,
}

const W: f64 = 520.0;
const H: f64 = 340.0;
const LEFT: f64 = 62.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 48.0;
/// The x position of "max" on the nines scale (99.99% is 4).
const MAX_X: f64 = 4.4;

fn nines(q: f64) -> f64 {
    if q >= 1.0 {
        MAX_X
    } else {
        (-(1.0 - q).log10()).min(4.0)
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn svg(title: &str, panels: &[Panel<'_>]) -> String {
    let mut lo = f64::INFINITY;
    let mut hi: f64 = 0.0;
    for p in panels {
        for s in &p.series {
            for &(_, ms) in s.points {
                if ms > 0.0 && ms.is_finite() {
                    lo = lo.min(ms);
                    hi = hi.max(ms);
                }
            }
        }
    }
    if !lo.is_finite() {
        (lo, hi) = (0.01, 1.0);
    }
    let (dlo, dhi) = (
        lo.log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    );
    let total_w = W * panels.len().max(1) as f64;
    let mut o = String::new();
    let _ = write!(
        o,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{h}" viewBox="0 0 {total_w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{cx}" y="18" text-anchor="middle" font-size="15" font-weight="bold">{t}</text>
"##,
        h = H + 30.0,
        cx = total_w / 2.0,
        t = esc(title)
    );
    for (i, panel) in panels.iter().enumerate() {
        let ox = W * i as f64;
        let pw = W - LEFT - RIGHT;
        let ph = H - TOP - BOTTOM;
        let x_of = |q: f64| ox + LEFT + nines(q) / MAX_X * pw;
        let y_of =
            |ms: f64| TOP + 10.0 + ph - (ms.max(10f64.powf(dlo)).log10() - dlo) / (dhi - dlo) * ph;
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"##,
            ox + LEFT + pw / 2.0,
            TOP + 4.0,
            esc(&panel.title)
        );
        // Grid: decades of latency, nines of percentile.
        let mut d = dlo;
        while d <= dhi + 1e-9 {
            let ms = 10f64.powf(d);
            let y = y_of(ms);
            let label = if ms >= 1.0 {
                format!("{ms:.0} ms")
            } else {
                format!("{} ms", ms)
            };
            let _ = writeln!(
                o,
                r##"<line x1="{a}" y1="{y}" x2="{b}" y2="{y}" stroke="#ddd"/><text x="{t}" y="{ty}" text-anchor="end">{label}</text>"##,
                a = ox + LEFT,
                b = ox + LEFT + pw,
                t = ox + LEFT - 4.0,
                ty = y + 4.0
            );
            d += 1.0;
        }
        for (q, label) in [
            (0.0, "0%"),
            (0.9, "90%"),
            (0.99, "99%"),
            (0.999, "99.9%"),
            (0.9999, "99.99%"),
            (1.0, "max"),
        ] {
            let x = x_of(q);
            let _ = writeln!(
                o,
                r##"<line x1="{x}" y1="{a}" x2="{x}" y2="{b}" stroke="#ddd"/><text x="{x}" y="{ty}" text-anchor="middle">{label}</text>"##,
                a = TOP + 10.0,
                b = TOP + 10.0 + ph,
                ty = TOP + 10.0 + ph + 16.0
            );
        }
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{}" text-anchor="middle">percentile</text>"##,
            ox + LEFT + pw / 2.0,
            TOP + 10.0 + ph + 34.0
        );
        for (k, s) in panel.series.iter().enumerate() {
            let pts: Vec<String> = s
                .points
                .iter()
                .filter(|(_, ms)| ms.is_finite() && *ms > 0.0)
                .map(|&(q, ms)| format!("{:.1},{:.1}", x_of(q), y_of(ms)))
                .collect();
            let _ = writeln!(
                o,
                r##"<polyline fill="none" stroke="{c}" stroke-width="2" points="{p}"/>"##,
                c = s.color,
                p = pts.join(" ")
            );
            let ly = TOP + 24.0 + 16.0 * k as f64;
            let lx = ox + LEFT + 10.0;
            let _ = writeln!(
                o,
                r##"<line x1="{lx}" y1="{ly}" x2="{x2}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{tx}" y="{ty}">{l}</text>"##,
                x2 = lx + 18.0,
                c = s.color,
                tx = lx + 24.0,
                ty = ly + 4.0,
                l = esc(s.label)
            );
        }
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_one_line_per_series_within_the_panel() {
        let a = [(0.0, 0.1), (0.5, 0.2), (0.99, 2.0), (1.0, 30.0)];
        let b = [(0.0, 0.3), (0.5, 0.4), (0.99, 5.0), (1.0, 60.0)];
        let s = svg(
            "t <x>",
            &[Panel {
                title: "mix".into(),
                series: vec![
                    Series {
                        label: "connection",
                        color: "#1f77b4",
                        points: &a,
                    },
                    Series {
                        label: "call",
                        color: "#d62728",
                        points: &b,
                    },
                ],
            }],
        );
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("t &lt;x&gt;"));
        assert!(
            s.contains("100 ms") && s.contains("0.1 ms"),
            "decades 0.1..100 ms labelled"
        );
        // Every plotted point lies inside the panel.
        for pl in s.lines().filter(|l| l.starts_with("<polyline")) {
            let pts = pl
                .split("points=\"")
                .nth(1)
                .unwrap()
                .trim_end_matches("\"/>");
            for p in pts.split(' ') {
                let (x, y) = p.split_once(',').unwrap();
                let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
                assert!((LEFT..=W).contains(&x) && (TOP..=H).contains(&y), "{x},{y}");
            }
        }
    }

    #[test]
    fn percentiles_sampled_on_the_nines_scale() {
        let p = curve_points();
        assert_eq!(p[0], 0.0);
        assert!((p[10] - 0.9).abs() < 1e-12 && (p[40] - 0.9999).abs() < 1e-12);
    }
}
