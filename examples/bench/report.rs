//! A benchmark's report: its text table, the files it writes (JSON, CSV)
//! and its figure (bandwidth beside latency).

use std::path::{Path, PathBuf};

use doorbell_examples::plot::{write_charts, Chart, Series, YScale};
use doorbell_examples::{ratio, BoxError};

/// One column: its heading, its width (cells are right-aligned to it; 0:
/// no padding) and what goes before it.
struct Column {
    heading: String,
    width: usize,
    sep: &'static str,
}

/// A text table of right-aligned columns, as nccl-tests prints them: a
/// heading line and one line per row, every column padded to its width.
#[derive(Default)]
pub struct Table {
    head_prefix: &'static str,
    row_prefix: &'static str,
    columns: Vec<Column>,
    next_sep: Option<&'static str>,
}

impl Table {
    /// A table with nothing before its lines.
    pub fn new() -> Table {
        Table::default()
    }

    /// What starts the heading line (e.g. `"# "`) and each row (`"  "`).
    pub fn prefixes(mut self, head: &'static str, row: &'static str) -> Table {
        self.head_prefix = head;
        self.row_prefix = row;
        self
    }

    /// Adds a column `width` wide; columns are separated by one space.
    pub fn col(mut self, heading: &str, width: usize) -> Table {
        let sep = if self.columns.is_empty() {
            ""
        } else {
            self.next_sep.take().unwrap_or(" ")
        };
        self.columns.push(Column {
            heading: heading.to_string(),
            width,
            sep,
        });
        self
    }

    /// Separates the next column from the one before by ` | ` (a group).
    pub fn bar(mut self) -> Table {
        self.next_sep = Some(" | ");
        self
    }

    fn line(&self, prefix: &str, cells: impl Iterator<Item = String>) -> String {
        let mut s = prefix.to_string();
        for (c, text) in self.columns.iter().zip(cells) {
            s += c.sep;
            s += &format!("{text:>w$}", w = c.width);
        }
        s
    }

    /// The heading line.
    pub fn heading(&self) -> String {
        self.line(self.head_prefix, self.columns.iter().map(|c| c.heading.clone()))
    }

    /// One row of already formatted cells, one per column (missing cells
    /// are blank; extra ones are dropped).
    pub fn row<S: AsRef<str>>(&self, cells: &[S]) -> String {
        let cells = cells.iter().map(|c| c.as_ref().to_string()).chain(std::iter::repeat(String::new()));
        self.line(self.row_prefix, cells)
    }
}

fn create_dir(dir: &Path) -> Result<(), BoxError> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()).into())
}

/// Writes `text` to `dir/name` (creating `dir`); returns the path. Errors
/// name the path.
pub fn write_text(dir: &Path, name: &str, text: &str) -> Result<PathBuf, BoxError> {
    create_dir(dir)?;
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// Writes `value` as pretty JSON and a newline to `dir/name`; returns the path.
pub fn write_json(dir: &Path, name: &str, value: &impl serde::Serialize) -> Result<PathBuf, BoxError> {
    write_text(dir, name, &(serde_json::to_string_pretty(value)? + "\n"))
}

/// Writes `dir/<stem>.png` and `.svg`: `bandwidth` (y linear from 0) with
/// a latency chart beside it (µs on a log y axis, the same x axis and
/// title, the lines of `latency`). Returns both paths.
pub fn write_figure(dir: &Path, stem: &str, bandwidth: &Chart, latency: &[Series]) -> Result<(PathBuf, PathBuf), BoxError> {
    create_dir(dir)?;
    let title = format!("{}: time", bandwidth.title);
    let lat = Chart {
        title: &title,
        x_label: bandwidth.x_label,
        y_label: "time (us, log scale)",
        series: latency,
    };
    let (png, svg) = (dir.join(format!("{stem}.png")), dir.join(format!("{stem}.svg")));
    write_charts(&[(bandwidth, YScale::Linear), (&lat, YScale::Log)], &png, &svg)?;
    Ok((png, svg))
}

/// `v` with `prec` decimals, or `n/a` for none (a table's cell).
pub fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.prec$}"))
}

/// Writes `dir/<stem>.png` and `.svg` from times: each of `times` is a line
/// of (bytes, µs) points, drawn as bandwidth (GB/s = bytes / µs / 1e3; NaN
/// where the time is not positive) titled `title` over x `x_label`, beside
/// the times themselves ([`write_figure`]). Returns both paths.
pub fn write_times_figure(dir: &Path, stem: &str, title: &str, x_label: &str, times: &[Series]) -> Result<(PathBuf, PathBuf), BoxError> {
    let bandwidth: Vec<Series> = times
        .iter()
        .map(|s| Series {
            name: s.name,
            points: s
                .points
                .iter()
                .map(|&(b, us)| (b, ratio(b, us * 1e3).unwrap_or(f64::NAN)))
                .collect(),
        })
        .collect();
    let chart = Chart {
        title,
        x_label,
        y_label: "GB/s",
        series: &bandwidth,
    };
    write_figure(dir, stem, &chart, times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_like_format_strings() {
        let t = Table::new().col("size(B)", 12).col("type", 6).col("time(us)", 12);
        assert_eq!(t.heading(), format!("{:>12} {:>6} {:>12}", "size(B)", "type", "time(us)"));
        assert_eq!(
            t.row(&["4096".to_string(), "uint8".into(), format!("{:.2}", 1.234)]),
            format!("{:>12} {:>6} {:>12.2}", 4096, "uint8", 1.234)
        );
        let g = Table::new()
            .prefixes("# ", "  ")
            .col("size", 4)
            .bar()
            .col("a", 3)
            .bar()
            .col("rest", 0);
        assert_eq!(g.heading(), "# size |   a | rest");
        assert_eq!(g.row(&["8", "1"]), "     8 |   1 | ");
        assert_eq!((fmt_opt(Some(1.234), 2), fmt_opt(None, 2)), ("1.23".to_string(), "n/a".to_string()));
    }

    #[test]
    fn files_land_in_the_directory_they_name() {
        let dir = std::env::temp_dir()
            .join(format!("doorbell-bench-test-{}", std::process::id()))
            .join("out");
        let p = write_json(&dir, "r.json", &serde_json::json!({"a": 1})).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\n  \"a\": 1\n}\n");
        let series = [Series {
            name: "x",
            points: vec![(1024.0, 2.0), (4096.0, 8.0)],
        }];
        let chart = Chart {
            title: "t",
            x_label: "bytes",
            y_label: "GB/s",
            series: &series,
        };
        let (png, svg) = write_figure(&dir, "fig", &chart, &series).unwrap();
        assert!(png.exists() && std::fs::read_to_string(svg).unwrap().contains("time (us, log scale)"));
        let (png, _) = write_times_figure(&dir, "times", "t", "bytes", &series).unwrap();
        assert!(png.exists());
        let blocked = p.join("sub");
        assert!(write_text(&blocked, "x", "").unwrap_err().to_string().contains("creating"));
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
}
