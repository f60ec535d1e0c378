//! `--plot FILE.svg`: resident memory over time as an SVG line chart (`plotters`, SVG
//! backend only), one line per series, with the moments that explain it (free, report)
//! marked as vertical lines.

use plotters::prelude::*;
use std::path::Path;

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

/// Draws `series` and `marks` into the SVG file `path`.
pub fn resident_over_time(
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
