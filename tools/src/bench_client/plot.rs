//! PNG plots of every run in a result folder, overlaid: throughput vs concurrency, the
//! throughput–interactivity frontier, and, from the server's metrics, peak KV-cache usage
//! and the most sequences running vs concurrency.
//!
//! Text needs a TrueType font. plotters' `ab_glyph` backend ships none and a usable free
//! font (DejaVu Sans, 740 KB) is too large to commit, so one is read from the system
//! (`DCPSERVE_PLOT_FONT`, else the usual DejaVu / Liberation paths); without one the plots
//! are drawn without titles, axis labels and legends, and a warning says so.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::report::RunResult;

/// Fonts tried in order after `$DCPSERVE_PLOT_FONT`.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
];

/// Registers a system font as plotters' `sans-serif` once; false when none was found.
pub fn ensure_font() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let env = std::env::var("DCPSERVE_PLOT_FONT").ok();
        for path in env
            .iter()
            .map(String::as_str)
            .chain(FONT_PATHS.iter().copied())
        {
            let Ok(bytes) = std::fs::read(path) else {
                continue;
            };
            // plotters keeps fonts for the whole process: leaking the one file is intended.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
        eprintln!(
            "warning: no TrueType font found (install fonts-dejavu-core or set \
             DCPSERVE_PLOT_FONT=/path/to/font.ttf); plots are drawn without text"
        );
        false
    })
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart's titles.
pub struct ChartText<'a> {
    pub title: &'a str,
    pub x: &'a str,
    pub y: &'a str,
}

fn draw_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// Draws `series` as lines with points into a PNG at `path`; `text` false leaves out all
/// text (no font available). A logarithmic x axis suits concurrency sweeps.
pub fn line_chart(
    path: &Path,
    t: &ChartText,
    series: &[Series],
    log_x: bool,
    text: bool,
) -> Result<()> {
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .collect();
    if all.is_empty() {
        return Err(anyhow!("nothing to plot in {}", path.display()));
    }
    let (mut x0, mut x1) = all
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let y1 = all.iter().fold(0.0f64, |m, p| m.max(p.1)) * 1.1 + 1e-9;
    let log_x = log_x && x0 > 0.0;
    if log_x {
        (x0, x1) = (x0 / 1.3, x1 * 1.3);
    } else {
        // Pad by 5% (at least a little, for a single point), not below zero if all x are.
        let pad = ((x1 - x0) * 0.05).max(x1.abs() * 0.05).max(1e-9);
        let floor = if x0 >= 0.0 { 0.0 } else { f64::MIN };
        (x0, x1) = ((x0 - pad).max(floor), x1 + pad);
    }
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption(t.title, ("sans-serif", 24))
            .x_label_area_size(45)
            .y_label_area_size(70);
    }
    let y_range = 0.0..y1;
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart;
            let mut mesh = chart.configure_mesh();
            if text {
                mesh.x_desc(t.x).y_desc(t.y);
            }
            mesh.draw().map_err(draw_err)?;
            for (i, s) in series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let mut pts = s.points.clone();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(draw_err)?
                    .label(s.label.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                    .map_err(draw_err)?;
            }
            if text {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(draw_err)?;
            }
        }};
    }
    if log_x {
        finish!(builder
            .build_cartesian_2d((x0..x1).log_scale(), y_range)
            .map_err(draw_err)?);
    } else {
        finish!(builder
            .build_cartesian_2d(x0..x1, y_range)
            .map_err(draw_err)?);
    }
    root.present().map_err(draw_err)?;
    Ok(())
}

/// The x of a point on concurrency charts: the limit, or the most requests seen in
/// flight when there was none.
fn concurrency(p: &super::report::PointResult) -> f64 {
    p.max_concurrency.unwrap_or(p.max_in_flight) as f64
}

fn series_of(
    runs: &[RunResult],
    f: impl Fn(&super::report::PointResult) -> Option<(f64, f64)>,
) -> Vec<Series> {
    runs.iter()
        .map(|r| Series {
            label: r.label.clone(),
            points: r.points.iter().filter_map(&f).collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

/// Draws the charts of `runs` into `dir`; returns the files written.
pub fn plot_runs(dir: &Path, runs: &[RunResult]) -> Result<Vec<PathBuf>> {
    let text = ensure_font();
    let mut written = Vec::new();
    let mut chart = |name: &str, t: ChartText, series: Vec<Series>, log_x: bool| -> Result<()> {
        if series.is_empty() {
            return Ok(());
        }
        let path = dir.join(name);
        line_chart(&path, &t, &series, log_x, text)?;
        written.push(path);
        Ok(())
    };
    chart(
        "throughput_vs_concurrency.png",
        ChartText {
            title: "Output throughput vs concurrency",
            x: "max concurrency",
            y: "output tok/s",
        },
        series_of(runs, |p| {
            Some((concurrency(p), p.summary.output_throughput))
        }),
        true,
    )?;
    chart(
        "frontier.png",
        ChartText {
            title: "Throughput vs interactivity",
            x: "tok/s per user (1 / mean TPOT)",
            y: "output tok/s per rank",
        },
        series_of(runs, |p| {
            (p.summary.tok_s_per_user > 0.0).then_some((
                p.summary.tok_s_per_user,
                p.summary.output_throughput_per_rank,
            ))
        }),
        false,
    )?;
    chart(
        "kv_usage_vs_concurrency.png",
        ChartText {
            title: "Peak KV-cache usage vs concurrency",
            x: "max concurrency",
            y: "KV-cache usage, % (max over ranks and scrapes)",
        },
        series_of(runs, |p| {
            p.server.kv_usage_max.map(|u| (concurrency(p), u * 100.0))
        }),
        true,
    )?;
    chart(
        "running_vs_concurrency.png",
        ChartText {
            title: "Sequences running at once vs concurrency",
            x: "max concurrency",
            y: "most requests running (server's /metrics)",
        },
        series_of(runs, |p| p.server.running_max.map(|n| (concurrency(p), n))),
        true,
    )?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Vec<Series> {
        vec![
            Series {
                label: "a".into(),
                points: vec![(1.0, 10.0), (8.0, 50.0), (32.0, 80.0)],
            },
            Series {
                label: "b".into(),
                points: vec![(1.0, 12.0), (8.0, 40.0)],
            },
        ]
    }

    fn is_png(path: &Path) -> bool {
        let bytes = std::fs::read(path).unwrap();
        bytes.len() > 1000 && bytes.starts_with(b"\x89PNG\r\n\x1a\n")
    }

    const T: ChartText = ChartText {
        title: "t",
        x: "x",
        y: "y",
    };

    #[test]
    fn writes_a_png_without_text() {
        let dir = std::env::temp_dir().join(format!("bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notext.png");
        line_chart(&path, &T, &series(), true, false).unwrap();
        assert!(is_png(&path));
        line_chart(&dir.join("linear.png"), &T, &series(), false, false).unwrap();
        assert!(is_png(&dir.join("linear.png")));
        assert!(line_chart(&dir.join("empty.png"), &T, &[], false, false).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn writes_a_png_with_text_when_a_font_exists() {
        if !ensure_font() {
            eprintln!("no system font: the text variant is not exercised");
            return;
        }
        let dir = std::env::temp_dir().join(format!("bench-plot-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("text.png");
        line_chart(&path, &T, &series(), true, true).unwrap();
        assert!(is_png(&path));
        std::fs::remove_dir_all(&dir).ok();
    }
}
