//! SVG charts for `ccm bench --plot`.

use std::path::Path;

use plotters::prelude::*;

use crate::bench::IdleResult;

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e}")
}

/// What a chart says around its lines.
struct Frame<'a> {
    caption: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    /// Counts get whole-number labels; measurements keep decimals.
    whole_y: bool,
}

/// One named line of (x, y) points.
type Series = (String, Vec<(f64, f64)>);

/// Draws `series` as lines on one frame, y from 0 to `y_top`; nothing when there is no point.
fn line_chart(path: &Path, frame: &Frame, series: &[Series], y_top: f64) -> anyhow::Result<()> {
    let points = || series.iter().flat_map(|(_, s)| s.iter());
    if points().next().is_none() {
        return Ok(());
    }
    let t_max = points().map(|p| p.0).fold(0.1f64, f64::max);
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(frame.caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max * 1.05, 0f64..y_top)
        .map_err(err)?;
    let whole = |y: &f64| format!("{y:.0}");
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(frame.x_desc).y_desc(frame.y_desc);
    if frame.whole_y {
        mesh.y_label_formatter(&whole);
    }
    mesh.draw().map_err(err)?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color))
            .map_err(err)?
            .label(label)
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

/// Nodes initialized over time during the burst.
pub fn burst(path: &Path, timeline: &[(f64, usize)], nodes: u32) -> anyhow::Result<()> {
    let caption = format!("burst: {nodes} nodes register at once");
    let frame = Frame {
        caption: &caption,
        x_desc: "seconds since the first node registered",
        y_desc: "nodes initialized",
        whole_y: true,
    };
    let line = timeline.iter().map(|&(t, n)| (t, n as f64)).collect();
    let nodes = f64::from(nodes);
    line_chart(path, &frame, &[("ccm-rs".into(), line)], nodes * 1.05 + 1.0)
}

/// Cumulative cloud calls over the idle window, one line per route mode.
pub fn idle(path: &Path, modes: &[IdleResult]) -> anyhow::Result<()> {
    let frame = Frame {
        caption: "idle cluster: cumulative cloud API calls",
        x_desc: "seconds into the idle window",
        y_desc: "cloud API calls",
        whole_y: true,
    };
    let series = per_mode(modes, |m| {
        m.timeline.iter().map(|&(t, c)| (t, c as f64)).collect()
    });
    line_chart(path, &frame, &series, y_top(&series))
}

/// The CCM's RSS over the idle window (the soak's curve), one line per route mode: flat is
/// the goal.
pub fn idle_rss(path: &Path, modes: &[IdleResult]) -> anyhow::Result<()> {
    let frame = Frame {
        caption: "idle cluster: CCM resident memory",
        x_desc: "seconds into the idle window",
        y_desc: "RSS, MB",
        whole_y: false,
    };
    let series = per_mode(modes, |m| {
        m.rss_timeline.iter().map(|s| (s.0, s.1)).collect()
    });
    line_chart(path, &frame, &series, y_top(&series))
}

fn per_mode(modes: &[IdleResult], points: impl Fn(&IdleResult) -> Vec<(f64, f64)>) -> Vec<Series> {
    let label = |m: &IdleResult| format!("routes: {} mode", m.route_mode);
    modes.iter().map(|m| (label(m), points(m))).collect()
}

/// 10 % headroom over the highest point, at least 1.
fn y_top(series: &[Series]) -> f64 {
    let max = series.iter().flat_map(|(_, s)| s.iter().map(|p| p.1));
    max.fold(1.0f64, f64::max) * 1.1
}
