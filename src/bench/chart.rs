//! The SVG chart, like the seeds' figures: 4K random read IOPS against
//! queue depth (one line per target and state, seed 002's figure 5), MB/s
//! of every workload phase as bars per target and state, and, for a sweep,
//! MB/s against the swept value (seeds 001 and 003).

use super::report::Row;
use plotters::prelude::*;
use std::path::Path;

const WIDTH_PX: u32 = 1200;
const PANEL_HEIGHT_PX: u32 = 420;

/// The name a line or bar group has in the legend.
fn series_name(r: &Row) -> String {
    let mut name = r.target.clone();
    if r.target == "uraid" {
        name = format!("{name} {}", r.state);
    }
    if let Some(s) = &r.setting {
        name = format!("{name} {s}");
    }
    name
}

fn unique<T: PartialEq + Clone>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn err(e: impl std::fmt::Display) -> String {
    format!("chart: {e}")
}

pub fn write_svg(path: &Path, rows: &[Row], sweep_key: Option<&str>) -> Result<(), String> {
    // Only the panels the run has rows for (an empty panel with an empty
    // legend box only puzzles the reader); the bars always, as the frame.
    let queue_depth = rows.iter().any(|r| r.workload == "randread-qd");
    let panels = 1 + u32::from(queue_depth) + u32::from(sweep_key.is_some());
    let root = SVGBackend::new(path, (WIDTH_PX, PANEL_HEIGHT_PX * panels)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((panels as usize, 1));
    let mut area = areas.iter();
    if queue_depth {
        draw_queue_depth(area.next().expect("counted"), rows)?;
    }
    draw_bars(area.next().expect("counted"), rows)?;
    if let Some(key) = sweep_key {
        draw_sweep(area.next().expect("counted"), rows, key)?;
    }
    root.present().map_err(err)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(err)
}

fn draw_queue_depth(area: &Area, rows: &[Row]) -> Result<(), String> {
    let qd_rows: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == "randread-qd")
        .collect();
    let max_iops = qd_rows.iter().map(|r| r.iops).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "4K random read IOPS vs queue depth (randread-qd)",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..7.0, 0f64..max_iops * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("queue depth")
        .y_desc("IOPS")
        .x_labels(8)
        .x_label_formatter(&|x| format!("{}", 1u32 << (x.round() as u32).min(7)))
        .draw()
        .map_err(err)?;
    for (i, name) in unique(qd_rows.iter().map(|r| series_name(r)))
        .iter()
        .enumerate()
    {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = qd_rows
            .iter()
            .filter(|r| &series_name(r) == name)
            .map(|r| ((r.queue_depth as f64).log2(), r.iops))
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

fn draw_bars(area: &Area, rows: &[Row]) -> Result<(), String> {
    let bar_rows: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload != "randread-qd" && r.setting.is_none())
        .collect();
    let groups = unique(
        bar_rows
            .iter()
            .map(|r| format!("{} {}", r.workload, r.phase)),
    );
    let series = unique(bar_rows.iter().map(|r| series_name(r)));
    let max_mb = bar_rows.iter().map(|r| r.mb_per_s).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "MB/s (10^6 bytes/s) per workload and state",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..groups.len().max(1) as f64, 0f64..max_mb * 1.1)
        .map_err(err)?;
    let labels = groups.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("MB/s")
        .x_labels(groups.len().max(1) * 2 + 1)
        .x_label_formatter(&move |x| {
            let i = x.floor() as usize;
            // Label each group once, at its middle.
            if (x - i as f64 - 0.5).abs() < 1e-6 {
                labels.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(err)?;
    let width = 0.8 / series.len().max(1) as f64;
    for (k, name) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let bars: Vec<Rectangle<(f64, f64)>> = bar_rows
            .iter()
            .filter(|r| &series_name(r) == name)
            .filter_map(|r| {
                let g = groups
                    .iter()
                    .position(|g| *g == format!("{} {}", r.workload, r.phase))?;
                let x0 = g as f64 + 0.1 + k as f64 * width;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + width, r.mb_per_s)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn draw_sweep(area: &Area, rows: &[Row], key: &str) -> Result<(), String> {
    // The sweep's own rows: a phase with a knob of its own under a sweep
    // of another knob names both, and is not a point of this curve.
    let prefix = format!("{key}=");
    let swept: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.setting
                .as_deref()
                .is_some_and(|s| s.starts_with(&prefix) && !s.contains(", "))
        })
        .collect();
    let values = unique(swept.iter().filter_map(|r| r.setting.clone()));
    // The raw members under the same workloads, run once: flat dashed
    // lines that the curve reads against.
    let phase_of = |r: &Row| format!("{} {}", r.workload, r.phase);
    let swept_phases = unique(swept.iter().map(|r| phase_of(r)));
    let raw: Vec<&Row> = rows
        .iter()
        .filter(|r| r.target == "raw" && swept_phases.contains(&phase_of(r)))
        .collect();
    let max_mb = swept
        .iter()
        .chain(&raw)
        .map(|r| r.mb_per_s)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("MB/s vs {key} (uraid; dashed: the raw members)"),
            ("sans-serif", 20),
        )
        .margin(10)
        .margin_right(40)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..(values.len().max(2) - 1) as f64, 0f64..max_mb * 1.1)
        .map_err(err)?;
    let labels: Vec<String> = values
        .iter()
        .map(|v| v.split_once('=').map_or(v.clone(), |(_, v)| v.to_string()))
        .collect();
    chart
        .configure_mesh()
        .x_desc(key)
        .y_desc("MB/s")
        .x_labels(values.len().max(2))
        .x_label_formatter(&|x| labels.get(x.round() as usize).cloned().unwrap_or_default())
        .draw()
        .map_err(err)?;
    let lines = unique(
        swept
            .iter()
            .map(|r| format!("{} {} {}", r.state, r.workload, r.phase)),
    );
    for (i, line) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = swept
            .iter()
            .filter(|r| &format!("{} {} {}", r.state, r.workload, r.phase) == line)
            .filter_map(|r| {
                let x = values.iter().position(|v| Some(v) == r.setting.as_ref())?;
                Some((x as f64, r.mb_per_s))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(line.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        // The same phase on the raw members, in the line's colour.
        let phase = line.split_once(' ').map_or(line.as_str(), |(_, p)| p);
        if let Some(r) = raw.iter().find(|r| phase_of(r) == phase) {
            let end = (values.len().max(2) - 1) as f64;
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, r.mb_per_s), (end, r.mb_per_s)],
                    8,
                    6,
                    color.stroke_width(1),
                ))
                .map_err(err)?;
        }
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}
