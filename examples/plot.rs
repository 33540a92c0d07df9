//! Line charts of benchmark results, as PNG and SVG, drawn with plotters.
//! Text uses DejaVu Sans bundled in the binary (the `dejavu` crate through
//! plotters' `ab_glyph` backend), so no system fonts or fontconfig are
//! needed.

use std::path::Path;

use plotters::prelude::*;

/// One line of a chart.
pub struct Series<'a> {
    /// Legend text.
    pub name: &'a str,
    /// (x, y) points; x > 0 (the x axis is logarithmic).
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels, lines.
pub struct Chart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// x axis label (the x axis is log scale).
    pub x_label: &'a str,
    /// y axis label (linear from 0).
    pub y_label: &'a str,
    /// The lines.
    pub series: &'a [Series<'a>],
}

fn register_font() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the bundled DejaVu Sans font could not be loaded".to_string())
    })
    .clone()
}

const COLORS: [RGBColor; 5] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
];

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, chart: &Chart) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let xs = chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).filter(|x| *x > 0.0);
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0 <= x1 { (x0, x1.max(x0 * 2.0)) } else { (1.0, 2.0) };
    let y1 = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| y.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x0..x1).log_scale(), 0.0..y1)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_label_formatter(&|x| human_bytes(*x))
        .draw()
        .map_err(e)?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(|(x, y)| *x > 0.0 && y.is_finite()).collect();
        c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(e)?
            .label(s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// `1K`, `4M`, `1G`, ... for a byte count.
pub fn human_bytes(x: f64) -> String {
    let units = [(1u64 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (u, s) in units {
        if x >= u as f64 {
            return format!("{}{s}", (x / u as f64 * 10.0).round() / 10.0);
        }
    }
    format!("{x}")
}

/// Writes `chart` to `png` and `svg`.
pub fn write_chart(chart: &Chart, png: &Path, svg: &Path) -> Result<(), String> {
    register_font()?;
    let size = (900, 520);
    draw(BitMapBackend::new(png, size).into_drawing_area(), chart).map_err(|e| format!("{}: {e}", png.display()))?;
    draw(SVGBackend::new(svg, size).into_drawing_area(), chart).map_err(|e| format!("{}: {e}", svg.display()))
}
