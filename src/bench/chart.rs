//! Charts of an experiment, drawn with plotters as SVG and PNG: one panel
//! per case (each with its own scale, since 1 KB and 1 MB differ a
//! hundredfold), one bar per engine or peer with its spread as a whisker,
//! and the seed's published figures as grey bars beside them. Where depot
//! was measured in pairs with a peer, a second chart shows the ratios, with
//! a dashed line at 1× (as fast as the peer). Text is rendered from DejaVu
//! Sans by a pure-Rust rasteriser, so no system font libraries are needed.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::number;
use super::{ExperimentReport, Row};

const FONT: &str = "sans-serif";
const FONT_FILES: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];
const PANEL: (u32, u32) = (440, 320);
const COLUMNS: usize = 3;
const TITLE_HEIGHT: u32 = 40;
const LEGEND_LINE: u32 = 24;
/// The seed's published figures, one grey per source.
const SEED_GREYS: [RGBColor; 3] = [RGBColor(110, 110, 110), RGBColor(170, 170, 170), RGBColor(210, 210, 210)];

/// Loads the font once; the reason when there is none.
fn font() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let bytes = FONT_FILES
                .iter()
                .find_map(|p| std::fs::read(p).ok())
                .ok_or("no DejaVu Sans font found (Debian package fonts-dejavu-core)")?;
            plotters::style::register_font(FONT, FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
                .map_err(|_| "DejaVu Sans could not be read".to_string())
        })
        .clone()
}

/// What one chart shows: cases (panels) and series (bars).
struct Data {
    metric: String,
    /// How to read the bars: "taller is faster"...
    reading: &'static str,
    /// Whether to draw the line at 1× of a ratio.
    parity: bool,
    cases: Vec<String>,
    series: Vec<Series>,
}

struct Series {
    name: String,
    color: RGBColor,
    /// Per case, when there is a figure.
    values: Vec<Option<Bar>>,
}

/// One bar: the median and, when measured over rounds, the spread.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Bar {
    value: f64,
    spread: Option<(f64, f64)>,
}

/// The rows of `e` in `metric`.
fn collect(e: &ExperimentReport, metric: &str) -> Data {
    let rows: Vec<&Row> = e.rows.iter().filter(|r| r.metric == metric).collect();
    let mut cases: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut seeds: Vec<String> = Vec::new();
    for r in &rows {
        if !cases.contains(&r.case) {
            cases.push(r.case.clone());
        }
        if r.value.is_some() && !names.contains(&r.subject) {
            names.push(r.subject.clone());
        }
        if let (Some(_), Some(src)) = (r.seed, &r.seed_source)
            && !seeds.contains(src)
        {
            seeds.push(src.clone());
        }
    }
    let measured = names.iter().enumerate().map(|(i, name)| Series {
        name: name.clone(),
        color: {
            let c = Palette99::pick(i).to_rgba();
            RGBColor(c.0, c.1, c.2)
        },
        values: cases
            .iter()
            .map(|case| {
                let r = rows.iter().find(|r| &r.case == case && &r.subject == name)?;
                Some(Bar { value: r.value?, spread: r.min.zip(r.max) })
            })
            .collect(),
    });
    let published = seeds.iter().enumerate().map(|(i, src)| Series {
        name: format!("published: {src}"),
        color: SEED_GREYS[i % SEED_GREYS.len()],
        values: cases
            .iter()
            .map(|case| {
                let r = rows.iter().find(|r| &r.case == case && r.seed_source.as_ref() == Some(src))?;
                Some(Bar { value: r.seed?, spread: None })
            })
            .collect(),
    });
    let series = measured.chain(published).collect();
    Data { metric: metric.to_string(), reading: reading(metric), parity: false, cases, series }
}

/// Draws `e` into `out` as `<name>.svg` and `<name>.png`; its ratios, when
/// a peer was measured beside it, as `<name>-ratio.svg` and `.png`; and
/// each metric it also charts, when measured, as `<name>-<stem>.*`.
/// Returns the files drawn, each with its metric.
pub fn draw(out: &Path, e: &ExperimentReport) -> anyhow::Result<Vec<(String, String)>> {
    font().map_err(anyhow::Error::msg)?;
    let heading = format!("{}: {}", e.name, e.title);
    let mut files = draw_one(out, &e.name, &heading, &e.chart_metric, &collect(e, &e.chart_metric))?;
    if let Some(ratio) = &e.ratio {
        let data = Data {
            reading: if ratio.of_rates { "taller is faster" } else { "shorter is faster" },
            parity: true,
            ..collect(e, &ratio.metric)
        };
        // No ratio rows when the peer could not run.
        if !data.series.is_empty() {
            let heading = format!("{}: each beside {}, pair by pair", e.name, ratio.metric.trim_start_matches("× "));
            files.extend(draw_one(out, &format!("{}-ratio", e.name), &heading, &ratio.metric, &data)?);
        }
    }
    for (stem, metric) in &e.also_charted {
        let data = collect(e, metric);
        if !data.series.is_empty() {
            files.extend(draw_one(out, &format!("{}-{stem}", e.name), &heading, metric, &data)?);
        }
    }
    Ok(files)
}

fn draw_one(out: &Path, stem: &str, heading: &str, metric: &str, data: &Data) -> anyhow::Result<Vec<(String, String)>> {
    let columns = data.cases.len().clamp(1, COLUMNS);
    let panel_rows = data.cases.len().div_ceil(columns).max(1);
    let legend_rows = data.series.len().div_ceil(COLUMNS).max(1) as u32;
    let size = (PANEL.0 * columns as u32, TITLE_HEIGHT + PANEL.1 * panel_rows as u32 + LEGEND_LINE * legend_rows + 16);
    let parity = if data.parity { "; dashed: 1×, as fast" } else { "" };
    let title = format!("{heading} ({}; {}{parity})", data.metric, data.reading);
    let svg = format!("{stem}.svg");
    let png = format!("{stem}.png");
    render(SVGBackend::new(&out.join(&svg), size).into_drawing_area(), &title, data, columns)
        .with_context(|| format!("drawing {svg}"))?;
    render(BitMapBackend::new(&out.join(&png), size).into_drawing_area(), &title, data, columns)
        .with_context(|| format!("drawing {png}"))?;
    Ok(vec![(svg, metric.to_string()), (png, metric.to_string())])
}

/// How to read the bars: rates (per second) grow with speed, times shrink,
/// and memory and CPU time are better small.
fn reading(metric: &str) -> &'static str {
    if metric.contains("/s") {
        "taller is faster"
    } else if metric == "MB" {
        "shorter is leaner"
    } else if metric.starts_with("CPU") {
        "shorter costs less"
    } else {
        "shorter is faster"
    }
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    data: &Data,
    columns: usize,
) -> anyhow::Result<()> {
    let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
    root.fill(&WHITE).map_err(fail)?;
    let (_, height) = root.dim_in_pixel();
    let (head, rest) = root.split_vertically(TITLE_HEIGHT);
    head.draw(&Text::new(title.to_string(), (12, 12), (FONT, 18).into_font().color(&BLACK))).map_err(fail)?;
    let legend_height = LEGEND_LINE * data.series.len().div_ceil(COLUMNS).max(1) as u32 + 16;
    let (grid, legend) = rest.split_vertically(height - TITLE_HEIGHT - legend_height);
    let panel_rows = data.cases.len().div_ceil(columns).max(1);
    for (i, (panel, case)) in grid.split_evenly((panel_rows, columns)).iter().zip(&data.cases).enumerate() {
        draw_panel(panel, case, i, data).map_err(fail)?;
    }
    let (width, _) = legend.dim_in_pixel();
    let entry = (width / COLUMNS as u32) as i32;
    for (i, s) in data.series.iter().enumerate() {
        let x = 12 + entry * (i % COLUMNS) as i32;
        let y = 8 + LEGEND_LINE as i32 * (i / COLUMNS) as i32;
        legend.draw(&Rectangle::new([(x, y), (x + 14, y + 14)], s.color.filled())).map_err(fail)?;
        legend.draw(&Text::new(s.name.clone(), (x + 20, y), (FONT, 14).into_font().color(&BLACK))).map_err(fail)?;
    }
    root.present().map_err(fail)
}

fn draw_panel<DB: DrawingBackend>(
    panel: &DrawingArea<DB, Shift>,
    case: &str,
    index: usize,
    data: &Data,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let bars: Vec<(usize, &Series, Bar)> = data
        .series
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.values.get(index).copied().flatten().map(|bar| (i, s, bar)))
        .collect();
    let top = bars.iter().map(|(_, _, b)| b.spread.map_or(b.value, |(_, hi)| hi.max(b.value))).fold(0.0, f64::max);
    let top = if data.parity { top.max(1.0) } else { top };
    let top = if top > 0.0 { top * 1.18 } else { 1.0 };
    let n = data.series.len().max(1) as f64;
    let mut chart = ChartBuilder::on(panel)
        .caption(case, (FONT, 16))
        .margin(10)
        .x_label_area_size(8)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(6)
        .y_label_formatter(&|v| number(*v))
        .y_desc(data.metric.as_str())
        .label_style((FONT, 12))
        .draw()?;
    for (i, s, Bar { value: v, spread }) in bars {
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new([(x + 0.12, 0.0), (x + 0.88, v)], s.color.filled())))?;
        if let Some((lo, hi)) = spread.filter(|(lo, hi)| hi > lo) {
            chart.draw_series(std::iter::once(PathElement::new(vec![(x + 0.5, lo), (x + 0.5, hi)], BLACK)))?;
        }
        let label_at = spread.map_or(v, |(_, hi)| hi.max(v));
        let style = (FONT, 11).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
        chart.draw_series(std::iter::once(Text::new(number(v), (x + 0.5, label_at), style)))?;
    }
    if data.parity {
        // Over the bars, so a bar short of 1× shows how far short.
        chart.draw_series(std::iter::once(DashedPathElement::new(vec![(0.0, 1.0), (n, 1.0)], 6, 4, BLACK)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Ratio;
    use crate::bench::stats::Summary;

    #[test]
    fn rates_read_taller_is_faster() {
        assert_eq!(reading("ms/request"), "shorter is faster");
        assert_eq!(reading("files/s"), "taller is faster");
        assert_eq!(reading("write MB/s"), "taller is faster");
        assert_eq!(reading("MB"), "shorter is leaner");
        assert_eq!(reading("CPU µs/request"), "shorter costs less");
    }

    #[test]
    fn series_follow_the_rows_and_seeds_come_last() {
        let s = |m, lo, hi| Summary { median: m, min: lo, max: hi };
        let e = ExperimentReport {
            name: "x".into(),
            title: "t".into(),
            method: vec![],
            chart_metric: "ms/request".into(),
            ratio: None,
            also_charted: Vec::new(),
            rows: vec![
                Row::measured("x", "a", "depot hybrid", "ms/request", s(1.0, 0.5, 2.0)).with_seed(Some((3.0, "old"))),
                Row::measured("x", "a", "depot hybrid", "req/s", s(1000.0, 900.0, 1100.0)),
                Row::skipped("x", "b", "depot hybrid", "ms/request", "broken"),
                Row::skipped("x", "a", "depot s3", "ms/request", "no server given"),
            ],
        };
        let d = collect(&e, "ms/request");
        assert_eq!(d.cases, vec!["a", "b"]);
        let names: Vec<_> = d.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["depot hybrid", "published: old"]);
        assert_eq!(d.series[0].values, vec![Some(Bar { value: 1.0, spread: Some((0.5, 2.0)) }), None]);
        assert_eq!(d.series[1].values, vec![Some(Bar { value: 3.0, spread: None }), None]);
    }

    /// An experiment measured beside a peer: depot's rates and their ratio
    /// to the peer's, or, when `peer_ran` is false, skip rows for both.
    fn paired(peer_ran: bool) -> ExperimentReport {
        let s = |m, lo, hi| Summary { median: m, min: lo, max: hi };
        let rows = if peer_ran {
            vec![
                Row::measured("x", "a", "depot hybrid", "req/s", s(1000.0, 900.0, 1100.0)),
                Row::measured("x", "a", "peer", "req/s", s(800.0, 700.0, 900.0)),
                Row::measured("x", "a", "depot hybrid", "× peer", s(1.25, 1.1, 1.4)),
            ]
        } else {
            vec![
                Row::measured("x", "a", "depot hybrid", "req/s", s(1000.0, 900.0, 1100.0)),
                Row::skipped("x", "a", "peer", "req/s", "not installed"),
            ]
        };
        ExperimentReport {
            name: "x".into(),
            title: "t".into(),
            method: vec![],
            chart_metric: "req/s".into(),
            ratio: Some(Ratio { metric: "× peer".into(), of_rates: true }),
            also_charted: Vec::new(),
            rows,
        }
    }

    /// The dashes of a dashed horizontal line in an SVG chart: black
    /// polylines 6 pixels long, level.
    fn dashes(svg: &str) -> usize {
        svg.lines()
            .filter(|l| l.starts_with("<polyline") && l.contains(r##"stroke="#000000""##))
            .filter_map(|l| l.split("points=\"").nth(1)?.split('"').next())
            .filter(|points| {
                let xy: Vec<f64> = points.split([',', ' ']).filter_map(|v| v.parse().ok()).collect();
                xy.len() == 4 && xy[1] == xy[3] && xy[2] - xy[0] == 6.0
            })
            .count()
    }

    /// A metric also charted gets a chart of its own, with only its rows,
    /// and none when nothing measured it.
    #[test]
    fn metrics_also_charted_get_charts_of_their_own() {
        if let Err(why) = font() {
            panic!("charts need their font: {why}");
        }
        let s = |m, lo, hi| Summary { median: m, min: lo, max: hi };
        let cpu = "CPU µs/request";
        let mut e = paired(true);
        e.also_charted = vec![("cpu".into(), cpu.into()), ("absent".into(), "MB".into())];
        e.rows.push(Row::measured("x", "a", "depot hybrid: server", cpu, s(23.25, 23.0, 23.5)));
        let dir = tempfile::tempdir().unwrap();
        let files = draw(dir.path(), &e).unwrap();
        let cpu_files: Vec<&String> = files.iter().filter(|(_, m)| m == cpu).map(|(f, _)| f).collect();
        assert_eq!(cpu_files, ["x-cpu.svg", "x-cpu.png"]);
        assert!(!dir.path().join("x-absent.svg").exists(), "a chart of a metric with no rows");
        let svg = std::fs::read_to_string(dir.path().join("x-cpu.svg")).unwrap();
        assert!(svg.contains("23.25") && svg.contains("shorter costs less"), "{svg}");
        // Each text of the SVG is a line of its own.
        assert!(svg.contains("\ndepot hybrid: server\n"), "its series in the legend: {svg}");
        assert!(!svg.contains("\npeer\n") && !svg.contains("\ndepot hybrid\n"), "other metrics' series: {svg}");
    }

    #[test]
    fn ratios_to_a_peer_get_a_chart_of_their_own_when_the_peer_ran() {
        if let Err(why) = font() {
            panic!("charts need their font: {why}");
        }
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<String> = draw(dir.path(), &paired(true)).unwrap().into_iter().map(|(f, _)| f).collect();
        assert_eq!(files, ["x.svg", "x.png", "x-ratio.svg", "x-ratio.png"]);
        let svg = std::fs::read_to_string(dir.path().join("x-ratio.svg")).unwrap();
        assert!(svg.contains("each beside peer") && svg.contains("1.25"), "{svg}");
        assert!(!svg.contains("900"), "the ratio chart shows ratios only");
        assert!(dashes(&svg) >= 10, "no dashed line at 1×: {svg}");
        let rates = std::fs::read_to_string(dir.path().join("x.svg")).unwrap();
        assert_eq!(dashes(&rates), 0, "a line at 1× on a chart of rates");

        let dir = tempfile::tempdir().unwrap();
        let files = draw(dir.path(), &paired(false)).unwrap();
        assert_eq!(files, [("x.svg".to_string(), "req/s".to_string()), ("x.png".into(), "req/s".into())]);
        assert!(!dir.path().join("x-ratio.svg").exists());
    }
}
