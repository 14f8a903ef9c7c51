//! The latency plot: latency against batch size, log-log, as a self-contained SVG.

use super::{Cell, Report};

/// A power of ten of microseconds as a short axis label: "1 us" ... "100 ms", "1 s", "10 s".
fn decade_us(e: i32) -> String {
    let (unit, base) = match e {
        i32::MIN..=2 => ("us", 0),
        3..=5 => ("ms", 3),
        _ => ("s", 6),
    };
    format!("{} {unit}", 10f64.powi(e - base))
}

/// Latency against batch size, log-log, one panel per ranker, as a self-contained SVG.
pub fn svg(report: &Report) -> String {
    use std::fmt::Write;
    const W: f64 = 360.0;
    const H: f64 = 280.0;
    const M: f64 = 50.0;
    /// Right margin, room for the last x label.
    const R: f64 = 25.0;
    let panels = report.rankers.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
        W * panels,
        H + 30.0
    );
    type Series = (&'static str, &'static str, fn(&Cell) -> Option<f64>);
    let series: [Series; 3] = [
        ("CPU 1 thread", "#d62728", |c| Some(c.cpu_1.median_us)),
        ("CPU all threads", "#ff7f0e", |c| Some(c.cpu_all.median_us)),
        ("GPU end to end", "#2ca02c", |c| c.gpu.map(|g| g.median_us)),
    ];
    let values: Vec<f64> = report
        .rankers
        .iter()
        .flat_map(|r| r.cells.iter())
        .flat_map(|c| series.iter().filter_map(move |(_, _, f)| f(c)))
        .filter(|v| *v > 0.0)
        .collect();
    let (ymin, ymax) = values
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let (ylo, yhi) = (
        ymin.max(1e-3).log10().floor(),
        ymax.max(1e-3)
            .log10()
            .ceil()
            .max(ymin.log10().floor() + 1.0),
    );
    for (p, r) in report.rankers.iter().enumerate() {
        let x0 = p as f64 * W;
        let docs: Vec<f64> = r
            .cells
            .iter()
            .map(|c| (c.docs.max(1) as f64).log10())
            .collect();
        let (xlo, xhi) = (
            docs.iter().copied().fold(f64::MAX, f64::min).floor(),
            docs.iter()
                .copied()
                .fold(f64::MIN, f64::max)
                .ceil()
                .max(1.0),
        );
        let px = |d: f64| x0 + M + (d - xlo) / (xhi - xlo).max(1e-9) * (W - M - R);
        let py = |v: f64| 15.0 + (yhi - v.log10()) / (yhi - ylo).max(1e-9) * (H - M - 15.0);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="12" font-weight="bold">{}</text>"#,
            x0 + M,
            r.name
        );
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="15" width="{}" height="{}" fill="none" stroke="#888"/>"##,
            x0 + M,
            W - M - R,
            H - M - 15.0
        );
        for e in (ylo as i32)..=(yhi as i32) {
            let y = py(10f64.powi(e));
            let _ = writeln!(
                s,
                r##"<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                x0 + M,
                x0 + W - R,
                x0 + M - 3.0,
                y + 4.0,
                decade_us(e)
            );
        }
        for e in (xlo as i32)..=(xhi as i32) {
            let x = px(f64::from(e));
            let _ = writeln!(
                s,
                r##"<line x1="{x}" x2="{x}" y1="15" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
                H - M,
                H - M + 14.0,
                10u64.pow(e as u32)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">documents per batch</text>"#,
            x0 + M + (W - M) / 2.0,
            H - M + 30.0
        );
        for (label, color, f) in &series {
            let points: Vec<String> = r
                .cells
                .iter()
                .filter_map(|c| {
                    f(c).map(|v| format!("{:.1},{:.1}", px((c.docs.max(1) as f64).log10()), py(v)))
                })
                .collect();
            if !points.is_empty() {
                let _ = writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"><title>{label}</title></polyline>"#,
                    points.join(" ")
                );
            }
        }
    }
    for (i, (label, color, _)) in series.iter().enumerate() {
        let x = M + i as f64 * 140.0;
        let _ = writeln!(
            s,
            r#"<line x1="{x}" x2="{}" y1="{}" y2="{}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{label}</text>"#,
            x + 20.0,
            H + 15.0,
            H + 15.0,
            x + 24.0,
            H + 19.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_are_short_decades() {
        let labels: Vec<String> = (-1..=7).map(decade_us).collect();
        assert_eq!(
            labels,
            ["0.1 us", "1 us", "10 us", "100 us", "1 ms", "10 ms", "100 ms", "1 s", "10 s"]
        );
    }
}
