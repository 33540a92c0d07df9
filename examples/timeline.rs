//! A timeline picture of a device trace (`doorbell::trace`'s Chrome trace
//! JSON), drawn with plotters: one row per traced block of each rank, a bar
//! per span coloured by what it is (producing, sending, waiting,
//! consuming), time in microseconds from the first event.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

/// One bar of the picture.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    /// Rank (the trace's process).
    pub rank: u64,
    /// Track in the rank (the trace's thread: a block).
    pub track: u64,
    /// Start, µs.
    pub start: f64,
    /// Length, µs.
    pub dur: f64,
    /// The span's name (`produce`, `put_signal`, `wait`, ...).
    pub name: String,
}

/// The spans (`"ph": "X"`) of a Chrome trace; `Err` names what is missing.
pub fn bars(trace: &serde_json::Value) -> Result<Vec<Bar>, String> {
    let events = trace["traceEvents"].as_array().ok_or("no traceEvents array: not a Chrome trace")?;
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let num = |k: &str| e[k].as_f64().ok_or_else(|| format!("a span without a numeric `{k}`: {e}"));
        out.push(Bar {
            rank: e["pid"].as_u64().ok_or_else(|| format!("a span without a pid: {e}"))?,
            track: e["tid"].as_u64().ok_or_else(|| format!("a span without a tid: {e}"))?,
            start: num("ts")?,
            dur: num("dur")?,
            name: e["name"].as_str().unwrap_or("?").to_string(),
        });
    }
    Ok(out)
}

/// The colour and legend of a span's name.
fn style(name: &str) -> (RGBColor, &'static str) {
    match name {
        "produce" => (RGBColor(0x2c, 0xa0, 0x2c), "producing"),
        "put" | "put_signal" | "get" | "signal" => (RGBColor(0x1f, 0x77, 0xb4), "sending"),
        "consume" => (RGBColor(0xff, 0x7f, 0x0e), "consuming"),
        _ => (RGBColor(0xc8, 0xc8, 0xc8), "waiting"),
    }
}

/// Draws `bars` (at most `max_tracks` rows per rank, the lowest-numbered
/// blocks) into a PNG of `width` pixels, with `title` above.
pub fn draw(bars: &[Bar], max_tracks: usize, title: &str, width: u32, png: &Path) -> Result<(), String> {
    crate::plot::register_font()?;
    let mut rows: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    let mut per_rank: BTreeMap<u64, usize> = BTreeMap::new();
    let mut tracks: Vec<(u64, u64)> = bars.iter().map(|b| (b.rank, b.track)).collect();
    tracks.sort_unstable();
    tracks.dedup();
    for t in tracks {
        let n = per_rank.entry(t.0).or_default();
        if *n < max_tracks {
            rows.insert(t, rows.len());
            *n += 1;
        }
    }
    if rows.is_empty() {
        return Err("the trace holds no spans".into());
    }
    let shown: Vec<&Bar> = bars.iter().filter(|b| rows.contains_key(&(b.rank, b.track))).collect();
    let t_end = shown.iter().map(|b| b.start + b.dur).fold(0.0, f64::max).max(1.0);
    let height = 120 + 26 * rows.len() as u32;
    let root = BitMapBackend::new(png, (width, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let n = rows.len() as f64;
    let labels: Vec<String> = rows.keys().map(|(r, t)| format!("rank {r} block {}", t / 2048)).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(130)
        .build_cartesian_2d(0.0..t_end, 0.0..n)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_x_mesh()
        .y_labels(0)
        .x_desc("µs from the first event")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    // Row names beside the rows (pixel positions from the chart's own mapping).
    for (i, label) in labels.iter().enumerate() {
        let (_, py) = chart.backend_coord(&(0.0, n - i as f64 - 0.5));
        root.draw(&Text::new(label.clone(), (14, py - 7), ("sans-serif", 13)))
            .map_err(|e| err(&e))?;
    }
    // Waits first, so the short sends and productions they surround stay visible.
    let mut order: Vec<&&Bar> = shown.iter().collect();
    order.sort_by_key(|b| style(&b.name).1 != "waiting");
    let mut legend: BTreeMap<&'static str, RGBColor> = BTreeMap::new();
    for b in order {
        let row = rows[&(b.rank, b.track)] as f64;
        let (color, what) = style(&b.name);
        legend.insert(what, color);
        let (y0, y1) = (n - row - 0.85, n - row - 0.15);
        let x1 = b.start + b.dur.max(t_end / width as f64);
        chart
            .draw_series(std::iter::once(Rectangle::new([(b.start, y0), (x1, y1)], color.filled())))
            .map_err(|e| err(&e))?;
    }
    for (what, color) in legend {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(|e| err(&e))?
            .label(what)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_read_and_a_picture_is_drawn() {
        let trace = serde_json::json!({"traceEvents": [
            {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}},
            {"name": "produce", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 5.0},
            {"name": "put_signal", "ph": "X", "pid": 0, "tid": 0, "ts": 5.0, "dur": 1.0},
            {"name": "wait", "ph": "X", "pid": 1, "tid": 2048, "ts": 1.0, "dur": 4.0},
            {"name": "doorbell", "ph": "i", "pid": 1, "tid": 2048, "ts": 2.0},
        ]});
        let b = bars(&trace).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!((b[2].rank, b[2].track, b[2].start, b[2].dur), (1, 2048, 1.0, 4.0));
        let png = std::env::temp_dir().join(format!("doorbell-timeline-{}.png", std::process::id()));
        draw(&b, 4, "test", 640, &png).unwrap();
        assert!(std::fs::metadata(&png).unwrap().len() > 1000);
        let _ = std::fs::remove_file(png);
        assert!(bars(&serde_json::json!({"x": 1})).is_err());
        assert!(draw(&[], 4, "empty", 640, Path::new("/nonexistent/x.png")).is_err());
    }
}
