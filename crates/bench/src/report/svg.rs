//! Hand-written SVG charts (no fonts or libraries needed; the browser draws the
//! text): lines over a log2 axis, bars, grouped bars on a linear or log10 axis.

use std::fmt::Write;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 36.0;
/// Room for the slanted labels under bars.
const BOTTOM: f64 = 130.0;
const COLOURS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// Escapes text for XML.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// One line of a line chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten.
fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 2.5, 4.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|&v| v >= value)
        .unwrap_or(10.0 * power)
}

fn plot_width() -> f64 {
    WIDTH - LEFT - RIGHT
}

fn plot_height() -> f64 {
    HEIGHT - TOP - BOTTOM
}

fn open(out: &mut String, title: &str, y_label: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12" role="img"><title>{t}</title><rect width="100%" height="100%" fill="white"/><text x="{cx}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{t}</text><text transform="translate(16 {cy}) rotate(-90)" text-anchor="middle">{y}</text>"#,
        t = escape(title),
        y = escape(y_label),
        cx = LEFT + plot_width() / 2.0,
        cy = TOP + plot_height() / 2.0,
    );
}

/// Horizontal grid lines and labels for a linear axis 0..max.
fn linear_axis(out: &mut String, max: f64) {
    for step in 0..=5 {
        let value = max * f64::from(step) / 5.0;
        let y = TOP + plot_height() * (1.0 - f64::from(step) / 5.0);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{x2}" y2="{y:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{label}</text>"##,
            x2 = LEFT + plot_width(),
            tx = LEFT - 6.0,
            ty = y + 4.0,
            label = tick(value),
        );
    }
}

/// An axis label: whole numbers without decimals.
fn tick(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        super::number(value)
    }
}

fn legend(out: &mut String, names: &[String]) {
    for (index, name) in names.iter().enumerate() {
        let y = TOP + 8.0 + index as f64 * 18.0;
        let x = WIDTH - RIGHT + 16.0;
        let _ = write!(
            out,
            r#"<rect x="{x}" y="{ry}" width="12" height="12" fill="{c}"/><text x="{tx}" y="{ty}">{n}</text>"#,
            ry = y - 10.0,
            c = COLOURS[index % COLOURS.len()],
            tx = x + 18.0,
            ty = y,
            n = escape(name),
        );
    }
}

fn axes(out: &mut String) {
    let _ = write!(
        out,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}" stroke="black"/><line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/>"#,
        b = TOP + plot_height(),
        r = LEFT + plot_width(),
    );
}

/// Lines over a log2 x axis (record sizes), y from 0.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    x_tick: impl Fn(f64) -> String,
) -> String {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|&x| x > 0.0)
        .collect();
    let (low, high) = xs.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| {
        (lo.min(x.log2()), hi.max(x.log2()))
    });
    let (low, high) = if xs.is_empty() {
        (0.0, 1.0)
    } else if high <= low {
        (low - 1.0, high + 1.0)
    } else {
        (low, high)
    };
    let max = nice_ceiling(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max),
    );
    let px = |x: f64| LEFT + (x.log2() - low) / (high - low) * plot_width();
    let py = |y: f64| TOP + plot_height() * (1.0 - y / max);
    let mut out = String::new();
    open(&mut out, title, y_label);
    linear_axis(&mut out, max);
    let mut ticks: Vec<f64> = xs.clone();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in ticks {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            px(x),
            TOP + plot_height() + 16.0,
            escape(&x_tick(x)),
        );
    }
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + plot_width() / 2.0,
        TOP + plot_height() + 40.0,
        escape(x_label),
    );
    axes(&mut out);
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let points: Vec<String> = line
            .points
            .iter()
            .filter(|p| p.0 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        for point in &points {
            let (x, y) = point.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(out, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
        }
    }
    legend(
        &mut out,
        &series.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
    );
    out.push_str("</svg>");
    out
}

/// Groups of bars, one bar per series in each group; `log` puts y on a log10 axis
/// (latencies spread over orders of magnitude).
pub fn grouped_bars(
    title: &str,
    y_label: &str,
    groups: &[(String, Vec<f64>)],
    series: &[String],
    log: bool,
) -> String {
    let biggest = groups
        .iter()
        .flat_map(|g| g.1.iter().copied())
        .fold(0.0, f64::max);
    let mut out = String::new();
    open(&mut out, title, y_label);
    let scale: Box<dyn Fn(f64) -> f64> = if log {
        let top = biggest.max(10.0).log10().ceil();
        for power in 0..=top as i32 {
            let y = TOP + plot_height() * (1.0 - f64::from(power) / top);
            let _ = write!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{x2}" y2="{y:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{label}</text>"##,
                x2 = LEFT + plot_width(),
                tx = LEFT - 6.0,
                ty = y + 4.0,
                label = 10u64.pow(power as u32),
            );
        }
        Box::new(move |v: f64| v.max(1.0).log10() / top)
    } else {
        let max = nice_ceiling(biggest);
        linear_axis(&mut out, max);
        Box::new(move |v: f64| v / max)
    };
    let slot = plot_width() / groups.len().max(1) as f64;
    let bar = (slot * 0.8 / series.len().max(1) as f64).min(40.0);
    for (index, (label, values)) in groups.iter().enumerate() {
        let start = LEFT + slot * index as f64 + (slot - bar * values.len() as f64) / 2.0;
        for (which, &value) in values.iter().enumerate() {
            let height = plot_height() * scale(value).clamp(0.0, 1.0);
            let _ = write!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{height:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                start + bar * which as f64,
                TOP + plot_height() - height,
                bar,
                COLOURS[which % COLOURS.len()],
                escape(label),
                super::number(value),
            );
        }
        let x = LEFT + slot * (index as f64 + 0.5);
        let y = TOP + plot_height() + 14.0;
        let _ = write!(
            out,
            r#"<text transform="translate({x:.1} {y:.1}) rotate(30)" font-size="10">{}</text>"#,
            escape(label),
        );
    }
    axes(&mut out);
    if series.len() > 1 {
        legend(&mut out, series);
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(1140.0), 2000.0);
        assert_eq!(nice_ceiling(2137.0), 2500.0);
        assert_eq!(nice_ceiling(450.0), 500.0);
    }

    #[test]
    fn charts_are_well_formed_and_escaped() {
        let series = vec![Series {
            name: "read <a&b>".into(),
            points: vec![(4096.0, 100.0), (65536.0, 300.0)],
        }];
        let svg = line_chart("t", "record", "MB/s", &series, |x| format!("{x}"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("read &lt;a&amp;b&gt;"));
        assert!(svg.contains("<polyline"));
        let bars = grouped_bars(
            "b",
            "us",
            &[("x".into(), vec![1.0, 1000.0])],
            &["p50".into(), "max".into()],
            true,
        );
        assert_eq!(bars.matches("<rect x=").count(), 2 + 2);
        assert!(!bars.contains("NaN"));
    }
}
