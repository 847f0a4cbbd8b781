//! Value parsers for flags that must be positive. A zero or negative count or duration used to
//! panic (a `Duration` from a negative float, a remainder by zero), print NaN, or run nothing
//! and exit 0; now the argument parser refuses it, naming the flag (exit 2).

use std::str::FromStr;

/// A whole number of at least 1.
pub fn at_least_one<T>(s: &str) -> Result<T, String>
where
    T: FromStr + PartialOrd + From<u8>,
{
    match s.trim().parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        _ => Err(format!("{s:?} is not a whole number of at least 1")),
    }
}

/// Largest seconds or rate taken: far beyond any run, and small enough to be a `Duration`.
const MAX: f64 = 1e9;

/// A number above 0 (seconds, or ops per second), at most 10^9.
pub fn positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x <= MAX => Ok(x),
        _ => Err(format!("{s:?} is not a number above 0 (and at most 1e9)")),
    }
}

/// A number of 0 or more (a warm-up that may be skipped), at most 10^9.
pub fn non_negative(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if (0.0..=MAX).contains(&x) => Ok(x),
        _ => Err(format!(
            "{s:?} is not a number of 0 or more (and at most 1e9)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_negative_and_non_finite_values_are_refused() {
        assert_eq!(at_least_one::<usize>("3"), Ok(3));
        for bad in ["0", "-1", "x", ""] {
            assert!(at_least_one::<usize>(bad).is_err(), "{bad}");
        }
        assert_eq!(positive("0.5"), Ok(0.5));
        for bad in ["0", "-1", "nan", "inf", "1e300", "x"] {
            assert!(positive(bad).is_err(), "{bad}");
        }
        assert_eq!(non_negative("0"), Ok(0.0));
        for bad in ["-0.1", "nan", "inf"] {
            assert!(non_negative(bad).is_err(), "{bad}");
        }
    }
}
