//! Value parsers shared by several commands' flags: numbers, `--times`, byte counts and
//! dtypes. Each error names what was wrong with the text; clap adds the flag.

use pipewise_common::Times;
use pipewise_common::model::DType;

/// Parses a number (any float, including inf and NaN); `what` names it in errors.
pub(crate) fn float(text: &str, what: &str) -> std::result::Result<f64, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{what}: {:?} is not a number", text.trim()))
}

/// Parses a finite number greater than 0; `what` names it in errors.
pub(crate) fn positive(text: &str, what: &str) -> std::result::Result<f64, String> {
    let text = text.trim();
    let value = float(text, what)?;
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!(
            "{what}: {text} must be a finite number greater than 0"
        ));
    }
    Ok(value)
}

/// Parses a finite, non-negative number; `what` names it in errors.
pub(crate) fn number(text: &str, what: &str) -> std::result::Result<f64, String> {
    let text = text.trim();
    let value = float(text, what)?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("{what}: {text} must be finite and ≥ 0"));
    }
    Ok(value)
}

/// Parses `--times F,B,W[,COMM]`.
pub(crate) fn parse_times(text: &str) -> std::result::Result<Times, String> {
    let parts: Vec<&str> = text.split(',').collect();
    if !(3..=4).contains(&parts.len()) {
        return Err(format!(
            "expected 3 or 4 comma-separated numbers F,B,W[,COMM], got {}",
            parts.len()
        ));
    }
    let times = Times {
        f: number(parts[0], "F")?,
        b: number(parts[1], "B")?,
        w: number(parts[2], "W")?,
        comm: match parts.get(3) {
            Some(c) => number(c, "COMM")?,
            None => 0.0,
        },
    };
    times.check().map_err(|e| e.to_string())?;
    Ok(times)
}

/// The largest byte count accepted (1 EiB): larger ones overflow the reports' sums.
const MAX_BYTES: f64 = 1_152_921_504_606_846_976.0;

/// Parses `--activation-bytes`: a positive number with an optional unit.
pub(crate) fn parse_bytes(text: &str) -> std::result::Result<f64, String> {
    let text = text.trim();
    // An `e` or `E` followed by a digit or a sign is an exponent (3.5e8); otherwise it
    // starts the unit (1EiB, Kubernetes' 1E).
    let bytes = text.as_bytes();
    let split = (0..bytes.len())
        .find(|&i| {
            let c = bytes[i];
            let exponent = matches!(c, b'e' | b'E')
                && i > 0
                && bytes
                    .get(i + 1)
                    .is_some_and(|n| n.is_ascii_digit() || matches!(n, b'+' | b'-'));
            c.is_ascii_alphabetic() && !exponent
        })
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.trim().is_empty() {
        return Err(format!(
            "{text:?} is not a number of bytes (e.g. 3.5e8, 512MiB)"
        ));
    }
    // Kubernetes' quantity suffixes (k, M, G, T and Ki, Mi, Gi, Ti) mean the same, so a
    // chart value such as 80Gi reads as it does in a pod's resources. A lone lower-case `m`
    // is Kubernetes' milli (512m is half a byte there), not mega: refused, not guessed.
    if unit.trim() == "m" {
        let digits = digits.trim();
        return Err(format!(
            "{text:?}: a lone \"m\" is Kubernetes' milli, not mega; write {digits}M, \
             {digits}MB or {digits}Mi"
        ));
    }
    // A lone lower-case `e` is an exponent cut short (1e), not Kubernetes' exa (1E).
    if unit.trim() == "e" {
        let digits = digits.trim();
        return Err(format!(
            "{text:?}: an exponent without digits; for exabytes write {digits}E, {digits}EB \
             or {digits}Ei"
        ));
    }
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" | "ki" => 1024.0,
        "mib" | "mi" => 1024.0 * 1024.0,
        "gib" | "gi" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "ti" => 1024f64.powi(4),
        "pb" | "p" => 1e15,
        "eb" | "e" => 1e18,
        "pib" | "pi" => 1024f64.powi(5),
        "eib" | "ei" => 1024f64.powi(6),
        other => {
            return Err(format!(
                "unknown unit {other:?}; use B, KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, \
                 PiB or EiB (or Kubernetes' K, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei)"
            ));
        }
    };
    let value = positive(digits, "bytes")? * scale;
    if !(value.is_finite() && value <= MAX_BYTES) {
        return Err(format!("{text} is too large: at most 2^60 bytes (1 EiB)"));
    }
    Ok(value)
}

/// A byte count of at least one byte (`--memory-bytes`).
pub(crate) fn parse_memory_bytes(text: &str) -> std::result::Result<u64, String> {
    // parse_bytes keeps it positive and at most 2^60; a fraction of a byte is left.
    let bytes = parse_bytes(text)?;
    if bytes >= 1.0 {
        Ok(bytes as u64)
    } else {
        Err(format!("{text:?} is less than one byte"))
    }
}

/// Parses `--dtype`.
pub(crate) fn parse_dtype(text: &str) -> std::result::Result<DType, String> {
    text.parse::<DType>().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_times() {
        assert_eq!(
            parse_times("1,2,1"),
            Ok(Times {
                f: 1.0,
                b: 2.0,
                w: 1.0,
                comm: 0.0
            })
        );
        assert_eq!(parse_times(" 1, 2 ,1,0.5").map(|t| t.comm), Ok(0.5));
        assert!(parse_times("1,2").is_err());
        assert!(parse_times("1,x,1").is_err_and(|e| e.contains("B")));
        assert!(parse_times("1,-1,1").is_err());
        assert!(parse_times("0,0,0").is_err());
        assert!(parse_times("1,1,inf").is_err());
    }

    #[test]
    fn parses_bytes() {
        assert_eq!(parse_bytes("1024"), Ok(1024.0));
        assert_eq!(parse_bytes("2KiB"), Ok(2048.0));
        assert_eq!(parse_bytes("1.5e3"), Ok(1500.0));
        assert_eq!(parse_bytes("3 GB"), Ok(3e9));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
        // Huge finite values were accepted and printed as "inf PiB"; NaN blamed its unit.
        assert!(parse_bytes("1e308").is_err_and(|e| e.contains("too large")));
        assert!(parse_bytes("2EiB").is_err());
        assert_eq!(parse_bytes("1024TiB"), Ok(1024.0f64.powi(5)));
        // E is an exponent before a digit or a sign, a unit otherwise.
        assert_eq!(parse_bytes("1EiB"), Ok(1024.0f64.powi(6)));
        assert_eq!(parse_bytes("1E"), Ok(1e18));
        assert!(parse_bytes("1e").is_err_and(|e| e.contains("exponent without digits")));
        assert_eq!(parse_bytes("1e+3"), Ok(1e3));
        assert_eq!(parse_bytes("1.5e3KiB"), Ok(1.5e3 * 1024.0));
        assert_eq!(parse_bytes("2PB"), Ok(2e15));
        assert_eq!(parse_bytes("3Pi"), Ok(3.0 * 1024.0f64.powi(5)));
        for text in ["nan", "inf"] {
            assert!(parse_bytes(text).is_err_and(|e| e.contains("not a number of bytes")));
        }
        assert!(parse_bytes("1e308 TiB").is_err_and(|e| e.contains("too large")));
        // Kubernetes quantities, as a chart's values give them.
        assert_eq!(parse_bytes("80Gi"), Ok(80.0 * 1024.0f64.powi(3)));
        assert_eq!(parse_bytes("512Mi"), Ok(512.0 * 1024.0 * 1024.0));
        assert_eq!(parse_bytes("8G"), Ok(8e9));
        assert!(parse_bytes("8Gx").is_err_and(|e| e.contains("Gi")));
        // Kubernetes' m is milli: refused with the spellings that mean mega.
        assert!(parse_bytes("512m").is_err_and(|e| e.contains("milli") && e.contains("512Mi")));
        assert!(parse_bytes("512 m").is_err_and(|e| e.contains("write 512M,")));
        assert_eq!(parse_bytes("512M"), Ok(512e6));
        assert_eq!(parse_bytes("512mb"), Ok(512e6));
    }
}
