//! Charts of a run, as SVG or PNG by the file's extension: throughput over
//! time, the latency CDF, or throughput across a size sweep.
//!
//! Text needs a TrueType font, read at run time: the file named by
//! `UNIPLANE_BENCH_FONT`, or DejaVu Sans or Liberation Sans where Linux
//! distributions install them (Debian: `fonts-dejavu-core`, which the
//! `fontconfig` package brings).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

/// Why a chart was not drawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The file name ends neither in `.svg` nor in `.png`.
    #[error("`{0}`: plots are .svg or .png")]
    UnknownFormat(PathBuf),
    /// No font was found for the labels.
    #[error("no TrueType font for plot labels: install fonts-dejavu-core or set UNIPLANE_BENCH_FONT to a .ttf file")]
    NoFont,
    /// Nothing to draw.
    #[error("nothing to plot: {0}")]
    NoData(&'static str),
    /// The backend failed (for example, the file could not be written).
    #[error("drawing {path}: {why}")]
    Draw {
        /// The output file.
        path: PathBuf,
        /// The backend's error.
        why: String,
    },
}

/// What to draw.
#[derive(Clone, Copy, Debug)]
pub enum Chart<'a> {
    /// Received Mpps per interval: (seconds since start, Mpps).
    Throughput(&'a [(f64, f64)]),
    /// Cumulative distribution of latency: (ns, fraction at or below).
    LatencyCdf {
        /// Axis label (`one-way latency`, `round-trip time`).
        what: &'a str,
        /// The points.
        points: &'a [(u64, f64)],
    },
    /// Per size: (payload bytes, Mpps, Mbit/s at L2).
    SizeSweep(&'a [(f64, f64, f64)]),
    /// Several named lines with markers on linear axes from 0 (a figure
    /// per port, ours beside a reference).
    Points {
        /// The chart's title.
        title: &'a str,
        /// The x axis label.
        x_label: &'a str,
        /// The y axis label.
        y_label: &'a str,
        /// The lines: (x, y) points.
        lines: &'a [(&'a str, Vec<(f64, f64)>)],
    },
    /// One horizontal bar per row: ours ÷ the peer (1 is the peer's
    /// figure), labelled with both figures; green where the row meets its
    /// target, red where it does not, grey without one.
    Ratios {
        /// The chart's title.
        title: &'a str,
        /// The rows: (label with both figures, ratio, target met).
        rows: &'a [(String, f64, Option<bool>)],
    },
    /// Cumulative distributions of latency, one named line each (ours and
    /// the peer's): (ns, fraction at or below).
    Cdfs {
        /// Axis label (`round-trip time`).
        what: &'a str,
        /// The lines.
        lines: &'a [(&'a str, Vec<(u64, f64)>)],
    },
    /// Several named lines over time: (seconds, value) each.
    Lines {
        /// The chart's title.
        title: &'a str,
        /// The value axis label.
        y_label: &'a str,
        /// The lines.
        lines: &'a [(&'a str, Vec<(f64, f64)>)],
    },
    /// Several named lines on logarithmic axes (latency against size).
    LogLog {
        /// The chart's title.
        title: &'a str,
        /// The x axis label.
        x_label: &'a str,
        /// The y axis label.
        y_label: &'a str,
        /// The lines: (x, y) points, both positive.
        lines: &'a [(&'a str, Vec<(f64, f64)>)],
    },
}

const FONT: &str = "sans-serif";

/// Places Linux distributions install a plain sans-serif TrueType font.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// The font file plots would use, if any.
pub fn font_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("UNIPLANE_BENCH_FONT") {
        return Some(PathBuf::from(p));
    }
    FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

fn ensure_font() -> Result<(), PlotError> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let ok = *LOADED.get_or_init(|| {
        let Some(bytes) = font_path().and_then(|p| std::fs::read(p).ok()) else {
            return false;
        };
        // The font table keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::NoFont)
    }
}

/// Draws `chart` into `path` (800×500 pixels).
pub fn draw(path: &Path, chart: &Chart<'_>) -> Result<(), PlotError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let fail = |e: String| PlotError::Draw {
        path: path.to_owned(),
        why: e,
    };
    match ext.as_deref() {
        Some("svg") => {
            ensure_font()?;
            let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
            render(&root, chart).map_err(fail)?;
            root.present().map_err(|e| fail(e.to_string()))
        }
        Some("png") => {
            ensure_font()?;
            let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
            render(&root, chart).map_err(fail)?;
            root.present().map_err(|e| fail(e.to_string()))
        }
        _ => Err(PlotError::UnknownFormat(path.to_owned())),
    }
}

/// A chart builder with the caption, margin and axis room every chart uses.
fn framed<'a, 'b, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    caption: impl AsRef<str>,
) -> ChartBuilder<'a, 'b, DB> {
    let mut b = ChartBuilder::on(root);
    b.caption(caption, (FONT, 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60);
    b
}

fn render<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &Chart<'_>,
) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    match *chart {
        Chart::Throughput(points) => {
            if points.is_empty() {
                return Err("no per-second samples (run at least a second)".into());
            }
            let x_max = points.iter().map(|p| p.0).fold(1.0, f64::max);
            let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max) * 1.15 + 1e-9;
            let mut c = framed(root, "Throughput over time")
                .build_cartesian_2d(0.0..x_max, 0.0..y_max)
                .map_err(e)?;
            c.configure_mesh()
                .x_desc("seconds")
                .y_desc("Mpps received")
                .draw()
                .map_err(e)?;
            c.draw_series(LineSeries::new(points.iter().copied(), &BLUE))
                .map_err(e)?;
            c.draw_series(points.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
                .map_err(e)?;
        }
        Chart::LatencyCdf { what, points } => {
            if points.is_empty() {
                return Err("no latency recorded".into());
            }
            let lo = points.first().map(|p| p.0).unwrap_or(1).max(1) as f64 / 1e3;
            let hi = points.last().map(|p| p.0).unwrap_or(1).max(2) as f64 / 1e3;
            let (lo, hi) = (lo * 0.9, hi * 1.1);
            let mut c = framed(root, format!("CDF of {what}"))
                .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
                .map_err(e)?;
            c.configure_mesh()
                .x_desc(format!("{what}, µs (log scale)"))
                .y_desc("fraction at or below")
                .draw()
                .map_err(e)?;
            c.draw_series(LineSeries::new(
                points.iter().map(|&(ns, f)| (ns as f64 / 1e3, f)),
                &RED,
            ))
            .map_err(e)?;
        }
        Chart::Points {
            title,
            x_label,
            y_label,
            lines,
        } => {
            let all = || lines.iter().flat_map(|(_, v)| v.iter());
            if all().next().is_none() {
                return Err("no points".into());
            }
            let x_min = all().map(|p| p.0).fold(f64::MAX, f64::min);
            let x_max = all().map(|p| p.0).fold(f64::MIN, f64::max);
            let pad = ((x_max - x_min) * 0.05).max(0.5);
            let y_max = all().map(|p| p.1).fold(0.0, f64::max) * 1.15 + 1e-9;
            let mut c = framed(root, title)
                .build_cartesian_2d(x_min - pad..x_max + pad, 0.0..y_max)
                .map_err(e)?;
            c.configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(e)?;
            for (i, (name, points)) in lines.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                c.draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(e)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
                c.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(e)?;
            }
            c.configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(e)?;
        }
        Chart::Ratios { title, rows } => {
            if rows.is_empty() {
                return Err("no rows".into());
            }
            let n = rows.len() as f64;
            let x_max = rows.iter().map(|r| r.1).fold(1.0, f64::max) * 1.6;
            let mut c = framed(root, title)
                .build_cartesian_2d(0.0..x_max, 0.0..n)
                .map_err(e)?;
            c.configure_mesh()
                .disable_y_mesh()
                .y_labels(0)
                .x_desc("ours ÷ peer (÷ target where a row has no peer); 1 = the peer")
                .draw()
                .map_err(e)?;
            for (i, (label, ratio, met)) in rows.iter().enumerate() {
                let y = n - i as f64 - 1.0;
                let color = match met {
                    Some(true) => GREEN.mix(0.6),
                    Some(false) => RED.mix(0.6),
                    None => BLACK.mix(0.3),
                };
                c.draw_series(std::iter::once(Rectangle::new(
                    [(0.0, y + 0.15), (ratio.max(0.0), y + 0.55)],
                    color.filled(),
                )))
                .map_err(e)?;
                c.draw_series(std::iter::once(Text::new(
                    label.clone(),
                    (x_max * 0.01, y + 0.9),
                    (FONT, 13).into_font(),
                )))
                .map_err(e)?;
            }
            c.draw_series(LineSeries::new(
                [(1.0, 0.0), (1.0, n)],
                BLACK.stroke_width(1),
            ))
            .map_err(e)?;
        }
        Chart::Cdfs { what, lines } => {
            let all = || lines.iter().flat_map(|(_, v)| v.iter());
            if all().next().is_none() {
                return Err("no latency recorded".into());
            }
            let lo = all().map(|p| p.0.max(1)).min().unwrap_or(1) as f64 / 1e3;
            let hi = all().map(|p| p.0.max(2)).max().unwrap_or(2) as f64 / 1e3;
            let mut c = framed(root, format!("CDF of {what}"))
                .build_cartesian_2d((lo * 0.9..hi * 1.1).log_scale(), 0.0..1.0)
                .map_err(e)?;
            c.configure_mesh()
                .x_desc(format!("{what}, µs (log scale)"))
                .y_desc("fraction at or below")
                .draw()
                .map_err(e)?;
            for (i, (name, points)) in lines.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                c.draw_series(LineSeries::new(
                    points.iter().map(|&(ns, f)| (ns.max(1) as f64 / 1e3, f)),
                    color.stroke_width(2),
                ))
                .map_err(e)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
            c.configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(e)?;
        }
        Chart::Lines {
            title,
            y_label,
            lines,
        } => {
            let all = || lines.iter().flat_map(|(_, v)| v.iter());
            if all().next().is_none() {
                return Err("no samples".into());
            }
            let x_max = all().map(|p| p.0).fold(1e-9, f64::max);
            let y_max = all().map(|p| p.1).fold(0.0, f64::max) * 1.15 + 1e-9;
            let mut c = framed(root, title)
                .build_cartesian_2d(0.0..x_max, 0.0..y_max)
                .map_err(e)?;
            c.configure_mesh()
                .x_desc("seconds")
                .y_desc(y_label)
                .draw()
                .map_err(e)?;
            for (i, (name, points)) in lines.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                c.draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(e)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(e)?;
        }
        Chart::LogLog {
            title,
            x_label,
            y_label,
            lines,
        } => {
            let all = || {
                lines
                    .iter()
                    .flat_map(|(_, v)| v.iter())
                    .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            };
            if all().next().is_none() {
                return Err("no samples".into());
            }
            let (x_min, x_max) =
                all().fold((f64::MAX, 0.0f64), |(a, b), p| (a.min(p.0), b.max(p.0)));
            let (y_min, y_max) =
                all().fold((f64::MAX, 0.0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
            let mut c = framed(root, title)
                .build_cartesian_2d(
                    (x_min..x_max * 1.1).log_scale(),
                    (y_min * 0.8..y_max * 1.25).log_scale(),
                )
                .map_err(e)?;
            c.configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(e)?;
            for (i, (name, points)) in lines.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                c.draw_series(LineSeries::new(
                    points.iter().copied().filter(|p| p.0 > 0.0 && p.1 > 0.0),
                    color.stroke_width(2),
                ))
                .map_err(e)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(e)?;
        }
        Chart::SizeSweep(points) => {
            if points.is_empty() {
                return Err("no sweep points".into());
            }
            let x_max = points.iter().map(|p| p.0).fold(1.0, f64::max) * 1.05;
            let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max) * 1.15 + 1e-9;
            let y2_max = points.iter().map(|p| p.2).fold(0.0, f64::max) * 1.15 + 1e-9;
            let mut c = framed(root, "Throughput by payload size")
                .right_y_label_area_size(70)
                .build_cartesian_2d(0.0..x_max, 0.0..y_max)
                .map_err(e)?
                .set_secondary_coord(0.0..x_max, 0.0..y2_max);
            c.configure_mesh()
                .x_desc("payload bytes")
                .y_desc("Mpps (blue)")
                .draw()
                .map_err(e)?;
            c.configure_secondary_axes()
                .y_desc("Mbit/s at L2 (red)")
                .draw()
                .map_err(e)?;
            c.draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.1)), &BLUE))
                .map_err(e)?;
            c.draw_series(
                points
                    .iter()
                    .map(|p| Circle::new((p.0, p.1), 3, BLUE.filled())),
            )
            .map_err(e)?;
            c.draw_secondary_series(LineSeries::new(points.iter().map(|p| (p.0, p.2)), &RED))
                .map_err(e)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_extension_is_refused() {
        let e = draw(Path::new("x.gif"), &Chart::Throughput(&[(1.0, 1.0)])).unwrap_err();
        assert!(matches!(e, PlotError::UnknownFormat(_)));
    }
}
