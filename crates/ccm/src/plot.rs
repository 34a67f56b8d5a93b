//! SVG charts for `ccm bench --plot`.

use std::path::Path;

use plotters::prelude::*;

use crate::bench::IdleResult;

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e}")
}

/// Nodes initialized over time during the burst.
pub fn burst(path: &Path, timeline: &[(f64, usize)], nodes: u32) -> anyhow::Result<()> {
    if timeline.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let t_max = timeline.last().map(|(t, _)| *t).unwrap_or(1.0).max(0.1);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("burst: {nodes} nodes register at once"),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            0f64..t_max * 1.05,
            0usize..(nodes as usize + nodes as usize / 20 + 1),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first node registered")
        .y_desc("nodes initialized")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(timeline.iter().copied(), &BLUE))
        .map_err(err)?
        .label("ccm-rs")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Cumulative cloud calls over the idle window, one line per route mode.
pub fn idle(path: &Path, modes: &[IdleResult]) -> anyhow::Result<()> {
    if modes.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let t_max = modes
        .iter()
        .flat_map(|m| m.timeline.last().map(|(t, _)| *t))
        .fold(1.0f64, f64::max);
    let y_max = modes
        .iter()
        .flat_map(|m| m.timeline.last().map(|(_, c)| *c))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "idle cluster: cumulative cloud API calls",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0u64..(y_max + y_max / 10 + 1))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the idle window")
        .y_desc("cloud API calls")
        .draw()
        .map_err(err)?;
    for (i, m) in modes.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(m.timeline.iter().copied(), color))
            .map_err(err)?
            .label(format!("routes: {} mode", m.route_mode))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The CCM's RSS over the idle window (the soak's curve), one line per route mode: flat is
/// the goal.
pub fn idle_rss(path: &Path, modes: &[IdleResult]) -> anyhow::Result<()> {
    let samples = || modes.iter().flat_map(|m| m.rss_timeline.iter());
    if samples().next().is_none() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let t_max = samples().map(|s| s.0).fold(1.0f64, f64::max);
    let y_max = samples().map(|s| s.1).fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("idle cluster: CCM resident memory", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the idle window")
        .y_desc("RSS, MB")
        .draw()
        .map_err(err)?;
    for (i, m) in modes.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                m.rss_timeline.iter().map(|s| (s.0, s.1)),
                color,
            ))
            .map_err(err)?
            .label(format!("routes: {} mode", m.route_mode))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
