//! The tuner's SVG: one panel per workload and knob, the best value
//! measured with each of the knob's candidates (whatever the other knobs
//! were), the defaults' value as a dashed line and the choice marked.

use super::report::{TuneReport, WorkloadTune};
use plotters::prelude::*;
use std::path::Path;

const PANEL_WIDTH_PX: u32 = 420;
const PANEL_HEIGHT_PX: u32 = 300;
const COLUMNS: usize = 3;

fn err(e: impl std::fmt::Display) -> String {
    format!("chart: {e}")
}

pub fn write_svg(path: &Path, report: &TuneReport) -> Result<(), String> {
    let panels: Vec<(&WorkloadTune, usize)> = report
        .workloads
        .iter()
        .flat_map(|w| (0..w.knobs.len()).map(move |k| (w, k)))
        .collect();
    let rows = panels.len().div_ceil(COLUMNS).max(1);
    let root = SVGBackend::new(
        path,
        (
            PANEL_WIDTH_PX * COLUMNS as u32,
            PANEL_HEIGHT_PX * rows as u32,
        ),
    )
    .into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((rows, COLUMNS));
    for ((w, k), area) in panels.iter().zip(areas.iter()) {
        draw_knob(area, w, *k)?;
    }
    root.present().map_err(err)
}

/// For each candidate value of knob `k`, the best value measured with it.
fn curve(w: &WorkloadTune, k: usize) -> Vec<(f64, f64)> {
    let (name, values) = &w.knobs[k];
    values
        .iter()
        .enumerate()
        .filter_map(|(x, v)| {
            let best = w
                .points
                .iter()
                .filter(|p| p.knobs.get(name) == Some(v))
                .map(|p| p.value)
                .fold(f64::NAN, f64::max);
            (!best.is_nan()).then_some((x as f64, best))
        })
        .collect()
}

fn draw_knob(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    w: &WorkloadTune,
    k: usize,
) -> Result<(), String> {
    let (name, values) = &w.knobs[k];
    let points = curve(w, k);
    let top = points
        .iter()
        .map(|p| p.1)
        .fold(w.default.value, f64::max)
        .max(1e-9);
    let end = (values.len().max(2) - 1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{}: {name}", w.workload), ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.3f64..end + 0.3, 0f64..top * 1.15)
        .map_err(err)?;
    let labels = values.clone();
    chart
        .configure_mesh()
        .y_desc(w.metric.as_str())
        .x_labels(values.len().max(2))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() > 0.01 || i < 0.0 {
                return String::new();
            }
            labels.get(i as usize).cloned().unwrap_or_default()
        })
        .draw()
        .map_err(err)?;
    chart
        .draw_series(DashedLineSeries::new(
            [(-0.3, w.default.value), (end + 0.3, w.default.value)],
            6,
            4,
            BLACK.mix(0.5).stroke_width(1),
        ))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(points.clone(), BLUE.stroke_width(2)))
        .map_err(err)?;
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
        .map_err(err)?;
    // The choice: its value of this knob, at the value it measured.
    if let Some(x) = w
        .chosen
        .knobs
        .get(name)
        .and_then(|v| values.iter().position(|c| c == v))
    {
        let label = if w.chose_defaults() {
            "kept: defaults"
        } else {
            "chosen"
        };
        chart
            .draw_series([Circle::new(
                (x as f64, w.chosen.value),
                7,
                RED.stroke_width(3),
            )])
            .map_err(err)?;
        chart
            .draw_series([Text::new(
                label,
                (x as f64, w.chosen.value * 1.07),
                ("sans-serif", 13).into_font().color(&RED),
            )])
            .map_err(err)?;
    }
    Ok(())
}
