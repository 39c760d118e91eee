//! The benchmark's statistics: percentiles, medians, ratios and the noise band two result
//! files are compared against. Pure functions, tested below.

/// The `q` quantile (0 ..= 1) of `values`, interpolated linearly between the closest ranks,
/// as PostgreSQL's `percentile_cont` does; `None` for no values.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// The median (the 0.5 quantile).
pub fn median(values: &[f64]) -> Option<f64> {
    percentile(values, 0.5)
}

/// The index of the median run (for an even count the lower middle), so that the other
/// figures of that run can be reported beside its rate.
pub fn median_index(values: &[f64]) -> Option<usize> {
    if values.is_empty() {
        return None;
    }
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    Some(idx[(values.len() - 1) / 2])
}

/// `a / b`, or `None` when `b` is zero or either is not finite.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b != 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

/// Where a new figure lies against an old one, given which direction is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Band {
    /// Within `1 ± band` of the old figure.
    Within,
    Better,
    Worse,
    /// A change beyond the band for a figure with no better direction.
    Changed,
}

/// Classifies `new / old` against the band (e.g. 0.10 for ±10 %). `higher_is_better`:
/// `Some(true)` for rates, `Some(false)` for times and sizes, `None` for neither.
pub fn band(old: f64, new: f64, band: f64, higher_is_better: Option<bool>) -> Option<Band> {
    let r = ratio(new, old)?;
    if (r - 1.0).abs() <= band {
        return Some(Band::Within);
    }
    Some(match higher_is_better {
        None => Band::Changed,
        Some(h) if h == (r > 1.0) => Band::Better,
        Some(_) => Band::Worse,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_percentile_cont() {
        let v = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 1.0), Some(4.0));
        assert_eq!(percentile(&v, 0.5), Some(2.5));
        assert!((percentile(&v, 0.99).unwrap() - 3.97).abs() < 1e-9);
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(median(&[7.0]), Some(7.0));
    }

    #[test]
    fn the_median_run_is_the_lower_middle() {
        assert_eq!(median_index(&[30.0, 10.0, 20.0]), Some(2));
        assert_eq!(median_index(&[30.0, 10.0, 20.0, 40.0]), Some(2));
        assert_eq!(median_index(&[]), None);
    }

    #[test]
    fn ratios_refuse_a_zero_denominator() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(3.0, 0.0), None);
    }

    #[test]
    fn the_band_judges_by_direction() {
        assert_eq!(band(100.0, 109.0, 0.10, Some(true)), Some(Band::Within));
        assert_eq!(band(100.0, 120.0, 0.10, Some(true)), Some(Band::Better));
        assert_eq!(band(100.0, 120.0, 0.10, Some(false)), Some(Band::Worse));
        assert_eq!(band(100.0, 80.0, 0.10, Some(false)), Some(Band::Better));
        assert_eq!(band(100.0, 80.0, 0.10, None), Some(Band::Changed));
        assert_eq!(band(0.0, 80.0, 0.10, None), None);
    }
}
