//! Hand-written SVG charts (no fonts or libraries needed; the browser draws the
//! text): lines over a log2 axis, bars, grouped bars on a linear or log10 axis, and
//! step histograms over a log10 axis.

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

/// Starts a chart `height` high: the `<svg>` element (with `class`, when given),
/// its title and the y axis label. The chart takes the width of the page (or of
/// what holds it) and keeps its proportions: a `viewBox` and `width="100%"`, no
/// height of its own.
fn open(out: &mut String, title: &str, y_label: &str, class: Option<&str>, height: f64) {
    let class = class.map_or(String::new(), |c| format!(r#" class="{}""#, escape(c)));
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg"{class} viewBox="0 0 {WIDTH} {height}" width="100%" preserveAspectRatio="xMidYMid meet" font-family="sans-serif" font-size="12" role="img"><title>{t}</title><rect width="100%" height="100%" fill="white"/><text x="{cx}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{t}</text><text transform="translate(16 {cy}) rotate(-90)" text-anchor="middle">{y}</text>"#,
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
pub(super) fn tick(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        super::number(value)
    }
}

/// How a legend entry shows its series' colour.
#[derive(Clone, Copy)]
enum Swatch {
    /// A filled square (bars, and line charts' markers).
    Square,
    /// A stroke, dashed like the series it names (histogram outlines).
    Stroke,
}

fn legend(out: &mut String, names: &[String], swatch: Swatch) {
    for (index, name) in names.iter().enumerate() {
        let y = TOP + 8.0 + index as f64 * 18.0;
        let x = WIDTH - RIGHT + 16.0;
        let c = COLOURS[index % COLOURS.len()];
        let _ = match swatch {
            Swatch::Square => write!(
                out,
                r#"<rect x="{x}" y="{ry}" width="12" height="12" fill="{c}"/>"#,
                ry = y - 10.0,
            ),
            Swatch::Stroke => write!(
                out,
                r#"<line x1="{x}" y1="{ly}" x2="{x2}" y2="{ly}" stroke="{c}" stroke-width="2"{d}/>"#,
                ly = y - 4.0,
                x2 = x + 14.0,
                d = dash(index),
            ),
        };
        let _ = write!(
            out,
            r#"<text x="{tx}" y="{y}">{n}</text>"#,
            tx = x + 18.0,
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

/// A value with its unit, for a tooltip: "512 MB/s", "250 µs", "97 %".
fn with_unit(value: f64, unit: &str) -> String {
    if unit.is_empty() {
        super::number(value)
    } else {
        format!("{} {unit}", super::number(value))
    }
}

/// Lines over a log2 x axis (record sizes), y from 0. Each point's tooltip names
/// its series, its x (as `x_tick` writes it) and its value in `unit`.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    unit: &str,
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
    open(&mut out, title, y_label, None, HEIGHT);
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
        let points: Vec<(f64, f64)> = line.points.iter().copied().filter(|p| p.0 > 0.0).collect();
        let coordinates: Vec<String> = points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            coordinates.join(" "),
            escape(&line.name),
        );
        for &(x, y) in &points {
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"><title>{}</title></circle>"#,
                px(x),
                py(y),
                escape(&format!(
                    "{} at {}: {}",
                    line.name,
                    x_tick(x),
                    with_unit(y, unit)
                )),
            );
        }
    }
    legend(
        &mut out,
        &series.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        Swatch::Square,
    );
    out.push_str("</svg>");
    out
}

/// Groups of bars, one bar per series in each group; `log` puts y on a log10 axis
/// (latencies spread over orders of magnitude). Each bar's tooltip names its group,
/// its series when there are several (the percentile of a latency bar) and its
/// value in `unit`.
pub fn grouped_bars(
    title: &str,
    y_label: &str,
    unit: &str,
    groups: &[(String, Vec<f64>)],
    series: &[String],
    log: bool,
) -> String {
    let biggest = groups
        .iter()
        .flat_map(|g| g.1.iter().copied())
        .fold(0.0, f64::max);
    let mut out = String::new();
    open(&mut out, title, y_label, None, HEIGHT);
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
            let tooltip = match series.get(which) {
                Some(name) if series.len() > 1 => {
                    format!("{label}, {name}: {}", with_unit(value, unit))
                }
                _ => format!("{label}: {}", with_unit(value, unit)),
            };
            let _ = write!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{height:.1}" fill="{}"><title>{}</title></rect>"#,
                start + bar * which as f64,
                TOP + plot_height() - height,
                bar,
                COLOURS[which % COLOURS.len()],
                escape(&tooltip),
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
        legend(&mut out, series, Swatch::Square);
    }
    out.push_str("</svg>");
    out
}

/// One outline of a histogram chart: bins as (low, high, height), in increasing
/// order; bins need not touch (the outline drops to zero across a gap).
pub struct Bins {
    pub name: String,
    /// More for the outline's tooltip than the legend holds (its percentiles,
    /// with their unit); may be empty.
    pub detail: String,
    pub bins: Vec<(f64, f64, f64)>,
}

/// The class of the `<svg>` element [`histogram`] draws, for pages and tests to
/// find it by.
pub const HISTOGRAM_CLASS: &str = "latency-histogram";

/// Step histograms over a log10 x axis (latencies spread over orders of magnitude),
/// one outline per series, lightly filled so overlapping ones stay visible; series
/// past the tenth colour are dashed. `x_tick` labels the powers of ten.
pub fn histogram(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Bins],
    x_tick: impl Fn(f64) -> String,
) -> String {
    let bins = || series.iter().flat_map(|s| s.bins.iter().copied());
    let low = bins()
        .map(|b| b.0)
        .filter(|&x| x > 0.0 && x.is_finite())
        .fold(f64::MAX, f64::min);
    let high = bins()
        .map(|b| b.1)
        .filter(|&x| x > 0.0 && x.is_finite())
        .fold(0.0, f64::max);
    // Whole decades, so that every tick is a power of ten.
    let (low, high) = if high > 0.0 && low <= high {
        let low = low.log10().floor();
        (low, high.log10().ceil().max(low + 1.0))
    } else {
        (0.0, 1.0)
    };
    let max = nice_ceiling(bins().map(|b| b.2).fold(0.0, f64::max));
    let px = |x: f64| LEFT + (x.max(f64::MIN_POSITIVE).log10() - low) / (high - low) * plot_width();
    let py = |y: f64| TOP + plot_height() * (1.0 - y.clamp(0.0, max) / max);
    let base = TOP + plot_height();
    let mut out = String::new();
    // No slanted labels under a histogram: the chart ends below the axis label, or
    // below the legend when that is longer.
    let height = (base + 60.0).max(TOP + series.len() as f64 * 18.0 + 10.0);
    open(&mut out, title, y_label, Some(HISTOGRAM_CLASS), height);
    linear_axis(&mut out, max);
    for power in low as i32..=high as i32 {
        let value = 10f64.powi(power);
        let x = px(value);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{base}" stroke="#eee"/><text x="{x:.1}" y="{ty}" text-anchor="middle">{label}</text>"##,
            ty = base + 16.0,
            label = escape(&x_tick(value)),
        );
    }
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + plot_width() / 2.0,
        base + 40.0,
        escape(x_label),
    );
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let mut path = String::new();
        let mut previous: Option<f64> = None;
        for &(from, to, height) in &line.bins {
            let (x0, x1, y) = (px(from), px(to), py(height));
            match previous {
                // Touching the bin before: straight up or down to this one's height.
                Some(edge) if (x0 - edge).abs() < 0.5 => {}
                // A gap: down to the baseline and along it.
                Some(edge) => {
                    let _ = write!(path, "L{edge:.1},{base:.1}L{x0:.1},{base:.1}");
                }
                None => {
                    let _ = write!(path, "M{x0:.1},{base:.1}");
                }
            }
            let _ = write!(path, "L{x0:.1},{y:.1}L{x1:.1},{y:.1}");
            previous = Some(x1);
        }
        if let Some(edge) = previous {
            let tooltip = if line.detail.is_empty() {
                line.name.clone()
            } else {
                format!("{}: {}", line.name, line.detail)
            };
            let _ = write!(
                out,
                r#"<path d="{path}L{edge:.1},{base:.1}Z" fill="{colour}" fill-opacity="0.08" stroke="{colour}" stroke-width="1.5"{dash}><title>{tooltip}</title></path>"#,
                dash = dash(index),
                tooltip = escape(&tooltip),
            );
        }
    }
    axes(&mut out);
    let names: Vec<String> = series.iter().map(|line| line.name.clone()).collect();
    legend(&mut out, &names, Swatch::Stroke);
    out.push_str("</svg>");
    out
}

/// A dash pattern for series that reuse a colour, so that the eleventh line is not
/// taken for the first.
fn dash(index: usize) -> &'static str {
    match (index / COLOURS.len()) % 3 {
        0 => "",
        1 => r#" stroke-dasharray="6 3""#,
        _ => r#" stroke-dasharray="2 2""#,
    }
}

/// Checks that `xml` is one well-formed element: tags nest and close, attribute
/// values are quoted, and text and attributes hold no bare `<` or `&`. Enough for
/// the SVG and HTML written here (no comments, CDATA or processing instructions,
/// besides a leading doctype; HTML's void elements such as `<meta>` close
/// themselves).
#[cfg(test)]
pub(crate) fn check_well_formed(xml: &str) -> Result<(), String> {
    fn check_text(text: &str) -> Result<(), String> {
        let mut rest = text;
        while let Some(at) = rest.find('&') {
            rest = &rest[at + 1..];
            let end = rest
                .find(';')
                .ok_or_else(|| format!("bare & before {rest:.20}"))?;
            let name = &rest[..end];
            let numeric = name.len() > 1
                && name.starts_with('#')
                && name[1..].chars().all(|c| c.is_ascii_digit());
            if !(numeric || matches!(name, "amp" | "lt" | "gt" | "quot" | "apos")) {
                return Err(format!("unknown entity &{name};"));
            }
        }
        if let Some(at) = text.find('<') {
            return Err(format!("bare < in {:.40}", &text[at..]));
        }
        Ok(())
    }
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = xml.trim();
    if rest.starts_with("<!DOCTYPE") {
        rest = rest[rest.find('>').ok_or("unclosed doctype")? + 1..].trim_start();
    }
    let mut roots = 0;
    while !rest.is_empty() {
        let open = rest.find('<').unwrap_or(rest.len());
        let text = &rest[..open];
        check_text(text)?;
        if stack.is_empty() && !text.trim().is_empty() {
            return Err(format!("text outside the root: {text:.20}"));
        }
        if open == rest.len() {
            break;
        }
        rest = &rest[open + 1..];
        // The tag ends at the first '>' outside quotes.
        let mut quote = None;
        let close = rest
            .char_indices()
            .find(|&(_, c)| match quote {
                None if c == '"' || c == '\'' => {
                    quote = Some(c);
                    false
                }
                Some(q) if c == q => {
                    quote = None;
                    false
                }
                None => c == '>',
                Some(_) => false,
            })
            .map(|(at, _)| at)
            .ok_or("unclosed tag")?;
        let tag = &rest[..close];
        rest = &rest[close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            match stack.pop() {
                Some(open) if open == name.trim() => continue,
                other => return Err(format!("</{name}> closes {other:?}")),
            }
        }
        let name = tag
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or("");
        if name.is_empty()
            || tag
                .split('"')
                .step_by(2)
                .any(|outside| outside.contains('<'))
        {
            return Err(format!("bad tag <{tag}>"));
        }
        // Attribute values: inside quotes, entities only.
        for value in tag.split('"').skip(1).step_by(2) {
            check_text(value)?;
        }
        if stack.is_empty() {
            roots += 1;
        }
        let void = matches!(name, "meta" | "br" | "hr" | "img" | "input" | "link");
        if !tag.ends_with('/') && !void {
            stack.push(name);
        }
    }
    match (stack.last(), roots) {
        (Some(open), _) => Err(format!("<{open}> is never closed")),
        (None, 1) => Ok(()),
        (None, n) => Err(format!("{n} root elements")),
    }
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
        let svg = line_chart("t", "record", "MB/s", "MB/s", &series, |x| format!("{x}"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("read &lt;a&amp;b&gt;"));
        assert!(svg.contains("<polyline"));
        let bars = grouped_bars(
            "b",
            "us",
            "µs",
            &[("x".into(), vec![1.0, 1000.0])],
            &["p50".into(), "max".into()],
            true,
        );
        assert_eq!(bars.matches("<rect x=").count(), 2 + 2);
        assert!(!bars.contains("NaN"));
        for chart in [&svg, &bars] {
            check_well_formed(chart).unwrap();
        }
    }

    #[test]
    fn histograms_are_well_formed_escaped_and_on_a_log_axis() {
        let series: Vec<Bins> = (0..12)
            .map(|index| Bins {
                name: format!("op <{index}> & co"),
                detail: String::new(),
                // Two touching bins, a gap, one more.
                bins: vec![(10.0, 12.0, 40.0), (12.0, 14.0, 50.0), (300.0, 360.0, 10.0)],
            })
            .collect();
        let svg = histogram("lat <ency>", "latency", "% of ops", &series, |x| {
            format!("{x} µs")
        });
        check_well_formed(&svg).unwrap();
        let opening =
            format!(r#"<svg xmlns="http://www.w3.org/2000/svg" class="{HISTOGRAM_CLASS}""#);
        assert!(svg.starts_with(&opening), "{svg:.120}");
        // No room kept for slanted labels below: shorter than the bar charts.
        let short = format!(r#"viewBox="0 0 {WIDTH} {}""#, TOP + plot_height() + 60.0);
        assert!(svg.contains(&short), "{svg:.200}");
        assert!(svg.contains("<title>lat &lt;ency&gt;</title>"));
        assert!(svg.contains("<title>op &lt;11&gt; &amp; co</title>"));
        assert_eq!(svg.matches("<path ").count(), 12);
        // Series past the tenth colour are dashed, outline and legend.
        assert_eq!(svg.matches("stroke-dasharray").count(), 2 * 2);
        // Whole decades around the data, 10 µs .. 1000 µs, one tick each.
        for tick in ["10 µs", "100 µs", "1000 µs"] {
            assert!(svg.contains(&format!(">{tick}</text>")), "{tick}");
        }
        assert!(!svg.contains(">1 µs<") && !svg.contains(">10000 µs<"));
        // The gap drops to the baseline and runs along it.
        let base = TOP + plot_height();
        assert!(svg.contains(&format!(",{base:.1}L")));
        // The 50% bin is the highest: the y axis ends at a nice 50.
        assert!(svg.contains(">50</text>"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        // Nothing to draw still makes a valid, empty chart.
        check_well_formed(&histogram("empty", "x", "y", &[], |x| x.to_string())).unwrap();
    }

    #[test]
    fn charts_take_the_pages_width_and_keep_their_proportions() {
        let series = vec![Series {
            name: "write".into(),
            points: vec![(4096.0, 100.0), (65536.0, 300.0)],
        }];
        let line = line_chart("t", "record", "MB/s", "MB/s", &series, |x| format!("{x}"));
        let bars = grouped_bars(
            "b",
            "MB/s",
            "MB/s",
            &[("x".into(), vec![1.0])],
            &["MB/s".into()],
            false,
        );
        let bins = [Bins {
            name: "read".into(),
            detail: String::new(),
            bins: vec![(10.0, 12.0, 40.0)],
        }];
        let histogram = histogram("h", "latency", "%", &bins, |x| x.to_string());
        for chart in [&line, &bars, &histogram] {
            let opening = &chart[..chart.find('>').unwrap()];
            assert!(opening.contains(r#" viewBox="0 0 760 "#), "{opening}");
            assert!(opening.contains(r#" width="100%""#), "{opening}");
            // No fixed size: the height follows the width through the viewBox.
            assert!(!opening.contains(" height="), "{opening}");
        }
    }

    #[test]
    fn tooltips_name_the_series_the_value_and_its_unit() {
        let bars = grouped_bars(
            "Latency",
            "microseconds (log)",
            "µs",
            &[("sequential write 1M".into(), vec![40.0, 250.0])],
            &["p50".into(), "p99".into()],
            true,
        );
        assert!(
            bars.contains("<title>sequential write 1M, p50: 40.0 µs</title>"),
            "{bars}"
        );
        assert!(
            bars.contains("<title>sequential write 1M, p99: 250 µs</title>"),
            "{bars}"
        );
        // One series: its name would only repeat the unit.
        let one = grouped_bars(
            "t",
            "MB/s",
            "MB/s",
            &[("read 1M".into(), vec![1100.0])],
            &["MB/s".into()],
            false,
        );
        assert!(one.contains("<title>read 1M: 1100 MB/s</title>"), "{one}");
        let series = vec![Series {
            name: "reread".into(),
            points: vec![(4096.0, 123.4)],
        }];
        let line = line_chart("t", "record size", "MB/s", "MB/s", &series, |x| {
            format!("{}K", x / 1024.0)
        });
        assert!(
            line.contains("<title>reread at 4K: 123 MB/s</title>"),
            "{line}"
        );
        let bins = [Bins {
            name: "randread 4K".into(),
            detail: "p50 40.0 µs, p99 250 µs".into(),
            bins: vec![(10.0, 12.0, 40.0)],
        }];
        let histogram = histogram("h", "latency", "%", &bins, |x| x.to_string());
        assert!(
            histogram.contains("<title>randread 4K: p50 40.0 µs, p99 250 µs</title>"),
            "{histogram}"
        );
    }

    #[test]
    fn the_well_formedness_check_catches_what_it_should() {
        check_well_formed(r#"<svg a="1 > 0"><g><t>a &amp; b</t></g><r/></svg>"#).unwrap();
        check_well_formed("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head></html>\n")
            .unwrap();
        for bad in [
            "<svg><g></svg>",
            "<svg></g></svg>",
            "<svg>a & b</svg>",
            "<svg><a x=\"<\"/></svg>",
            "<svg/><svg/>",
            "<svg>",
            "text<svg/>",
        ] {
            assert!(check_well_formed(bad).is_err(), "{bad}");
        }
    }
}
