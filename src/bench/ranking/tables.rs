//! The report as text: latency, GPU breakdown, crossover, reference-check, power and input-layout
//! tables.

use super::{LayoutRun, Report, Stats};

/// Formats microseconds with a unit that keeps 3–4 significant digits.
pub fn fmt_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} us")
    }
}

/// The latency, breakdown, crossover and reference tables.
fn latency_tables(t: &mut String, report: &Report) {
    use std::fmt::Write;
    let n = report.cpu_threads;
    let _ = writeln!(
        *t,
        "\nlatency per batch, median [p10, p90]; speed-up = CPU median / GPU median\n{:<8} {:>7}  {:>28}  {:>28}  {:>28}  {:>8}  {:>8}",
        "ranker", "docs", "CPU 1 thread", format!("CPU {n} threads"), "GPU end to end", "vs 1 thr", format!("vs {n} thr")
    );
    let cell = |s: &Stats| {
        format!(
            "{} [{}, {}]",
            fmt_us(s.median_us),
            fmt_us(s.p10_us),
            fmt_us(s.p90_us)
        )
    };
    for r in &report.rankers {
        for c in &r.cells {
            let (gpu, x1, xn) = match &c.gpu {
                Some(g) => (
                    cell(g),
                    format!("{:.1}x", c.cpu_1.median_us / g.median_us),
                    format!("{:.1}x", c.cpu_all.median_us / g.median_us),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let _ = writeln!(
                *t,
                "{:<8} {:>7}  {:>28}  {:>28}  {:>28}  {:>8}  {:>8}",
                r.name,
                c.docs,
                cell(&c.cpu_1),
                cell(&c.cpu_all),
                gpu,
                x1,
                xn
            );
        }
    }
    if report.gpu.is_ok() {
        let _ = writeln!(
            *t,
            "\nGPU breakdown, medians (stage: host copy into pinned memory; device phases from CUDA events)\n{:<8} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "ranker", "docs", "stage", "copy in", "MIT", "ME", "copy out", "sum", "end2end"
        );
        for r in &report.rankers {
            for c in &r.cells {
                if let (Some(p), Some(g)) = (&c.gpu_phases, &c.gpu) {
                    let sum = p.stage_us + p.copy_in_us + p.mit_us + p.me_us + p.copy_out_us;
                    let _ = writeln!(
                        *t,
                        "{:<8} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
                        r.name,
                        c.docs,
                        fmt_us(p.stage_us),
                        fmt_us(p.copy_in_us),
                        fmt_us(p.mit_us),
                        fmt_us(p.me_us),
                        fmt_us(p.copy_out_us),
                        fmt_us(sum),
                        fmt_us(g.median_us)
                    );
                }
            }
        }
        let _ = writeln!(
            *t,
            "\nmodel and crossover\n{:<8} {:>12} {:>14} {:>14} {:>16} {:>16}",
            "ranker",
            "model bytes",
            "upload first",
            "upload",
            "GPU wins 1 thr",
            format!("GPU wins {n} thr")
        );
        for r in &report.rankers {
            let from = |x: Option<usize>| x.map_or("never".into(), |d| format!(">= {d} docs"));
            let _ = writeln!(
                *t,
                "{:<8} {:>12} {:>14} {:>14} {:>16} {:>16}",
                r.name,
                r.model_bytes.unwrap_or(0),
                r.upload_first_us.map_or("-".into(), fmt_us),
                r.upload_us.map_or("-".into(), fmt_us),
                from(r.crossover_cpu_1),
                from(r.crossover_cpu_all)
            );
        }
    }
    for r in &report.rankers {
        if let Some(c) = &r.reference {
            let _ = writeln!(
                *t,
                "\nreference check {}: {} rows, max relative error CPU {:.3e}, GPU {}; tolerance {:.0e}: {}",
                r.name,
                c.rows,
                c.cpu_max_rel_error,
                c.gpu_max_rel_error.map_or("-".into(), |e| format!("{e:.3e}")),
                c.tolerance,
                if c.passed { "PASS" } else { "FAIL" }
            );
        }
    }
}

/// Every table of the report, as text.
pub fn tables(report: &Report) -> String {
    use std::fmt::Write;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "host: {}; GPU: {}",
        report.host,
        match &report.gpu {
            Ok(name) => name.clone(),
            Err(why) => format!("none ({why}); GPU column absent"),
        }
    );
    if !report.rankers.is_empty() {
        latency_tables(&mut t, report);
    }
    if let Some(p) = &report.power {
        let _ = writeln!(t, "\npower ({})", p.gpu.as_deref().unwrap_or("no GPU"));
        if let Some(idle) = &p.gpu_idle {
            let _ = writeln!(
                t,
                "GPU idle: {:.1} W average ({} samples, {:.0} s; counter {:.1} J)",
                idle.avg_w, idle.samples, idle.seconds, idle.energy_j
            );
        }
        let _ = writeln!(
            t,
            "{:<8} {:<9} {:>8} {:>12} {:>10} {:>10} {:>12} {:>14}",
            "ranker",
            "backend",
            "seconds",
            "docs/s",
            "avg W",
            "energy J",
            "J/1000 docs",
            "above idle"
        );
        for run in &p.runs {
            let _ = writeln!(
                t,
                "{:<8} {:<9} {:>8.1} {:>12.0} {:>10.1} {:>10.1} {:>12.4} {:>14.4}",
                run.ranker,
                run.backend,
                run.reading.seconds,
                run.docs_per_s,
                run.reading.avg_w,
                run.reading.energy_j,
                run.j_per_1000_docs,
                run.j_per_1000_docs_above_idle
            );
        }
        for note in &p.notes {
            let _ = writeln!(t, "{note}");
        }
    }
    t
}

/// The layout runs as a table.
pub fn layout_table(runs: &[LayoutRun]) -> String {
    let mut out = String::from(
        "MIT input layouts (seed's optimisations), medians\nranker      docs  warp groups  feature order       MIT    end2end\n",
    );
    for r in runs {
        out += &format!(
            "{:<10}{:>6}  {:>11}  {:>13}  {:>9}  {:>9}\n",
            r.ranker,
            r.docs,
            if r.warp_groups { "on" } else { "off" },
            if r.feature_locality { "on" } else { "off" },
            fmt_us(r.mit_us),
            fmt_us(r.end_to_end_us)
        );
    }
    out
}
