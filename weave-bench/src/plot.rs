//! `--plot FILE.svg`: bus bandwidth against message size, one line per library, as a small
//! self-contained SVG (log2 size axis, linear GB/s axis).

use std::fmt::Write as _;

/// One line of the plot: a name and (bytes, busbw GB/s) points.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];

fn size_label(bytes: f64) -> String {
    let b = bytes as u64;
    if b >= 1 << 30 {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The SVG text. Points with non-positive size are skipped (log axis).
pub(crate) fn busbw_svg(title: &str, series: &[Series]) -> String {
    let pts = || series.iter().flat_map(|s| s.points.iter()).filter(|(b, _)| *b > 0.0);
    let (xmin, xmax) = pts().fold((f64::INFINITY, 0.0f64), |(lo, hi), (b, _)| (lo.min(b.log2()), hi.max(b.log2())));
    let (xmin, xmax) = if xmin.is_finite() && xmax > xmin { (xmin, xmax) } else { (0.0, 1.0) };
    let ymax = pts().map(|(_, y)| *y).fold(0.0f64, f64::max).max(1e-9) * 1.08;
    let px = |b: f64| LEFT + (b.log2() - xmin) / (xmax - xmin) * (WIDTH - LEFT - RIGHT);
    let py = |y: f64| HEIGHT - BOTTOM - y / ymax * (HEIGHT - TOP - BOTTOM);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ =
        write!(s, r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#, WIDTH / 2.0, escape(title));
    // Axes and grid.
    let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP);
    let _ = write!(s, r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>"#);
    let _ = write!(s, r#"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>"#);
    let mut e = xmin.ceil() as i32;
    while f64::from(e) <= xmax {
        let b = 2f64.powi(e);
        let x = px(b);
        let _ = write!(s, r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}" stroke="#eee"/>"##);
        if e % 2 == 0 {
            let _ = write!(s, r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#, y0 + 16.0, size_label(b));
        }
        e += 1;
    }
    for i in 0..=5 {
        let v = ymax / 1.08 * f64::from(i) / 5.0;
        let y = py(v);
        let _ = write!(s, r##"<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#eee"/>"##);
        let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="end">{v:.1}</text>"#, x0 - 6.0, y + 4.0);
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">message size (bytes)</text>"#,
        (x0 + x1) / 2.0,
        HEIGHT - 18.0
    );
    let _ = write!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">busbw (GB/s)</text>"#,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0
    );
    // Lines and legend.
    for (i, ser) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> =
            ser.points.iter().filter(|(b, _)| *b > 0.0).map(|(b, y)| format!("{:.1},{:.1}", px(*b), py(*y))).collect();
        if !path.is_empty() {
            let _ =
                write!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, path.join(" "));
        }
        let ly = TOP + 8.0 + 18.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/>"#,
            x0 + 12.0,
            x0 + 36.0
        );
        let _ = write!(s, r#"<text x="{}" y="{}">{}</text>"#, x0 + 42.0, ly + 4.0, escape(&ser.name));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_a_line_per_series_and_labels() {
        let a = Series { name: "weave".into(), points: vec![(8.0, 0.1), (1024.0, 2.0), (1048576.0, 5.0)] };
        let b = Series { name: "Open MPI <4>".into(), points: vec![(8.0, 0.2), (1024.0, 1.0), (0.0, 9.0)] };
        let svg = busbw_svg("all_reduce", &[a, b]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("Open MPI &lt;4&gt;"));
        assert!(svg.contains(">1M<") && svg.contains(">1K<"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn empty_series_still_make_a_valid_picture() {
        let svg = busbw_svg("nothing", &[Series { name: "weave".into(), points: vec![] }]);
        assert!(svg.contains("</svg>") && !svg.contains("NaN"));
    }
}
