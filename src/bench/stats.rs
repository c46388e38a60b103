//! The statistics every experiment reports: the median of several rounds
//! with their spread (smallest..largest), and latency percentiles by the
//! nearest-rank method over every request measured.

use serde::Serialize;

/// Several measurements of one quantity, summarised.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `values`; `None` when there are none (or a NaN among them).
    pub fn of(values: &[f64]) -> Option<Summary> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Some(Summary { median, min: sorted[0], max: sorted[n - 1] })
    }

    /// One value, without spread.
    pub fn single(value: f64) -> Summary {
        Summary { median: value, min: value, max: value }
    }

    /// The same measurements seen through a decreasing function, such as
    /// requests per second turned into milliseconds per request: the
    /// median maps to the median, and the extremes swap.
    pub fn map_decreasing(self, f: impl Fn(f64) -> f64) -> Summary {
        Summary { median: f(self.median), min: f(self.max), max: f(self.min) }
    }
}

/// The `p`-th percentile (0..=100) of ascending `sorted` values by nearest
/// rank: the smallest value with at least p% of the values at or below it.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]), Some(Summary { median: 2.0, min: 1.0, max: 3.0 }));
        assert_eq!(Summary::of(&[4.0, 1.0, 3.0, 2.0]), Some(Summary { median: 2.5, min: 1.0, max: 4.0 }));
        assert_eq!(Summary::of(&[7.0]), Some(Summary::single(7.0)));
    }

    #[test]
    fn nothing_or_nan_has_no_summary() {
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(Summary::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn a_decreasing_map_swaps_the_extremes() {
        let rps = Summary { median: 500.0, min: 250.0, max: 1000.0 };
        let ms = rps.map_decreasing(|r| 1000.0 / r);
        assert_eq!(ms, Summary { median: 2.0, min: 1.0, max: 4.0 });
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[5u32], 99.0), Some(5));
        assert_eq!(percentile::<u32>(&[], 50.0), None);
    }
}
