//! A small SVG line chart (log2 x axis), so benchmarks can save a plot with
//! no plotting dependency.

/// One line of the chart.
pub struct Series<'a> {
    /// Legend text.
    pub name: &'a str,
    /// (x, y) points; x > 0.
    pub points: Vec<(f64, f64)>,
}

/// Writes an SVG chart with a log2 x axis and a linear y axis from 0.
pub fn svg_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h, l, r, t, b) = (760.0, 440.0, 80.0, 20.0, 40.0, 60.0);
    let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0.max(1.0).log2())).collect();
    let ys: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).collect();
    let (x0, x1) = (
        xs.iter().cloned().fold(f64::MAX, f64::min),
        xs.iter().cloned().fold(f64::MIN, f64::max),
    );
    let y1 = ys.iter().cloned().fold(0.0, f64::max).max(1e-9) * 1.1;
    let sx = |x: f64| l + (x.max(1.0).log2() - x0) / (x1 - x0).max(1e-9) * (w - l - r);
    let sy = |y: f64| h - b - y / y1 * (h - t - b);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n\
         <rect width='100%' height='100%' fill='white'/>\n<text x='{}' y='24' text-anchor='middle' font-size='15'>{title}</text>\n\
         <line x1='{l}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n<line x1='{l}' y1='{t}' x2='{l}' y2='{}' stroke='black'/>\n\
         <text x='{}' y='{}' text-anchor='middle'>{x_label}</text>\n\
         <text x='18' y='{}' text-anchor='middle' transform='rotate(-90 18 {})'>{y_label}</text>\n",
        w / 2.0,
        h - b,
        w - r,
        h - b,
        h - b,
        (l + w - r) / 2.0,
        h - 18.0,
        (t + h - b) / 2.0,
        (t + h - b) / 2.0
    );
    for k in 0..=4 {
        let y = y1 * k as f64 / 4.0;
        s += &format!("<text x='{}' y='{}' text-anchor='end'>{:.0}</text>\n", l - 6.0, sy(y) + 4.0, y);
    }
    let mut e = x0.ceil() as i64;
    while e as f64 <= x1 {
        let x = 2f64.powi(e as i32);
        let label = if e >= 30 {
            format!("{}G", 1u64 << (e - 30))
        } else if e >= 20 {
            format!("{}M", 1u64 << (e - 20))
        } else if e >= 10 {
            format!("{}K", 1u64 << (e - 10))
        } else {
            format!("{}", 1u64 << e)
        };
        s += &format!("<text x='{}' y='{}' text-anchor='middle'>{label}</text>\n", sx(x), h - b + 16.0);
        e += 2;
    }
    for (i, ser) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let pts: Vec<String> = ser.points.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect();
        s += &format!("<polyline fill='none' stroke='{c}' stroke-width='2' points='{}'/>\n", pts.join(" "));
        s += &format!(
            "<text x='{}' y='{}' fill='{c}'>{}</text>\n",
            l + 10.0,
            t + 16.0 * (i as f64 + 1.0),
            ser.name
        );
    }
    s + "</svg>\n"
}
