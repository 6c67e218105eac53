//! A self-contained HTML page with inline SVG charts (no scripts, no network): latency over
//! time, throughput over time and a percentile plot.

use super::report::{Report, format_us};
use super::stats::{Kind, percentile};

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 48.0;

struct Series {
    name: String,
    color: &'static str,
    points: Vec<(f64, f64)>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis step (1, 2 or 5 times a power of ten) for about `ticks` ticks up to `max`.
fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(raw.log10().floor());
    let fraction = raw / power;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// A line chart. `x_ticks`: explicit (value, label) ticks, or automatic when empty.
fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    x_ticks: &[(f64, String)],
    y_format: &dyn Fn(f64) -> String,
) -> String {
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x_min, mut x_max, mut y_max) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in points {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    if x_min > x_max {
        (x_min, x_max) = (0.0, 1.0);
    }
    if x_max - x_min < 1e-9 {
        x_max = x_min + 1.0;
    }
    let y_step = nice_step(if y_max > 0.0 { y_max } else { 1.0 }, 5.0);
    let y_top = (y_max / y_step).ceil().max(1.0) * y_step;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x - x_min) / (x_max - x_min) * plot_w;
    let sy = |y: f64| TOP + plot_h - y / y_top * plot_h;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        LEFT,
        escape(title)
    );
    // Axes and grid.
    let mut y = 0.0;
    while y <= y_top + y_step / 2.0 {
        svg.push_str(&format!(
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            LEFT + plot_w,
            sy(y),
            sy(y),
            LEFT - 6.0,
            sy(y) + 4.0,
            escape(&y_format(y))
        ));
        y += y_step;
    }
    let ticks: Vec<(f64, String)> = if x_ticks.is_empty() {
        let step = nice_step(x_max - x_min, 8.0);
        let mut ticks = Vec::new();
        let mut x = (x_min / step).ceil() * step;
        while x <= x_max + step * 1e-9 && ticks.len() < 50 {
            ticks.push((x, format!("{x}")));
            x += step;
        }
        ticks
    } else {
        x_ticks.to_vec()
    };
    for (x, label) in &ticks {
        svg.push_str(&format!(
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{1:.1}\" y2=\"{2:.1}\" stroke=\"#eee\"/>\
             <text x=\"{0:.1}\" y=\"{3:.1}\" text-anchor=\"middle\">{4}</text>\n",
            sx(*x),
            TOP,
            TOP + plot_h,
            TOP + plot_h + 16.0,
            escape(label)
        ));
    }
    svg.push_str(&format!(
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w:.1}\" height=\"{plot_h:.1}\" fill=\"none\" stroke=\"#888\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
         <text x=\"14\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {:.1})\">{}</text>\n",
        LEFT + plot_w / 2.0,
        HEIGHT - 8.0,
        escape(x_label),
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(y_label)
    ));
    for (index, s) in series.iter().enumerate() {
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        svg.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" points=\"{}\"/>\n",
            s.color,
            path.join(" ")
        ));
        if s.points.len() <= 60 {
            for &(x, y) in &s.points {
                svg.push_str(&format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{}\"/>\n",
                    sx(x),
                    sy(y),
                    s.color
                ));
            }
        }
        let ly = TOP + 10.0 + index as f64 * 18.0;
        svg.push_str(&format!(
            "<line x1=\"{0:.1}\" x2=\"{1:.1}\" y1=\"{2:.1}\" y2=\"{2:.1}\" stroke=\"{3}\" stroke-width=\"3\"/>\
             <text x=\"{4:.1}\" y=\"{5:.1}\">{6}</text>\n",
            LEFT + plot_w + 10.0,
            LEFT + plot_w + 30.0,
            ly,
            s.color,
            LEFT + plot_w + 36.0,
            ly + 4.0,
            escape(&s.name)
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Send => "send",
        Kind::Poll => "poll",
    }
}

/// The page.
pub fn html(report: &Report) -> String {
    let mut latency_series = Vec::new();
    let mut throughput_series = Vec::new();
    let colors = [
        ("#1f77b4", "#aec7e8", "#d62728"),
        ("#2ca02c", "#98df8a", "#ff7f0e"),
    ];
    for (kind, (c50, c99, cmax)) in [Kind::Send, Kind::Poll].into_iter().zip(colors) {
        let buckets: Vec<_> = report.time_series.iter().filter(|b| b.kind == kind).collect();
        if buckets.is_empty() {
            continue;
        }
        let label = kind_label(kind);
        // Seconds without completions have no latency: leave them out of the latency lines.
        let with_data = || buckets.iter().filter(|b| b.requests > 0);
        latency_series.push(Series {
            name: format!("{label} p50"),
            color: c50,
            points: with_data().map(|b| (b.second as f64, ms(b.p50_us))).collect(),
        });
        latency_series.push(Series {
            name: format!("{label} p99"),
            color: c99,
            points: with_data().map(|b| (b.second as f64, ms(b.p99_us))).collect(),
        });
        latency_series.push(Series {
            name: format!("{label} max"),
            color: cmax,
            points: with_data().map(|b| (b.second as f64, ms(b.max_us))).collect(),
        });
        throughput_series.push(Series {
            name: format!("{label} MB/s"),
            color: c50,
            points: buckets
                .iter()
                .map(|b| (b.second as f64, b.payload_bytes as f64 / 1e6))
                .collect(),
        });
    }
    // Percentile plot: x = -log10(1 - q), so 90%, 99%, 99.9% are evenly spaced.
    let quantiles = [
        0.0, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999, 0.99999,
    ];
    let x_of = |q: f64| -(1.0 - q).log10();
    let mut percentile_series = Vec::new();
    for (phase, color) in report.phases().zip(["#1f77b4", "#2ca02c"]) {
        let sorted = &phase.sorted_latencies_us;
        if sorted.is_empty() {
            continue;
        }
        // Only as deep as the sample count resolves, then the maximum.
        let depth = 1.0 - 1.0 / sorted.len() as f64;
        let mut points: Vec<(f64, f64)> = quantiles
            .iter()
            .filter(|&&q| q <= depth)
            .map(|&q| (x_of(q), ms(percentile(sorted, q * 100.0))))
            .collect();
        points.push((x_of(depth.max(0.5)), ms(sorted[sorted.len() - 1])));
        percentile_series.push(Series {
            name: format!("{} ({} samples)", kind_label(phase.kind), sorted.len()),
            color,
            points,
        });
    }
    let percentile_ticks: Vec<(f64, String)> = [
        (0.0, "0%"),
        (0.5, "50%"),
        (0.9, "90%"),
        (0.99, "99%"),
        (0.999, "99.9%"),
        (0.9999, "99.99%"),
        (0.99999, "99.999%"),
    ]
    .iter()
    .map(|&(q, label)| (x_of(q), label.to_string()))
    .collect();
    let ms_format = |v: f64| format!("{v:.1} ms");
    let mb_format = |v: f64| format!("{v:.0}");
    let p = &report.parameters;
    let mut body = String::new();
    body.push_str(&format!(
        "<h1>cairn bench: {}</h1>\n<p><code>{}</code></p>\n",
        escape(p.workload.name()),
        escape(&report.command_line)
    ));
    body.push_str(&format!(
        "<p>{} producers, {} consumers, {} streams &times; {} partitions, {} batches &times; {} messages &times; {} B, durability label <b>{}</b> ({}).</p>\n",
        p.producers,
        p.consumers,
        p.streams,
        p.partitions,
        p.batches,
        p.messages_per_batch,
        p.message_size,
        p.durability.name(),
        escape(super::report::DURABILITY_NOTE)
    ));
    body.push_str("<table>\n<tr><th>kind</th><th>messages</th><th>wall s</th><th>MB/s</th><th>msgs/s</th><th>p50</th><th>p90</th><th>p99</th><th>p999</th><th>max</th></tr>\n");
    for phase in report.phases() {
        let l = &phase.latency;
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.1}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            kind_label(phase.kind),
            phase.messages,
            phase.wall_seconds,
            phase.throughput_mb_per_s,
            phase.messages_per_s,
            format_us(l.p50_us),
            format_us(l.p90_us),
            format_us(l.p99_us),
            format_us(l.p999_us),
            format_us(l.max_us)
        ));
    }
    body.push_str("</table>\n");
    if let Some(cpu) = &report.server_cpu {
        body.push_str(&format!(
            "<p>Server CPU: {:.2} s, {:.3} CPU s per GB moved.</p>\n",
            cpu.cpu_seconds, cpu.cpu_seconds_per_gb
        ));
    }
    if let Some(cpu) = &report.client_cpu {
        body.push_str(&format!(
            "<p>Load generator CPU: {:.2} s, {:.3} CPU s per GB moved.</p>\n",
            cpu.cpu_seconds, cpu.cpu_seconds_per_gb
        ));
    }
    body.push_str(&line_chart(
        "Latency over time (per second, by completion)",
        "seconds since start",
        "latency",
        &latency_series,
        &[],
        &ms_format,
    ));
    body.push_str(&line_chart(
        "Throughput over time",
        "seconds since start",
        "MB/s",
        &throughput_series,
        &[],
        &mb_format,
    ));
    body.push_str(&line_chart(
        "Latency by percentile (all samples)",
        "percentile",
        "latency",
        &percentile_series,
        &percentile_ticks,
        &ms_format,
    ));
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>cairn bench: {}</title>\n\
         <style>body{{font-family:sans-serif;margin:24px;max-width:900px}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}svg{{display:block;margin:18px 0}}</style>\n\
         </head><body>\n{body}</body></html>\n",
        escape(p.workload.name())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(1000.0, 5.0), 200.0);
        assert_eq!(nice_step(3.0, 5.0), 1.0);
    }

    #[test]
    fn chart_is_svg_and_escapes() {
        let svg = line_chart(
            "a < b",
            "x",
            "y",
            &[Series {
                name: "s".into(),
                color: "#000",
                points: vec![(0.0, 1.0), (1.0, 2.0)],
            }],
            &[],
            &|v| format!("{v}"),
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("a &lt; b"));
        assert!(svg.contains("<polyline"));
        // No data: still a well-formed empty chart.
        assert!(line_chart("t", "x", "y", &[], &[], &|v| format!("{v}")).ends_with("</svg>\n"));
    }
}
