//! Line charts of benchmark results, as PNG and SVG, drawn with plotters.
//! Text uses DejaVu Sans bundled in the binary (the `dejavu` crate through
//! plotters' `ab_glyph` backend), so no system fonts or fontconfig are
//! needed. The x axis (bytes) is logarithmic with ticks at powers of two
//! (`1K`, `64K`, `1M`); a figure may hold several charts side by side
//! (bandwidth beside latency).

use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
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

/// How a chart's y axis maps values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YScale {
    /// Linear from 0 (bandwidths).
    Linear,
    /// Logarithmic over the positive values (latencies spanning decades).
    Log,
}

pub fn register_font() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the bundled DejaVu Sans font could not be loaded".to_string())
    })
    .clone()
}

const COLORS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// The most x ticks a chart shows; longer sweeps label every 2nd, 4th, ...
/// power of two.
const MAX_TICKS: usize = 16;

/// Tick positions for a log x axis over `x0..=x1`: the powers of two in the
/// range, every one or every 2nd, 4th, 5th or 10th (exponents that are
/// multiples of the step) so that at most 16 remain. Empty when
/// no power of two lies in the range or it is not a positive range.
pub fn pow2_ticks(x0: f64, x1: f64) -> Vec<f64> {
    if !(x0 > 0.0 && x1 >= x0 && x1.is_finite()) {
        return Vec::new();
    }
    let (lo, hi) = (x0.log2().ceil() as i32, x1.log2().floor() as i32);
    if lo > hi {
        return Vec::new();
    }
    let count = (hi - lo + 1) as usize;
    let step = [1, 2, 4, 5, 10, 20]
        .into_iter()
        .find(|s| count.div_ceil(*s) <= MAX_TICKS)
        .unwrap_or(32);
    (lo..=hi).filter(|e| e.rem_euclid(step as i32) == 0).map(|e| 2f64.powi(e)).collect()
}

/// Tick positions for a log y axis over `lo..=hi`: 1, 2 and 5 times the
/// powers of ten in the range (only the powers of ten when those are more
/// than 16); a range holding fewer than two of them gets its
/// ends and their geometric mean, to two significant digits. Empty for a
/// range that is not positive and finite.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi >= lo && hi.is_finite()) {
        return Vec::new();
    }
    let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let in_range = |mults: &[f64]| -> Vec<f64> {
        (e0..=e1)
            .flat_map(|e| mults.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|t| (lo..=hi).contains(t))
            .collect()
    };
    let ticks = in_range(&[1.0, 2.0, 5.0]);
    if ticks.len() > MAX_TICKS {
        return in_range(&[1.0]);
    }
    if ticks.len() >= 2 {
        return ticks;
    }
    let two_digits = |x: f64| {
        let scale = 10f64.powi(x.log10().floor() as i32 - 1);
        (x / scale).round() * scale
    };
    let mut v: Vec<f64> = [lo, (lo * hi).sqrt(), hi]
        .into_iter()
        .map(two_digits)
        .filter(|t| (lo..=hi).contains(t))
        .collect();
    v.dedup();
    v
}

/// The label of a byte count on an axis: `8`, `1K`, `64K`, `1M`, `4G` for
/// whole multiples of a unit (every power of two), else one decimal of the
/// largest unit below it (`1.5K`).
pub fn human_bytes(x: f64) -> String {
    let units = [(1u64 << 40, "T"), (1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (u, s) in units {
        if x >= u as f64 {
            return format!("{}{s}", (x / u as f64 * 10.0).round() / 10.0);
        }
    }
    format!("{}", (x * 10.0).round() / 10.0)
}

/// A y value with at most three decimals and no trailing zeros (`0.25`, `12`, `1500`).
fn plain_number(y: f64) -> String {
    let s = format!("{y:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// The x range over every series' positive x, widened to at least a
/// factor of two.
fn x_range(chart: &Chart) -> (f64, f64) {
    let xs = chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).filter(|x| *x > 0.0);
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    if x0 <= x1 {
        (x0, x1.max(x0 * 2.0))
    } else {
        (1.0, 2.0)
    }
}

/// The finite y values of every series, `> 0` where `positive`.
fn ys<'a>(chart: &'a Chart, positive: bool) -> impl Iterator<Item = f64> + 'a {
    chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(move |y| y.is_finite() && (!positive || *y > 0.0))
}

/// Draws `chart` on `area` with the y axis `y` (a plotters range spec).
fn panel<DB, Y>(area: &DrawingArea<DB, Shift>, chart: &Chart, y: Y) -> Result<(), String>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let (x0, x1) = x_range(chart);
    let x = (x0..x1).log_scale().with_key_points(pow2_ticks(x0, x1));
    let mut c = ChartBuilder::on(area)
        .caption(chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_label_formatter(&|x| human_bytes(*x))
        .y_label_formatter(&|y| plain_number(*y))
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
    Ok(())
}

/// Draws the charts side by side on `root`, left to right.
fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, charts: &[(&Chart, YScale)]) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    for (area, (chart, scale)) in root.split_evenly((1, charts.len().max(1))).iter().zip(charts) {
        match scale {
            YScale::Linear => {
                let y1 = ys(chart, false).fold(0.0f64, f64::max).max(1e-9) * 1.1;
                panel(area, chart, 0.0..y1)?;
            }
            YScale::Log => {
                let (lo, hi) = ys(chart, true).fold((f64::MAX, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
                let (lo, hi) = if lo <= hi { (lo / 1.25, hi * 1.25) } else { (0.1, 1.0) };
                panel(area, chart, (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)))?;
            }
        }
    }
    root.present().map_err(e)
}

/// Width of one chart in pixels (a figure of n charts is n times as wide).
const CHART_SIZE: (u32, u32) = (900, 520);

/// Writes `chart` (linear y from 0) to `png` and `svg`.
pub fn write_chart(chart: &Chart, png: &Path, svg: &Path) -> Result<(), String> {
    write_charts(&[(chart, YScale::Linear)], png, svg)
}

/// Writes the charts side by side, left to right (e.g. bandwidth with a
/// linear y beside latency with a log y), to `png` and `svg`. No charts is
/// an error.
pub fn write_charts(charts: &[(&Chart, YScale)], png: &Path, svg: &Path) -> Result<(), String> {
    if charts.is_empty() {
        return Err(format!("{}: no charts to draw", png.display()));
    }
    register_font()?;
    let size = (CHART_SIZE.0 * charts.len() as u32, CHART_SIZE.1);
    draw(BitMapBackend::new(png, size).into_drawing_area(), charts).map_err(|e| format!("{}: {e}", png.display()))?;
    draw(SVGBackend::new(svg, size).into_drawing_area(), charts).map_err(|e| format!("{}: {e}", svg.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(x0: f64, x1: f64) -> Vec<String> {
        pow2_ticks(x0, x1).iter().map(|x| human_bytes(*x)).collect()
    }

    #[test]
    fn ticks_are_powers_of_two_with_short_labels() {
        assert_eq!(
            labels(1024.0, 1048576.0),
            ["1K", "2K", "4K", "8K", "16K", "32K", "64K", "128K", "256K", "512K", "1M"]
        );
        assert_eq!(labels(4096.0, 65536.0), ["4K", "8K", "16K", "32K", "64K"]);
        // 8 B .. 1 GiB: 28 powers, every 2nd.
        let l = labels(8.0, (1u64 << 30) as f64);
        assert_eq!(l.first().map(String::as_str), Some("16"));
        assert_eq!(l.last().map(String::as_str), Some("1G"));
        assert!(
            l.len() <= MAX_TICKS && l.contains(&"64K".to_string()) && l.contains(&"1M".to_string()),
            "{l:?}"
        );
        // A range between two powers of two has none; bad ranges have none.
        assert!(pow2_ticks(5.0, 7.0).is_empty());
        assert!(pow2_ticks(0.0, 8.0).is_empty() && pow2_ticks(8.0, 4.0).is_empty() && pow2_ticks(1.0, f64::INFINITY).is_empty());
        // Every tick is an exact power of two inside the range.
        for t in pow2_ticks(3.0, 1e12) {
            assert!((3.0..=1e12).contains(&t) && (t as u64).is_power_of_two(), "{t}");
        }
    }

    #[test]
    fn log_ticks_are_one_two_five_and_never_empty_for_a_real_range() {
        assert_eq!(log_ticks(0.8, 60.0), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
        let wide = log_ticks(0.01, 1e9);
        assert_eq!(wide.first().copied(), Some(0.01));
        assert!(
            wide.len() <= MAX_TICKS && wide.iter().all(|t| (t.log10().round() - t.log10()).abs() < 1e-9),
            "{wide:?}"
        );
        // No 1-2-5 value inside: the ends and the middle, rounded inward.
        let tight = log_ticks(2.1, 4.9);
        assert!(tight.len() >= 2 && tight.iter().all(|t| (2.1..=4.9).contains(t)), "{tight:?}");
        assert!(log_ticks(0.0, 1.0).is_empty() && log_ticks(2.0, 1.0).is_empty());
    }

    #[test]
    fn byte_labels_are_exact_for_whole_units() {
        for (x, want) in [
            (8.0, "8"),
            (512.0, "512"),
            (1024.0, "1K"),
            (65536.0, "64K"),
            (1048576.0, "1M"),
            (1536.0, "1.5K"),
            ((4u64 << 30) as f64, "4G"),
            ((1u64 << 40) as f64, "1T"),
        ] {
            assert_eq!(human_bytes(x), want);
        }
        assert_eq!(plain_number(0.25), "0.25");
        assert_eq!(plain_number(12.0), "12");
        assert_eq!(plain_number(1500.0), "1500");
    }

    #[test]
    fn figures_are_written_and_empty_ones_refused() {
        let dir = std::env::temp_dir().join(format!("doorbell-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (png, svg) = (dir.join("t.png"), dir.join("t.svg"));
        let series = [Series {
            name: "a",
            points: vec![(8.0, 1.0), (1024.0, 10.0), (1048576.0, 100.0)],
        }];
        let chart = Chart {
            title: "t",
            x_label: "bytes",
            y_label: "GB/s",
            series: &series,
        };
        write_charts(&[(&chart, YScale::Linear), (&chart, YScale::Log)], &png, &svg).unwrap();
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            svg_text.contains("\n1K\n") && svg_text.contains("\n1M\n") && !svg_text.contains("976.6K"),
            "ticks"
        );
        assert!(std::fs::metadata(&png).unwrap().len() > 1000);
        assert!(write_charts(&[], &png, &svg).unwrap_err().contains("no charts"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
