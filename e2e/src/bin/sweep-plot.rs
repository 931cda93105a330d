//! `sweep-plot`: draws the steps `bench --only sweep --sweep-json FILE` wrote as one PNG: the
//! controller's and the largest HAProxy pod's resident memory over the steps above, the
//! latency's median and 99th percentile below.
//!
//! `cargo run -p haptic-e2e --bin sweep-plot -- STEPS.json OUT.png [--font TTF] [--title TEXT]`
//!
//! It owns the drawing; it must never measure anything. plotters draws the text with a TrueType
//! font read at run time (DejaVu Sans by default), so no system font library is linked.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use clap::Parser;
use haptic_e2e::sweep::Step;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Draws a `sweep` run's memory and latency per step into a PNG.
#[derive(Debug, Parser)]
#[command(name = "sweep-plot")]
struct Args {
    /// The steps, as `bench --sweep-json` wrote them.
    steps: PathBuf,
    /// The PNG to write.
    out: PathBuf,
    /// A TrueType font for the text.
    #[arg(long, default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")]
    font: PathBuf,
    /// The title above both charts.
    #[arg(long, default_value = "haptic: HTTPRoutes swept up and down under load")]
    title: String,
}

/// One line of a chart: its name, colour and a value per step.
struct Line {
    name: &'static str,
    colour: RGBColor,
    values: Vec<f64>,
}

/// Draws `lines` over the steps into `area`, the y axis named `y_desc` from 0.
fn chart(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    steps: &[Step],
    caption: &str,
    y_desc: &str,
    lines: &[Line],
) -> anyhow::Result<()> {
    let top = lines.iter().flat_map(|l| l.values.iter().copied()).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let labels: Vec<String> = steps.iter().map(Step::label).collect();
    let last = steps.len().saturating_sub(1);
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.3..last as f64 + 0.3, 0.0..(top * 1.4).max(1.0))?;
    c.configure_mesh()
        .x_labels(steps.len())
        .x_label_formatter(&|x| labels.get(x.round() as usize).cloned().unwrap_or_default())
        .x_desc("HTTPRoutes at the step (↑ created, ↓ deleted)")
        .y_desc(y_desc)
        .label_style(("sans-serif", 15))
        .draw()?;
    for l in lines {
        let points: Vec<(f64, f64)> = l.values.iter().enumerate().map(|(i, v)| (i as f64, *v)).collect();
        let colour = l.colour;
        c.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
            .label(l.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        c.draw_series(points.into_iter().map(|p| Circle::new(p, 4, colour.filled())))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.steps).with_context(|| format!("read {}", args.steps.display()))?;
    let steps: Vec<Step> = serde_json::from_str(&text).with_context(|| format!("parse {}", args.steps.display()))?;
    if steps.len() < 2 {
        bail!("{} holds {} steps; a plot needs two or more", args.steps.display(), steps.len());
    }
    let font = std::fs::read(&args.font).with_context(|| format!("read the font {} (--font)", args.font.display()))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()))
        .map_err(|_| anyhow::anyhow!("{} is not a TrueType font", args.font.display()))?;

    let root = BitMapBackend::new(&args.out, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&args.title, ("sans-serif", 26))?;
    let (upper, lower) = root.split_vertically(450);
    let memory = [
        Line { name: "controller RSS", colour: BLUE, values: steps.iter().map(|s| s.controller_mib).collect() },
        Line {
            name: "HAProxy RSS (largest pod)",
            colour: RED,
            values: steps.iter().map(Step::haproxy_max_mib).collect(),
        },
    ];
    chart(&upper, &steps, "Resident memory", "MiB", &memory)?;
    let latency = [
        Line { name: "p50", colour: GREEN, values: steps.iter().map(|s| s.p50_ms).collect() },
        Line { name: "p99", colour: MAGENTA, values: steps.iter().map(|s| s.p99_ms).collect() },
    ];
    chart(&lower, &steps, "Latency through HAProxy (a new connection per request)", "ms", &latency)?;
    root.present().with_context(|| format!("write {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}
