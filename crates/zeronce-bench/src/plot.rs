//! `--plot FILE.svg` (`plotters`, SVG backend only): resident memory over time as a line
//! chart, one line per series, with the moments that explain it (free, report) marked as
//! vertical lines; and ratios as horizontal bars, ours beside a published figure.

use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// One line: a name and (seconds, MiB) points.
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// (seconds since start, resident MiB).
    pub points: Vec<(f64, f64)>,
}

/// A moment worth marking: seconds since start and what happened.
pub struct Mark {
    /// Seconds since start.
    pub at: f64,
    /// What happened ("freed", "reported").
    pub what: String,
}

const COLORS: [RGBColor; 4] = [BLUE, RED, GREEN, MAGENTA];

/// The value parser of `--plot`: checks before anything runs that the file can be
/// written (its directory exists and is writable, the path is not a directory), so a
/// long run does not fail at its end.
pub fn writable_path(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    if path.is_dir() {
        return Err(format!(
            "{text} is a directory; give a file name like {text}/plot.svg"
        ));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "cannot write {text}: directory {} does not exist",
            dir.display()
        ));
    }
    rustix::fs::access(dir, rustix::fs::Access::WRITE_OK)
        .map_err(|e| format!("cannot write {text}: directory {}: {e}", dir.display()))?;
    Ok(path)
}

/// Draws `series` and `marks` into the SVG file `path`; the error names the file.
pub fn resident_over_time(
    path: &Path,
    title: &str,
    series: &[Series],
    marks: &[Mark],
) -> Result<(), Box<dyn std::error::Error>> {
    draw(path, title, series, marks).map_err(|e| format!("--plot {}: {e}", path.display()).into())
}

fn draw(
    path: &Path,
    title: &str,
    series: &[Series],
    marks: &[Mark],
) -> Result<(), Box<dyn std::error::Error>> {
    let points = || series.iter().flat_map(|s| s.points.iter());
    let x_end = points()
        .map(|p| p.0)
        .chain(marks.iter().map(|m| m.at))
        .fold(0.1f64, f64::max);
    let y_end = points().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_end * 1.02, 0.0..y_end)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("resident MiB")
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    for m in marks {
        chart.draw_series(LineSeries::new(
            [(m.at, 0.0), (m.at, y_end)],
            BLACK.mix(0.4),
        ))?;
        chart.draw_series(std::iter::once(Text::new(
            m.what.clone(),
            (m.at, y_end * 0.97),
            ("sans-serif", 13),
        )))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One bar pair: a figure, our ratio and a reference (published, or a target); either
/// may be missing.
pub struct RatioRow {
    /// What the ratio is.
    pub label: String,
    /// Ours, measured in this run (`None`: skipped).
    pub ours: Option<f64>,
    /// The reference figure, when there is a number.
    pub reference: Option<f64>,
    /// What stands instead of a missing reference ("16 s → negligible").
    pub reference_text: String,
}

/// The names of a [`ratio_bars`] chart's two bars.
pub struct Legend {
    /// Our bar's name ("ours (this run)").
    pub ours: &'static str,
    /// The reference bar's name ("published").
    pub reference: &'static str,
}

/// Draws `rows` as horizontal bar pairs (ours, the reference) into the SVG file `path`,
/// with the value at the end of every bar and what stands instead where one is missing.
pub fn ratio_bars(
    path: &Path,
    title: &str,
    legend: &Legend,
    rows: &[RatioRow],
) -> Result<(), Box<dyn std::error::Error>> {
    let n = rows.len().max(1) as f64;
    let x_end = rows
        .iter()
        .flat_map(|r| [r.ours, r.reference])
        .flatten()
        .filter(|x| x.is_finite())
        .fold(1.0f64, f64::max)
        * 1.25;
    let height = 120 + 48 * rows.len() as u32;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (labels, plot_area) = root.split_horizontally(470);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(35)
        .build_cartesian_2d(0.0..x_end, 0.0..n)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("ratio (lower is better for times, 1.0 = no change for throughput)")
        .draw()?;
    let bar = |color: RGBColor| color.mix(0.8).filled();
    for (i, r) in rows.iter().enumerate() {
        let top = n - i as f64;
        let ours_missing = format!("{}: skipped", legend.ours);
        let reference = format!("{}: {}", legend.reference, r.reference_text);
        for (k, (value, color, missing)) in [
            (r.ours, BLUE, ours_missing.as_str()),
            (r.reference, RED, reference.as_str()),
        ]
        .into_iter()
        .enumerate()
        {
            let y0 = top - 0.1 - 0.4 * (k as f64 + 1.0);
            let y1 = y0 + 0.35;
            match value.filter(|x| x.is_finite()) {
                Some(v) => {
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y0), (v, y1)],
                        bar(color),
                    )))?;
                    chart.draw_series(std::iter::once(Text::new(
                        format!("{v:.3}"),
                        (v + x_end * 0.01, y1),
                        ("sans-serif", 12),
                    )))?;
                }
                None => {
                    chart.draw_series(std::iter::once(Text::new(
                        missing.to_string(),
                        (x_end * 0.01, y1),
                        ("sans-serif", 12).into_font().color(&color),
                    )))?;
                }
            }
        }
        let (_, y) = chart.backend_coord(&(0.0, top - 0.55));
        labels.draw(&Text::new(r.label.clone(), (10, y - 7), ("sans-serif", 12)))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, 0.0), (1.0, n)],
        BLACK.mix(0.4),
    )))?;
    for (k, (name, color)) in [(legend.ours, BLUE), (legend.reference, RED)]
        .into_iter()
        .enumerate()
    {
        let y = 20 + 18 * k as i32;
        labels.draw(&Rectangle::new([(10, y), (24, y + 12)], color.filled()))?;
        labels.draw(&Text::new(name, (30, y), ("sans-serif", 13)))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_well_formed_svg() {
        let dir = std::env::temp_dir().join(format!("zeronce-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rss.svg");
        let series = [Series {
            name: "adaptive".into(),
            points: vec![(0.0, 512.0), (1.0, 512.0), (2.1, 64.0)],
        }];
        let marks = [Mark {
            at: 2.0,
            what: "reported".into(),
        }];
        resident_over_time(&path, "resident", &series, &marks).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{svg:.80}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("<polyline") || svg.contains("<path"));
        assert!(svg.contains("reported") && svg.contains("adaptive"));
    }
}
